"""BERT pretraining samples, built as Megatron-LM's BertDataset builds them: the samples mapping of
its C++ helper (megatron/core/datasets/helpers.cpp, build_mapping, unchanged through commit
d98e8a64ddf3, Aug 2026: tests/fixtures/megatron_bert_mapping.npz holds its output) and the sample
building of megatron/legacy/data (bert_dataset.py, dataset_utils.py, at 00caa53af309, 2024; the
legacy BERT data that --split-sentences corpora and pretrain_bert.py were made for).

The corpus is sentence-level (`preprocess_data.py --split-sentences`: each document a run of
sentences, one sequence each). Two steps:

1. Samples mapping (`build_samples_mapping`, Megatron's C++ `helpers.build_mapping`, ported to
   numpy with the same generators, so the same corpus and seed give the same mapping): epoch after
   epoch, each document of at least `min_num_sent` sentences (2 with the binary head, else 1) and
   without a sentence longer than 512 tokens is cut into runs of whole sentences; a run closes
   when it reaches its target length (`max_seq_length` = --seq-length - 3, or, for one draw in
   round(1 / --short-seq-prob), a random length in [2, max_seq_length]) and leaves at least two
   sentences for the next run, or at the document's end. Each sample is
   (first sentence, end sentence, target length). Whole epochs are made until there are at least
   the samples asked for; then they are shuffled. The target lengths come from `std::mt19937(seed)`
   (numpy's RandomState is the same generator), the shuffle from `std::mt19937_64(seed + 1)`
   (`MT19937_64` below). Cached like the GPT indices (rapidgpt/data/index_cache.py).

2. A sample (`build_training_sample`, drawn from `numpy.random.RandomState(seed + index)`, so
   sample i is the same whatever order or process reads it): with the binary head the sentences
   are split at a random point into A and B, swapped with probability 1/2 (`is_random` = 1: the
   sentence-order label); the pair is truncated to the target length (one token at a time from
   the longer side, front or back at random); `[CLS] A [SEP] B [SEP]` with token types 0 then 1;
   whole-word masking of --mask-prob of the tokens in n-grams of up to 3 words (80% `[MASK]`, 10%
   a random vocabulary id, 10% kept); padded to --seq-length.

`ds[i]` is a dict of numpy arrays, Megatron's field names: `text` int32 `[s]` (the input ids),
`types` int32 `[s]`, `labels` int32 `[s]` (the original id at masked positions, -1 elsewhere),
`loss_mask` float32 `[s]`, `padding_mask` int32 `[s]` (1 = token), `is_random` int32 `[]`,
`truncated` int32 `[]`.
"""
import math
import os
from dataclasses import dataclass
from typing import Optional

import numpy as np

from rapidgpt.data.index_cache import cached_arrays

INDEX_FORMAT_VERSION = 1
LONG_SENTENCE_LEN = 512            # a document with a longer sentence gives no sample (Megatron's rule)
MAX_NGRAMS = 3


@dataclass
class BertDatasetConfig:
    """Everything that shapes BERT samples: the flags (--seq-length, --seed, --mask-prob,
    --short-seq-prob, --bert-no-binary-head, --data-cache-path) and the tokenizer's vocabulary."""
    seq_length: int
    cls_id: int
    sep_id: int
    mask_id: int
    pad_id: int
    vocab_id_to_token: dict                  # id -> WordPiece ("##" marks a word's later pieces)
    seed: int = 1234
    mask_prob: float = 0.15
    short_seq_prob: float = 0.1
    binary_head: bool = True
    data_cache_path: Optional[str] = None

    def __post_init__(self):
        if self.seq_length < 5:
            raise ValueError(f"--seq-length {self.seq_length}: a BERT sample needs [CLS], [SEP], [SEP] "
                             f"and some text; give at least 5")
        self.vocab_id_list = sorted(self.vocab_id_to_token)

    @classmethod
    def from_tokenizer(cls, tokenizer, **flags):
        return cls(cls_id=tokenizer.cls, sep_id=tokenizer.sep, mask_id=tokenizer.mask, pad_id=tokenizer.pad,
                   vocab_id_to_token=tokenizer.inv_vocab, **flags)


