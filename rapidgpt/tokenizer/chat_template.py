"""Chat templates: a conversation -> the token ids a model was trained on, and which are answers.

The template is the tokenizer folder's own `chat_template` (tokenizer_config.json, or
chat_template.jinja beside it), `--chat-template` (Jinja text or a file holding it), or a named
format (`--sft-tokenizer-prompt-format`, Megatron's flag; BUILTIN_FORMATS). It is rendered with
jinja2 as transformers' `apply_chat_template` renders it: a sandboxed environment with
`trim_blocks` and `lstrip_blocks`, the loop-controls extension, `raise_exception`, `strftime_now`
and a `tojson` that does not escape HTML, the folder's special tokens (`bos_token`,
`eos_token`, ...) as variables; the rendered text is tokenized whole with no special token added
(so a template that writes `{{ bos_token }}` gets exactly one BOS). The ids therefore equal
`tokenizer.apply_chat_template(messages, tokenize=True)` (tests/test_sft_data.py holds them to
transformers' on three folders).

Answers. A turn's answer is what the model says after the template's generation prompt: for
assistant turn i of a conversation whose whole rendering is F,

  - it starts where the rendering of the turns before it, P = render(turns[:i]), ends, after
    the generation prompt G = render(turns[:i], add_generation_prompt=True)[len(P):] (e.g.
    "<|im_start|>assistant\\n"). When a template writes a past turn other than its generation
    prompt (Qwen3 opens the last turn with a think block, earlier ones without), the answer
    starts after the part of G that F repeats, cut back to a line end;
  - it ends where render(turns[:i + 1]) ends when that is how F begins, otherwise (Qwen3 again:
    the turn is written differently once it is no longer the last) after the template's
    end-of-turn text, found after the start. The end-of-turn text (e.g. "<|im_end|>\\n",
    "<|eot_id|>") is what the template writes after an assistant message's content.

So the answer holds the content and the end-of-turn token: the model learns to stop. A token is an
answer token when its first character lies in an answer. A template that does not render
conversations this way (its earlier turns change with later ones beyond what is described
above) is refused with the conversation named.
"""
import json
import os
from datetime import datetime

import numpy as np

from rapidgpt.errors import UserError

# Megatron's SFTTokenizer formats (megatron/core/tokenizers/text/libraries/sft_tokenizer.py) and
# the two most common open formats. "default" is the folder's own template.
BUILTIN_FORMATS = {
    "chatml": (
        "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
        "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"),
    "llama3": (
        "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
        "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"),
    "nemotron-h-aligned": (
        "{% for message in messages %}{% if message['role'] == 'system' %}{{ '<SPECIAL_10>System\n' + "
        "message['content'].strip() + '\n' }}{% elif message['role'] == 'user' %}{{ '<SPECIAL_11>User\n' + "
        "message['content'].strip() + '\n' + '<SPECIAL_11>Assistant\n' }}{% elif message['role'] == 'assistant' %}"
        "{{ message['content'].strip() + '\n' }}{% endif %}{% endfor %}"),
    "nemotron-nano-v2": (
        "{% for message in messages %}{% set content = message['content'] %}{% if message['role'] == 'system' %}"
        "{{ '<SPECIAL_10>System\n' + content.replace('/think', '').replace('/no_think', '').strip() + '\n' }}"
        "{% elif message['role'] == 'user' %}{{ '<SPECIAL_11>User\n' + content.replace('/think', '')"
        ".replace('/no_think', '').strip() + '\n' }}{% elif message['role'] == 'assistant' %}"
        "{{ '<SPECIAL_11>Assistant\n' + content.strip() + '\n<SPECIAL_12>\n' }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<SPECIAL_11>Assistant\n' }}{% endif %}"),
    "identity": "{% for message in messages %}{{ message['content'] }}{% endfor %}",
}
FOLDER_FORMAT = "default"
PROMPT_FORMATS = (FOLDER_FORMAT,) + tuple(BUILTIN_FORMATS)
# The special-token variables transformers passes to a template (those the folder sets).
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
TEMPLATE_FILE = "chat_template.jinja"
_SENTINEL = "\x00RAPIDGPT-ANSWER\x00"


class ChatTemplateError(UserError, ValueError):
    """A chat template that cannot be read or used; the message says what to give instead."""


def _token_text(value):
    return value.get("content") if isinstance(value, dict) else value


def folder_template(folder):
    """The chat template a tokenizer folder holds (tokenizer_config.json's `chat_template`, else
    chat_template.jinja), or None. A list of named templates gives its "default" one."""
    config = os.path.join(folder, "tokenizer_config.json")
    template = None
    if os.path.isfile(config):
        with open(config, encoding="utf-8") as f:
            template = json.load(f).get("chat_template")
    if isinstance(template, list):
        template = {t.get("name"): t.get("template") for t in template}.get("default")
    if template is None and os.path.isfile(os.path.join(folder, TEMPLATE_FILE)):
        with open(os.path.join(folder, TEMPLATE_FILE), encoding="utf-8") as f:
            template = f.read()
    return template


def folder_special_tokens(folder):
    """{"bos_token": "<|begin_of_text|>", ...}: the special tokens a folder sets, as template variables."""
    tokens = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):      # the config's win
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                config = json.load(f)
            tokens.update({k: _token_text(config[k]) for k in SPECIAL_TOKEN_KEYS if config.get(k) is not None})
    return {k: v for k, v in tokens.items() if v}


def _environment():
    """The Jinja environment transformers renders chat templates in (module docstring)."""
    try:
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ChatTemplateError("chat templates are rendered with jinja2: pip install jinja2") from None

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda format: datetime.now().strftime(format)
    return env


