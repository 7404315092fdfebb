"""Fill-in-the-middle (FIM) samples: Megatron's `--fim-data` (megatron/training/datasets/fim_dataset.py
at d98e8a6), for code models that learn to fill a gap between a prefix and a suffix.

A GPT sample (`seq_length + 1` tokens) is cut at its end-of-document tokens (`--fim-eod-token`) into
segments. With probability `--fim-rate`, a segment is turned back into text (special tokens left
out), cut at two character positions drawn uniformly into prefix, middle and suffix, each re-tokenized,
and written in one of the FIM paper's two orders:

    PSM (prefix-suffix-middle):  <fim_prefix> prefix <fim_suffix> suffix <fim_middle> middle
    SPM (suffix-prefix-middle):  <fim_prefix> <fim_suffix> suffix <fim_middle> prefix middle

SPM with probability `--fim-spm-rate`. The sample is then cut (or padded with `--fim-pad-token`)
back to its length. `--fim-split-sample TOKEN` first cuts a segment at that token (say, a file
separator inside a repository): with probability `--fim-rate` each fragment then gets FIM with
probability `--fim-fragment-rate`; `--fim-no-prefix TEXT` leaves a segment whose text starts with
TEXT as it is.

The draws, their order and their probabilities are Megatron's. Where they come from differs, an
implementation choice: Megatron draws from one generator per dataset object, in the order a process
happens to read samples, so its FIM samples change with the data-parallel size, the data loader's
workers and a resume. Here the draws for sample i of a split come from a generator seeded with
(--seed, split, i), so every layout and every resume sees the same samples (the training contract:
a parallel run is the single-process run).

The sentinel tokens are looked up in the vocabulary. A token the vocabulary lacks is the tokenizer's
unknown token, as Megatron's Hugging Face tokenizers map it (GPT-2's unknown token is
<|endoftext|>), with a warning at start-up: such a vocabulary trains the order of the pieces but
cannot mark them apart. A tokenizer with neither is refused.
"""
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from rapidgpt.errors import UserError

SENTINELS = ("prefix", "middle", "suffix", "pad", "eod")
SPLIT_SEEDS = {"train": 0, "valid": 1, "test": 2}


# Megatron's defaults of the flags that tune FIM (refused when given without --fim-data).
FLAG_DEFAULTS = {"--fim-rate": 0.5, "--fim-spm-rate": 0.5, "--fim-split-sample": None, "--fim-fragment-rate": None,
                 "--fim-no-prefix": None, "--fim-prefix-token": "<fim_prefix>", "--fim-middle-token": "<fim_middle>",
                 "--fim-suffix-token": "<fim_suffix>", "--fim-pad-token": "<fim_pad>",
                 "--fim-eod-token": "<|endoftext|>"}


def add_fim_args(parser):
    g = parser.add_argument_group("fill-in-the-middle data", "Megatron's --fim-* flags (rapidgpt/data/fim.py)")
    g.add_argument("--fim-data", action="store_true",
                   help="turn GPT samples into fill-in-the-middle samples (PSM/SPM), as Megatron's GPTFIMDataset")
    g.add_argument("--fim-rate", type=float, default=FLAG_DEFAULTS["--fim-rate"],
                   help="probability a segment gets FIM")
    g.add_argument("--fim-spm-rate", type=float, default=FLAG_DEFAULTS["--fim-spm-rate"],
                   help="probability a FIM segment is written suffix-prefix-middle (else prefix-suffix-middle)")
    g.add_argument("--fim-split-sample", default=None, metavar="TOKEN",
                   help="cut each segment at this token and give each fragment FIM apart")
    g.add_argument("--fim-fragment-rate", type=float, default=None,
                   help="with --fim-split-sample: probability each fragment gets FIM")
    g.add_argument("--fim-no-prefix", default=None, metavar="TEXT", help="no FIM for a segment whose text starts so")
    for name in SENTINELS:
        default = FLAG_DEFAULTS[f"--fim-{name}-token"]
        g.add_argument(f"--fim-{name}-token", default=default, help=f"the FIM {name} token (default {default})")


def _value(args, flag):
    return getattr(args, flag.lstrip("-").replace("-", "_"))


def check_fim_args(args, check):
    """The FIM flags' checks (no vocabulary is read here: the token lookups happen when the
    datasets are built, fim_config)."""
    if not args.fim_data:
        for flag, default in FLAG_DEFAULTS.items():
            check.require(_value(args, flag) == default,
                          f"{flag}: takes effect with --fim-data only (Megatron ignores it without); add "
                          f"--fim-data or remove {flag}")
        return
    for flag in ("--fim-rate", "--fim-spm-rate", "--fim-fragment-rate"):
        rate = _value(args, flag)
        check.require(rate is None or 0.0 <= rate <= 1.0,
                      f"{flag}: {rate} is not a probability; give a value in [0, 1]")
    check.require((args.fim_split_sample is None) == (args.fim_fragment_rate is None),
                  "--fim-split-sample: give it together with --fim-fragment-rate (the rate of FIM on each fragment)")
    check.require(not args.mock_data, "--fim-data: Megatron's --mock-data documents take the place of the FIM data "
                                      "(it then ignores --fim-data); give --data-path, or remove --fim-data")
    check.require(getattr(args, "model_type", "gpt") != "bert",
                  "--fim-data: FIM makes GPT samples; remove it for BERT")