# ---- step 1: the samples mapping --------------------------------------------------------------

class MT19937_64:
    """C++'s `std::mt19937_64(seed)`: `next()` gives its outputs (uint64), in order."""

    N, M = 312, 156
    A = np.uint64(0xB5026F5AA96619E9)
    UPPER, LOWER = np.uint64(0xFFFFFFFF80000000), np.uint64(0x7FFFFFFF)

    def __init__(self, seed):
        state = [seed & (2 ** 64 - 1)]
        for i in range(1, self.N):
            previous = state[-1]
            state.append((6364136223846793005 * (previous ^ (previous >> 62)) + i) & (2 ** 64 - 1))
        self.state = np.array(state, np.uint64)
        self.outputs, self.used = np.zeros(0, np.uint64), 0

    def _twist(self):
        old, n, m = self.state, self.N, self.M
        new = np.empty_like(old)
        x = np.empty_like(old)
        x[:-1] = (old[:-1] & self.UPPER) | (old[1:] & self.LOWER)

        def step(values):
            return (values >> np.uint64(1)) ^ np.where(values & np.uint64(1), self.A, np.uint64(0))

        new[:n - m] = old[m:] ^ step(x[:n - m])                 # reads entries not yet replaced
        new[n - m:n - 1] = new[:m - 1] ^ step(x[n - m:n - 1])   # reads entries replaced above
        x[-1] = (old[-1] & self.UPPER) | (new[0] & self.LOWER)
        new[-1] = new[m - 1] ^ step(x[-1:])[0]
        self.state = new
        y = new.copy()
        y ^= (y >> np.uint64(29)) & np.uint64(0x5555555555555555)
        y ^= (y << np.uint64(17)) & np.uint64(0x71D67FFFEDA60000)
        y ^= (y << np.uint64(37)) & np.uint64(0xFFF7EEE000000000)
        y ^= y >> np.uint64(43)
        self.outputs, self.used = y, 0

    def next(self):
        if self.used == len(self.outputs):
            self._twist()
        self.used += 1
        return int(self.outputs[self.used - 1])


class _MT19937:
    """C++'s `std::mt19937(seed)` outputs: numpy's RandomState(seed) is that generator, and a full
    32-bit range draw returns its outputs unchanged. Drawn in blocks."""

    def __init__(self, seed):
        self.state = np.random.RandomState(seed)
        self.block, self.used = [], 0

    def next(self):
        if self.used == len(self.block):
            self.block, self.used = self.state.randint(0, 2 ** 32, size=4096, dtype=np.uint32).tolist(), 0
        self.used += 1
        return self.block[self.used - 1]


def _target_length(short_seq_ratio, max_seq_length, rng):
    """A sample's target length: usually `max_seq_length`; 1 in `short_seq_ratio` (by the drawn
    number's remainder) a length in [2, max_seq_length]."""
    if short_seq_ratio == 0:
        return max_seq_length
    number = rng.next()
    if number % short_seq_ratio == 0:
        return 2 + number % (max_seq_length - 1)
    return max_seq_length