def _common_prefix_length(a, b):
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class ChatTemplate:
    """A Jinja chat template with the variables it is rendered with; `name` says where it came from."""

    def __init__(self, source, variables, name):
        import jinja2
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"the chat template ({name}) is not valid Jinja: {e}") from None
        self.source, self.variables, self.name = source, dict(variables), name
        self._end_of_turn = None

    @classmethod
    def from_flags(cls, tokenizer_folder, prompt_format=None, chat_template=None):
        """The template a run uses: --chat-template (text or file), else --sft-tokenizer-prompt-format
        NAME, else (or with "default") the tokenizer folder's own. `tokenizer_folder` (None for a
        tokenizer that is not a folder) supplies the special-token variables."""
        variables = folder_special_tokens(tokenizer_folder) if tokenizer_folder else {}
        if chat_template is not None:
            if os.path.isfile(chat_template):
                with open(chat_template, encoding="utf-8") as f:
                    return cls(f.read(), variables, f"--chat-template {chat_template}")
            return cls(chat_template, variables, "--chat-template")
        if prompt_format not in (None, FOLDER_FORMAT):
            if prompt_format not in BUILTIN_FORMATS:
                raise ChatTemplateError(f"--sft-tokenizer-prompt-format {prompt_format}: not one of "
                                        f"{', '.join(PROMPT_FORMATS)}")
            return cls(BUILTIN_FORMATS[prompt_format], variables, f"--sft-tokenizer-prompt-format {prompt_format}")
        source = folder_template(tokenizer_folder) if tokenizer_folder else None
        if source is None:
            where = f"the tokenizer folder {tokenizer_folder}" if tokenizer_folder else "this tokenizer"
            raise ChatTemplateError(f"{where} has no chat_template; name a format with --sft-tokenizer-prompt-format "
                                    f"({', '.join(BUILTIN_FORMATS)}) or give --chat-template FILE")
        return cls(source, variables, f"the chat_template of {tokenizer_folder}")

    @classmethod
    def of_run(cls, args):
        """The run's template from its flags (a --tokenizer-type HuggingFaceTokenizer folder's own by default)."""
        folder = args.tokenizer_model if args.tokenizer_type == "HuggingFaceTokenizer" else None
        return cls.from_flags(folder, args.sft_tokenizer_prompt_format, args.chat_template)

    def render(self, messages, add_generation_prompt=False):
        import jinja2
        try:
            return self._template.render(messages=messages, tools=None, documents=None,
                                         add_generation_prompt=add_generation_prompt, **self.variables)
        except jinja2.TemplateError as e:
            raise ValueError(f"the chat template ({self.name}) refused the conversation: {e}") from None

    @property
    def end_of_turn(self):
        """What the template writes after an assistant message's content ("" if nothing)."""
        if self._end_of_turn is None:
            text = self.render([{"role": "user", "content": "?"}, {"role": "assistant", "content": _SENTINEL}])
            self._end_of_turn = text[text.rindex(_SENTINEL) + len(_SENTINEL):] if _SENTINEL in text else ""
        return self._end_of_turn

    def prompt_ids(self, tokenizer, user_text):
        """The ids a model answering `user_text` is given: the user turn and the generation prompt."""
        return tokenizer.text_to_ids(self.render([{"role": "user", "content": user_text}], add_generation_prompt=True))

    def stop_sequences(self, tokenizer):
        """The id sequences that end an answer: the end-of-turn text (without its trailing whitespace,
        e.g. "<|im_end|>") and the end-of-document token."""
        end = self.end_of_turn.rstrip()
        return [tokenizer.text_to_ids(end)] * bool(end) + [[tokenizer.eod]]

    def answer_spans(self, messages, rendered):
        """[(start, end)] character spans of the assistant answers in `rendered` = render(messages)
        (module docstring); ValueError when the template writes turns in a way they cannot be found."""
        spans = []
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            before = self.render(messages[:i])
            if not rendered.startswith(before):
                raise ValueError(f"the chat template ({self.name}) writes the turns before assistant turn {i + 1} "
                                 f"differently once later turns follow; its answers cannot be located")
            prompt = self.render(messages[:i], add_generation_prompt=True)[len(before):]
            start = len(before) + _common_prefix_length(prompt, rendered[len(before):])
            if start < len(before) + len(prompt):           # the turn opens otherwise: back to a line end
                start = rendered.rfind("\n", len(before), start) + 1 or len(before)
            through = self.render(messages[:i + 1])
            if rendered.startswith(through):
                end = len(through)
            elif self.end_of_turn and rendered.find(self.end_of_turn, start) >= 0:
                end = rendered.find(self.end_of_turn, start) + len(self.end_of_turn)
            else:
                raise ValueError(f"the chat template ({self.name}) writes assistant turn {i + 1} differently "
                                 f"once later turns follow and has no end-of-turn text to find its end by")
            if end > start:
                spans.append((start, end))
        return spans


def encode_conversation(template, tokenizer, messages):
    """(ids [n] int32, answer [n] bool) of one conversation: the ids of its whole rendering (what
    `apply_chat_template(messages, tokenize=True)` gives) and which of them are answer tokens, i.e.
    overlap an answer span (as transformers' `return_assistant_tokens_mask` marks tokens)."""
    text = template.render(messages)
    ids, offsets = tokenizer.ids_and_offsets(text)
    starts, ends = (np.array([o[k] for o in offsets], np.int64).reshape(-1) for k in (0, 1))
    answer = np.zeros(len(ids), bool)
    for start, end in template.answer_spans(messages, text):
        answer |= (starts < end) & (ends > start)
    return np.asarray(ids, np.int32), answer