@dataclass(frozen=True)
class FIMConfig:
    """How samples are permuted: the rates, the sentinel ids, and the tokenizer's text round trip
    (`detokenize(ids) -> str`, `tokenize(str) -> ids` with no special token added)."""
    rate: float
    spm_rate: float
    prefix: int
    middle: int
    suffix: int
    pad: int
    eod: int
    detokenize: Callable
    tokenize: Callable
    special: frozenset = frozenset()          # more ids left out of the text (the tokenizer's BOS)
    split_token: Optional[int] = None
    fragment_rate: Optional[float] = None
    no_prefix: Optional[str] = None

    def permute(self, sample, seed, split, index):
        """Sample `index` of `split` (`[seq_length + 1]` token ids) as a FIM sample of the same
        length (int32)."""
        rng = np.random.RandomState([seed, SPLIT_SEEDS[split], index])
        segments, start = [], 0
        for end in np.flatnonzero(sample == self.eod).tolist():
            if end > start:                         # empty segments are left as they are
                segments += [self._split_and_permute(sample[start:end], rng), [self.eod]]
            start = end + 1
        segments.append(self._split_and_permute(sample[start:], rng))
        out = np.concatenate(segments)[:len(sample)]
        return np.concatenate([out, np.full(len(sample) - len(out), self.pad)]).astype(np.int32)

    def _split_and_permute(self, segment, rng):
        if self.split_token is None:
            return self._permute(segment, self.rate, rng)
        breaks = np.flatnonzero(segment == self.split_token).tolist()
        if not breaks:
            return self._permute(segment, self.rate, rng)
        if not rng.binomial(1, self.rate):
            return segment
        pieces, start = [], 0
        for end in breaks:
            if end > start:
                pieces += [self._permute(segment[start:end], self.fragment_rate, rng), [self.split_token]]
            start = end + 1
        pieces.append(self._permute(segment[start:], self.fragment_rate, rng))
        return np.concatenate(pieces)

    def _permute(self, segment, rate, rng):
        if not rng.binomial(1, rate):
            return segment
        special = self.special | {self.prefix, self.middle, self.suffix, self.pad, self.eod}
        text = self.detokenize([t for t in segment.tolist() if t not in special])
        if self.no_prefix is not None and text.startswith(self.no_prefix):
            return segment
        low, high = sorted(rng.randint(low=0, high=len(text) + 1, size=2).tolist())
        prefix, middle, suffix = (np.array(self.tokenize(part), dtype=np.int64)
                                  for part in (text[:low], text[low:high], text[high:]))
        if rng.binomial(1, self.spm_rate):
            return np.concatenate([[self.prefix, self.suffix], suffix, [self.middle], prefix, middle])
        return np.concatenate([[self.prefix], prefix, [self.suffix], suffix, [self.middle], middle])


def _sentinel_ids(args, tokenizer, warn):
    """{name: id} of the FIM tokens; one warning names those the vocabulary lacks."""
    ids, missing = {}, []
    for name in SENTINELS:
        flag, token = f"--fim-{name}-token", getattr(args, f"fim_{name}_token")
        ids[name] = tokenizer.token_to_id(token)
        if ids[name] is None:
            missing.append(f"{flag} {token!r}")
    if not missing:
        return ids
    unknown = getattr(tokenizer, "unk", None)
    if unknown is None:
        raise UserError(f"{missing[0]}: the vocabulary has no such token and no unknown token to stand for it; give "
                        f"{missing[0].split()[0]} a token of the vocabulary (or a vocabulary with FIM tokens)")
    warn(f"WARNING: {', '.join(missing)}: not in the vocabulary, so each is its unknown token (id {unknown}), as "
         f"Megatron's tokenizer maps them; a vocabulary with the FIM tokens keeps prefix, middle and suffix apart")
    return {name: unknown if found is None else found for name, found in ids.items()}


def fim_config(args, tokenizer, warn):
    """The FIMConfig of --fim-data (None without it) for `tokenizer`; `warn(line)` gets the line that
    names the FIM tokens the vocabulary lacks, if any."""
    if not getattr(args, "fim_data", False):
        return None
    if tokenizer is None or not hasattr(tokenizer, "text_to_ids"):
        kind = getattr(args, "tokenizer_type", None)
        raise UserError(f"--fim-data: FIM re-tokenizes text, which needs a vocabulary with named tokens "
                        f"(GPT2BPETokenizer or HuggingFaceTokenizer); --tokenizer-type {kind} has none")
    ids = _sentinel_ids(args, tokenizer, warn)
    split_token = None
    if args.fim_split_sample is not None:
        split_token = tokenizer.token_to_id(args.fim_split_sample)
        if split_token is None:
            raise UserError(f"--fim-split-sample {args.fim_split_sample!r}: not one token of the vocabulary; give "
                            f"the token the fragments are separated by")
    bos = getattr(tokenizer, "bos", None)
    return FIMConfig(rate=args.fim_rate, spm_rate=args.fim_spm_rate, detokenize=tokenizer.detokenize,
                     tokenize=tokenizer.text_to_ids, special=frozenset(() if bos is None else (bos,)),
                     split_token=split_token, fragment_rate=args.fim_fragment_rate, no_prefix=args.fim_no_prefix, **ids)