def build_samples_mapping(docs, sizes, max_num_samples, max_seq_length, short_seq_prob, seed, min_num_sent):
    """`[n, 3]` int64 (first sentence, end sentence, target length) of BERT samples, shuffled (see
    the module docstring). `docs`: sentence boundaries of the documents used (`docs[d]..docs[d+1]`);
    `sizes`: every sentence's length. Megatron: helpers.build_mapping(docs, sizes, num_epochs=max,
    max_num_samples, max_seq_length, short_seq_prob, seed, verbose, min_num_sent)."""
    docs, sizes = np.asarray(docs, np.int64), np.asarray(sizes)
    # C's round (half away from zero): 0.4 gives 3, where Python's round gives 2.
    short_seq_ratio = int(math.floor(1.0 / short_seq_prob + 0.5)) if short_seq_prob > 0 else 0
    eligible = []                      # (first, end) of the documents that give samples
    for first, end in zip(docs[:-1].tolist(), docs[1:].tolist()):
        if end - first >= min_num_sent and not (end - first > 1 and sizes[first:end].max() > LONG_SENTENCE_LEN):
            eligible.append((first, end, sizes[first:end].tolist()))
    if not eligible:
        raise ValueError(f"no document has {min_num_sent} or more sentences of at most {LONG_SENTENCE_LEN} "
                         f"tokens; BERT needs a sentence-level corpus (preprocess_data.py --split-sentences)")
    rng, samples = _MT19937(seed), []
    while len(samples) < max_num_samples:               # whole epochs, as Megatron's helper
        for first, end, lengths in eligible:
            remaining = end - first
            start, seq_len, num_sent = first, 0, 0
            target = _target_length(short_seq_ratio, max_seq_length, rng)
            for sentence, length in enumerate(lengths, start=first):
                seq_len += length
                num_sent += 1
                remaining -= 1
                if (seq_len >= target and remaining > 1 and num_sent >= min_num_sent) or remaining == 0:
                    samples.append((start, sentence + 1, target))
                    start = sentence + 1
                    target = _target_length(short_seq_ratio, max_seq_length, rng)
                    seq_len = num_sent = 0
    mapping = np.array(samples, np.int64)
    shuffle = MT19937_64(seed + 1)
    for i in range(len(mapping) - 1, 0, -1):             # Fisher-Yates, as std::mt19937_64 draws
        j = shuffle.next() % (i + 1)
        mapping[[i, j]] = mapping[[j, i]]
    return mapping


# ---- step 2: one training sample --------------------------------------------------------------

def split_a_b(sentences, rng):
    """(tokens A, tokens B, is_random): a random cut between sentences, then a coin flip swaps them."""
    cut = rng.randint(1, len(sentences)) if len(sentences) >= 3 else 1
    a = [t for s in sentences[:cut] for t in s]
    b = [t for s in sentences[cut:] for t in s]
    if rng.random() < 0.5:
        return b, a, True
    return a, b, False


def truncate_pair(a, b, max_num_tokens, rng):
    """Drop tokens (from the longer side; its front or back at random) until A + B fit; returns
    whether any were dropped. Lists are shortened in place."""
    if len(a) + len(b) <= max_num_tokens:
        return False
    while len(a) + len(b) > max_num_tokens:
        side = a if len(a) > len(b) else b
        if rng.random() < 0.5:
            del side[0]
        else:
            side.pop()
    return True


def mask_tokens(tokens, config, max_predictions, rng):
    """Whole-word n-gram masking: (tokens after masking, masked positions ascending, their labels)."""
    words = []                                     # positions of each word's pieces
    for i, token in enumerate(tokens):
        if token in (config.cls_id, config.sep_id):
            continue
        if words and config.vocab_id_to_token[token].startswith("##"):
            words[-1].append(i)
        else:
            words.append([i])
    output = list(tokens)
    if config.mask_prob == 0:
        return output, [], []
    num_to_predict = min(max_predictions, max(1, int(round(len(tokens) * config.mask_prob))))
    ngrams = np.arange(1, MAX_NGRAMS + 1, dtype=np.int64)
    pvals = 1.0 / np.arange(1, MAX_NGRAMS + 1)
    pvals /= pvals.sum(keepdims=True)               # shorter n-grams likelier: 6/11, 3/11, 2/11
    candidates = [[words[start:start + n] for n in ngrams] for start in range(len(words))]
    rng.shuffle(candidates)
    masked, covered = [], set()
    for spans in candidates:
        if len(masked) >= num_to_predict:
            break
        if not spans:
            continue
        k = len(spans)
        n = rng.choice(ngrams[:k], p=pvals[:k] / pvals[:k].sum(keepdims=True))
        positions = sum(spans[n - 1], [])
        n -= 1
        while len(masked) + len(positions) > num_to_predict and n > 0:   # try shorter n-grams
            positions = sum(spans[n - 1], [])
            n -= 1
        if len(masked) + len(positions) > num_to_predict or any(p in covered for p in positions):
            continue
        for p in positions:
            covered.add(p)
            if rng.random() < 0.8:
                output[p] = config.mask_id
            elif rng.random() < 0.5:
                output[p] = tokens[p]
            else:
                output[p] = config.vocab_id_list[rng.randint(0, len(config.vocab_id_list))]
            masked.append((p, tokens[p]))
    rng.shuffle(candidates)                         # Megatron draws this shuffle too (for permutation)
    masked.sort()
    return output, [p for p, _ in masked], [label for _, label in masked]


