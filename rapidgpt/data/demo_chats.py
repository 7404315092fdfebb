"""The embedded demo conversations: a few hundred small chats, so an SFT demo needs no download.

`demo_chats()` writes them once as `chats.jsonl` (the {"messages": [...]} shape) into the user cache
directory (rapidgpt.utils.cache_root) and returns its path; `--sft` / `--task sft` without
--data-path trains on them. They are made from small tables with a fixed seed: capitals, opposites,
additions, greetings, some with a system turn, some of two exchanges -- answers a tiny model can
learn in a few hundred iterations, so the demo's chat shows what finetuning did.
"""
import json
import os
import random

from rapidgpt.utils import cache_root

CAPITALS = {"France": "Paris", "Spain": "Madrid", "Italy": "Rome", "Germany": "Berlin", "Japan": "Tokyo",
            "China": "Beijing", "Egypt": "Cairo", "Canada": "Ottawa", "Peru": "Lima", "Kenya": "Nairobi",
            "Norway": "Oslo", "Greece": "Athens", "Poland": "Warsaw", "Chile": "Santiago", "India": "New Delhi",
            "Brazil": "Brasilia", "Mexico": "Mexico City", "Sweden": "Stockholm", "Portugal": "Lisbon",
            "Austria": "Vienna"}
OPPOSITES = {"hot": "cold", "big": "small", "fast": "slow", "up": "down", "early": "late", "light": "dark",
             "open": "closed", "happy": "sad", "old": "new", "full": "empty", "hard": "soft", "high": "low"}
SYSTEM = "You are a helpful assistant. Answer in one short sentence."
NUM_CONVERSATIONS = 400
VERSION = 1


def _exchange(rng):
    """(question, answer) of one kind, drawn from the tables."""
    kind = rng.randrange(4)
    if kind == 0:
        country = rng.choice(sorted(CAPITALS))
        return f"What is the capital of {country}?", f"The capital of {country} is {CAPITALS[country]}."
    if kind == 1:
        word = rng.choice(sorted(OPPOSITES))
        return f"What is the opposite of {word}?", f"The opposite of {word} is {OPPOSITES[word]}."
    if kind == 2:
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        return f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}."
    return rng.choice(["Hello!", "Hi there.", "Good morning!"]), "Hello! How can I help you today?"


def demo_conversations(n=NUM_CONVERSATIONS, seed=0):
    """The conversations, as lists of {"role", "content"} messages."""
    rng = random.Random(seed)
    conversations = []
    for _ in range(n):
        messages = [{"role": "system", "content": SYSTEM}] if rng.random() < 0.3 else []
        for _ in range(1 if rng.random() < 0.8 else 2):
            question, answer = _exchange(rng)
            messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        conversations.append(messages)
    return conversations


def demo_chats(cache_dir=None):
    """The path of the demo conversations' .jsonl, written if missing."""
    folder = os.path.join(cache_dir or cache_root(), f"demo-chats-v{VERSION}")
    path = os.path.join(folder, "chats.jsonl")
    if not os.path.isfile(path):
        os.makedirs(folder, exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            for messages in demo_conversations():
                f.write(json.dumps({"messages": messages}) + "\n")
        os.replace(tmp, path)             # a reader never sees half a file
    return path
