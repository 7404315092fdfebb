"""--tokenizer-type TikTokenizer --tokenizer-model VOCAB.json: Megatron-LM's TikTokenizer
(megatron/core/tokenizers/text/libraries/tiktoken_tokenizer.py at d98e8a6), run by the `tiktoken`
library (an optional extra: pip install rapidgpt[tiktoken]; imported only when this tokenizer is
built, so the flags are checked without it).

VOCAB.json is a JSON list of {"rank", "token_bytes" (base64), "token_str"}, ranks 0, 1, 2, ... in
order, starting with the 256 single bytes. With N = --tiktoken-num-special-tokens (1000) and
V = --vocab-size (2**17), the ids are Megatron's:

- 0 .. N-1: the special tokens, --tokenizer-special-tokens (by default <unk> <s> </s> <mask>
  <pad> <cls> <sep>, which every list must hold) then fillers <SPECIAL_i> up to N;
- N .. V-1: the vocabulary's first V - N tokens, rank r being id N + r.

Text is cut by the --tiktoken-pattern regex (v1, or v2 when not given) and each piece merged by
rank; special tokens written in the text ("</s>") are those tokens (Megatron encodes with
allowed_special="all"). `eod` is </s>, `bos` <s>, `pad` <pad>; `detokenize` joins the tokens' bytes
(special tokens as their text) and decodes them as UTF-8, a broken sequence becoming U+FFFD.
Checkpoints carry the vocabulary file and record the other flags
(rapidgpt/training/checkpoint_files.py), so `--load` needs no tokenizer flag.
"""
import base64
import importlib.util
import json
import os
from collections import Counter

from rapidgpt.errors import UserError

