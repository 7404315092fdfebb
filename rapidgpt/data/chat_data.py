"""Conversations for instruction finetuning, read from .jsonl files line by line.

One JSON object per line, in any of the three common shapes (a file may mix them):

    {"messages": [{"role": "system", "content": ...}, {"role": "user", ...}, {"role": "assistant", ...}]}
        OpenAI / Hugging Face chat messages (the system turn is optional; roles system, user,
        assistant, tool; other keys of a message, e.g. `reasoning_content`, go to the template).
        A system turn after the first opens another conversation, as in Megatron's SFT data, whose
        lines may hold several conversations, each starting with its system turn
    {"conversations": [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}]}
        ShareGPT (`from`: system; human/user; gpt/assistant/model; tool/function/observation)
    {"instruction": ..., "input": ..., "output": ..., "system": ...}
        Alpaca (`input` and `system` optional): user = instruction, plus "\\n\\n" + input when
        there is one (as Megatron's varlen dataset joins them), assistant = output

Every line is checked; a line that is not one of these (not JSON, no assistant answer, a
non-string content, an unknown role) is a `ChatDataError` naming `file:line`. With
`bad_lines="skip"` such lines are left out and counted instead (`ChatFile.skipped`), the first
few named in a warning. Blank lines are ignored.
"""
import json
import os
from typing import NamedTuple

from rapidgpt.errors import UserError

ROLES = ("system", "user", "assistant", "tool")
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant",
                  "assistant": "assistant", "model": "assistant", "tool": "tool", "function": "tool",
                  "observation": "tool"}
BAD_LINE_CHOICES = ("refuse", "skip")


class ChatDataError(UserError, ValueError):
    """A conversation file or line that cannot be used; the message names it and what to do."""


class Conversation(NamedTuple):
    messages: list            # [{"role": ..., "content": ..., ...}], as a chat template takes them
    where: str                # "file:line", for messages


class ChatFile(NamedTuple):
    conversations: list       # [Conversation]
    skipped: list             # ["file:line: why"] of the lines left out with bad_lines="skip"


def _text(value, what):
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {type(value).__name__}")
    return value


def _from_messages(messages, role_key, content_key, roles):
    if not isinstance(messages, list) or not messages:
        raise ValueError("the turns must be a non-empty list")
    out = []
    for n, turn in enumerate(messages, 1):
        if not isinstance(turn, dict):
            raise ValueError(f"turn {n} is not a JSON object")
        role = turn.get(role_key)
        if role not in roles:
            raise ValueError(f"turn {n}: {role_key} {role!r} is not one of {', '.join(sorted(roles))}")
        message = {k: v for k, v in turn.items() if k not in (role_key, content_key)}
        message["role"] = roles[role]
        message["content"] = _text(turn.get(content_key), f"turn {n}'s {content_key!r}")
        out.append(message)
    return out


def _from_alpaca(row):
    user = _text(row["instruction"], "'instruction'")
    extra = _text(row.get("input") or "", "'input'")
    messages = [{"role": "system", "content": _text(row["system"], "'system'")}] if row.get("system") else []
    messages.append({"role": "user", "content": f"{user}\n\n{extra}" if extra else user})
    messages.append({"role": "assistant", "content": _text(row.get("output"), "'output'")})
    return messages


def _split_at_system_turns(messages):
    """Megatron's packed lines: a system turn after the first message starts another conversation."""
    starts = [0] + [i for i, m in enumerate(messages) if i and m["role"] == "system"] + [len(messages)]
    return [messages[a:b] for a, b in zip(starts, starts[1:])]


def parse_conversations(row):
    """The conversations (lists of messages) of one decoded line (a dict); ValueError saying what is wrong."""
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    if "messages" in row:
        conversations = _split_at_system_turns(_from_messages(row["messages"], "role", "content", {r: r for r in ROLES}))
    elif "conversations" in row:
        conversations = [_from_messages(row["conversations"], "from", "value", SHAREGPT_ROLES)]
    elif "instruction" in row:
        conversations = [_from_alpaca(row)]
    else:
        raise ValueError("no 'messages', 'conversations' (ShareGPT) or 'instruction'/'output' (Alpaca) field")
    for n, messages in enumerate(conversations, 1):
        if not any(m["role"] == "assistant" and m["content"] for m in messages):
            which = f"conversation {n} of the line (from its system turn) has" if len(conversations) > 1 else "the line has"
            raise ValueError(f"{which} no assistant turn with content: nothing to learn from")
    return conversations


def read_conversations(path, bad_lines="refuse", flag="--data-path"):
    """The conversations of the .jsonl file `path` (module docstring); `flag` names it in errors."""
    if not os.path.isfile(path):
        raise ChatDataError(f"{flag} {path}: no such file")
    if os.path.splitext(path)[1].lower() not in (".jsonl", ".json"):
        raise ChatDataError(f"{flag} {path}: conversations are read from .jsonl files (one JSON object per line)")
    conversations, skipped = [], []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            where = f"{path}:{number}"
            try:
                line = raw.decode("utf-8")
                if not line.strip():
                    continue
                conversations += [Conversation(messages, where) for messages in parse_conversations(json.loads(line))]
            except ValueError as e:       # (json's and UnicodeDecodeError are ValueErrors)
                problem = f"{where}: {e}"
                if bad_lines != "skip":
                    raise ChatDataError(f"{problem} (fix the line, or pass --sft-bad-lines skip to leave "
                                        f"such lines out)") from None
                skipped.append(problem)
    return ChatFile(conversations, skipped)