def build_training_sample(sentences, target_length, config, rng):
    """One sample (the dict of the module docstring) from its sentences (lists of ids)."""
    if config.binary_head:
        a, b, is_random = split_a_b(sentences, rng)
    else:
        a, b, is_random = [t for s in sentences for t in s], [], False
    truncated = truncate_pair(a, b, target_length, rng)
    tokens = [config.cls_id] + a + [config.sep_id] + (b + [config.sep_id] if b else [])
    types = [0] * (len(a) + 2) + [1] * (len(b) + 1 if b else 0)
    tokens, positions, labels = mask_tokens(tokens, config, config.mask_prob * target_length, rng)
    s, n = config.seq_length, len(tokens)
    padding = [config.pad_id] * (s - n)
    label_row = np.full(s, -1, np.int32)
    label_row[positions] = labels
    loss_mask = np.zeros(s, np.float32)
    loss_mask[positions] = 1.0
    return {"text": np.array(tokens + padding, np.int32),
            "types": np.array(types + padding, np.int32),            # padded with pad_id, as Megatron
            "labels": label_row, "loss_mask": loss_mask,
            "padding_mask": np.array([1] * n + [0] * (s - n), np.int32),
            "is_random": np.int32(is_random), "truncated": np.int32(truncated)}


class BertDataset:
    """BERT samples from `documents` (document ids, a contiguous range) of a sentence-level
    IndexedDataset; at least `num_samples` of them (whole epochs). `build_on_this_rank`/`barrier`:
    one rank builds the mapping cache while the others wait."""

    def __init__(self, indexed_dataset, split, documents, num_samples, config,
                 build_on_this_rank=True, barrier=None):
        self.indexed_dataset, self.split, self.config = indexed_dataset, split, config
        documents = np.asarray(documents)
        prefix = indexed_dataset.path_prefix
        if len(documents) == 0:
            raise ValueError(f"the {split} split of {prefix} has no documents; change --split or give a "
                             f"larger corpus")
        docs = np.asarray(indexed_dataset.document_indices[int(documents[0]):int(documents[-1]) + 2])
        self.cache_dir = config.data_cache_path or os.path.join(os.path.dirname(os.path.abspath(prefix)),
                                                                "cache", "BertDataset_indices")
        description = {
            "class": "BertDataset", "format": INDEX_FORMAT_VERSION, "path_prefix": os.path.abspath(prefix),
            "num_sequences": len(indexed_dataset), "num_tokens": indexed_dataset.num_tokens, "split": split,
            "documents": [int(documents[0]), int(documents[-1]) + 1], "num_samples": num_samples,
            "max_seq_length": config.seq_length - 3, "short_seq_prob": config.short_seq_prob,
            "seed": config.seed, "binary_head": config.binary_head,
        }
        arrays, self.cache_key, self.built_cache = cached_arrays(
            self.cache_dir, f"BertDataset-{split}", description, ("samples_mapping",),
            lambda: {"samples_mapping": build_samples_mapping(
                docs, indexed_dataset.sequence_lengths, num_samples, config.seq_length - 3,
                config.short_seq_prob, config.seed, 2 if config.binary_head else 1)},
            build_on_this_rank, barrier)
        self.samples_mapping = arrays["samples_mapping"]

    def __len__(self):
        return self.samples_mapping.shape[0]

    def __getitem__(self, idx):
        n = len(self)
        if not -n <= idx < n:
            raise IndexError(f"sample {idx} out of range ({n} samples)")
        idx %= n
        first, end, target = (int(v) for v in self.samples_mapping[idx])
        sentences = [self.indexed_dataset[i].tolist() for i in range(first, end)]
        rng = np.random.RandomState((self.config.seed + idx) % 2 ** 32)
        return build_training_sample(sentences, target, self.config, rng)