MISSING_LIBRARY = "needs the `tiktoken` library; pip install tiktoken (or rapidgpt[tiktoken])"
REQUIRED_SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<mask>", "<pad>", "<cls>", "<sep>")
DEFAULT_NUM_SPECIAL_TOKENS = 1000
DEFAULT_VOCAB_SIZE = 2 ** 17
DEFAULT_PATTERN = "v2"
# The pre-tokenization regexes (tiktoken's regex dialect: \p{..} classes, possessive ?+ and ++).
PATTERNS = {
    "v1": r"[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
    "v2": (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
           r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
           r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
}


class TikTokenError(UserError, ValueError):
    """A vocabulary or TikTokenizer flag that cannot be used, or no tiktoken library; the message
    names the flag and what to do."""


def add_tiktoken_args(group):
    """Megatron's TikTokenizer flags (its spelling, types and defaults), for training and
    preprocessing alike."""
    group.add_argument("--tiktoken-pattern", default=None, choices=tuple(PATTERNS),
                       help=f"TikTokenizer: the regex that cuts text before merging (default {DEFAULT_PATTERN})")
    group.add_argument("--tiktoken-num-special-tokens", type=int, default=DEFAULT_NUM_SPECIAL_TOKENS,
                       help="TikTokenizer: ids 0..N-1 are special tokens (--tokenizer-special-tokens, then "
                            "<SPECIAL_i> fillers); the vocabulary's tokens follow")
    group.add_argument("--tokenizer-special-tokens", dest="special_tokens", nargs="+", default=None,
                       metavar="TOKEN",
                       help=f"TikTokenizer: the special tokens, ids 0, 1, ...; must hold "
                            f"{' '.join(REQUIRED_SPECIAL_TOKENS)} (the default)")


def vocabulary_problem(path):
    """Why `path` cannot serve as TikTokenizer's --tokenizer-model (None when it can): checked with
    the flags (the library is looked for, not imported)."""
    if not os.path.isfile(path):
        return f"{path}: no such file; give the tiktoken vocabulary .json"
    if importlib.util.find_spec("tiktoken") is None:
        return f"--tokenizer-type TikTokenizer {MISSING_LIBRARY}"
    return None


def _special_tokens(special_tokens, num_special_tokens):
    """The tokens of ids 0 .. num_special_tokens-1: the given ones, then the <SPECIAL_i> fillers."""
    given = list(REQUIRED_SPECIAL_TOKENS if special_tokens is None else special_tokens)
    return given + [f"<SPECIAL_{i}>" for i in range(len(given), num_special_tokens)]


def settings_problems(pattern, num_special_tokens, special_tokens, vocab_size):
    """The problems of TikTokenizer's settings, one line each naming its flag (none: usable)."""
    problems = []
    if pattern not in (None, *PATTERNS):
        problems.append(f"--tiktoken-pattern: {pattern!r} is not one of the choices; choose one of "
                        f"{', '.join(PATTERNS)}")
    given = REQUIRED_SPECIAL_TOKENS if special_tokens is None else special_tokens
    missing = [token for token in REQUIRED_SPECIAL_TOKENS if token not in given]
    if missing:
        problems.append(f"--tokenizer-special-tokens: {' '.join(missing)} missing; the list must hold "
                        f"{' '.join(REQUIRED_SPECIAL_TOKENS)} (TikTokenizer's unk, bos, eod, mask, pad, cls, sep)")
    if num_special_tokens < len(given):
        problems.append(f"--tiktoken-num-special-tokens: {num_special_tokens} is fewer than the {len(given)} "
                        f"--tokenizer-special-tokens; give at least {len(given)}")
    else:
        repeated = [token for token, n in Counter(_special_tokens(given, num_special_tokens)).items() if n > 1]
        if repeated:
            problems.append(f"--tokenizer-special-tokens: {repeated[0]} appears twice (counting the <SPECIAL_i> "
                            f"fillers up to --tiktoken-num-special-tokens); each special token needs its own id")
    vocab_size = vocab_size or DEFAULT_VOCAB_SIZE
    if vocab_size - num_special_tokens < 256:
        problems.append(f"--tiktoken-num-special-tokens: {num_special_tokens} special tokens leave "
                        f"{max(vocab_size - num_special_tokens, 0)} ids below --vocab-size {vocab_size}, fewer "
                        f"than the vocabulary's 256 single bytes; give --vocab-size {num_special_tokens + 256} "
                        f"or more")
    return problems


def flag_problems(args):
    """The TikTokenizer flags' problems beyond --tokenizer-model's, one line each: its settings, and
    --tokenizer-special-tokens given to another tokenizer (whose Megatron meaning, extra special
    tokens, is not built)."""
    if args.tokenizer_type == "TikTokenizer":
        return settings_problems(args.tiktoken_pattern, args.tiktoken_num_special_tokens, args.special_tokens,
                                 args.vocab_size)
    if args.special_tokens is not None:
        return ["--tokenizer-special-tokens: only --tokenizer-type TikTokenizer reads it here; remove it"]
    return []


def _library():
    try:
        import tiktoken
    except ImportError:
        raise TikTokenError(f"--tokenizer-type TikTokenizer {MISSING_LIBRARY}") from None
    return tiktoken


def _read_vocabulary(path, size):
    """The first `size` tokens (bytes, by rank) of the tiktoken vocabulary .json `path`."""
    def unusable(why):
        return TikTokenError(f"--tokenizer-model {path}: {why}; give a tiktoken vocabulary .json (a list of "
                             f'{{"rank", "token_bytes", "token_str"}}, ranks 0, 1, 2, ... in order)')
    try:
        with open(path, encoding="utf-8") as f:
            entries = json.load(f)
    except (OSError, ValueError) as e:
        raise unusable(f"cannot be read as JSON ({e})") from None
    if not isinstance(entries, list) or not all(isinstance(e, dict) and {"rank", "token_bytes"} <= e.keys()
                                                for e in entries):
        raise unusable('not a list of {"rank", "token_bytes", ...} objects')
    entries = entries[:size]
    tokens = []
    for i, entry in enumerate(entries):
        try:
            token = base64.b64decode(entry["token_bytes"], validate=True)
        except (TypeError, ValueError):
            raise unusable(f"entry {i}'s token_bytes is not base64") from None
        if entry["rank"] != i:
            raise unusable(f"entry {i} has rank {entry['rank']!r}")
        if i < 256 and token != bytes([i]):
            raise unusable(f"rank {i} is {token!r}, not the byte {bytes([i])!r} (the 256 single bytes come first)")
        tokens.append(token)
    repeated = next((token for token, n in Counter(tokens).items() if n > 1), None)
    if repeated is not None:
        raise unusable(f"the token {repeated!r} appears twice")
    return tokens


class TikTokenizer:
    """Megatron's TikTokenizer: the same ids for the same text (tests/test_tokenizer.py holds it to a
    port of Megatron's)."""

    def __init__(self, vocabulary, pattern=None, num_special_tokens=DEFAULT_NUM_SPECIAL_TOKENS,
                 special_tokens=None, vocab_size=None):
        problems = settings_problems(pattern, num_special_tokens, special_tokens, vocab_size)
        if problems:
            raise TikTokenError(problems[0])
        tiktoken = _library()
        self.vocab_size = vocab_size or DEFAULT_VOCAB_SIZE
        special_ids = {token: i for i, token in enumerate(_special_tokens(special_tokens, num_special_tokens))}
        self.unk, self.bos, self.eod, self.mask, self.pad, self.cls, self.sep = (
            special_ids[token] for token in REQUIRED_SPECIAL_TOKENS)
        tokens = _read_vocabulary(vocabulary, self.vocab_size - num_special_tokens)
        if len(tokens) < self.vocab_size - num_special_tokens:
            raise TikTokenError(f"--vocab-size: {vocabulary} holds {len(tokens)} tokens, fewer than --vocab-size "
                                f"{self.vocab_size} minus the {num_special_tokens} --tiktoken-num-special-tokens; "
                                f"give --vocab-size {len(tokens) + num_special_tokens} or less")
        self._encoding = tiktoken.Encoding(
            name=os.path.basename(vocabulary), pat_str=PATTERNS[pattern or DEFAULT_PATTERN],
            mergeable_ranks={token: num_special_tokens + rank for rank, token in enumerate(tokens)},
            special_tokens=special_ids)

    @classmethod
    def from_args(cls, vocabulary, args):
        """The tokenizer --tokenizer-model `vocabulary` and the flags in `args` (or a checkpoint's
        recorded flags; those not there take Megatron's defaults) describe."""
        return cls(vocabulary, pattern=getattr(args, "tiktoken_pattern", None),
                   num_special_tokens=getattr(args, "tiktoken_num_special_tokens", DEFAULT_NUM_SPECIAL_TOKENS),
                   special_tokens=getattr(args, "special_tokens", None),
                   vocab_size=getattr(args, "vocab_size", None))

    def tokenize(self, text):
        return self._encoding.encode(text, allowed_special="all")

    def detokenize(self, ids):
        return self._encoding.decode([int(i) for i in ids])
