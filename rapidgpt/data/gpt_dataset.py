"""GPT pretraining samples, indexed exactly as Megatron's GPTDataset indexes them.

The token stream of one epoch is the split's documents in shuffled order. A sample is
`seq_length + 1` consecutive tokens of that stream (inputs are the first `seq_length`, labels the
last `seq_length`), and consecutive samples overlap by one token, so sample j starts at stream
position `j * seq_length` and may cross document boundaries. Three arrays describe it:

- document index: the split's documents repeated once per epoch, shuffled with
  `numpy.random.RandomState(seed)`. When the last epoch is only partly used (< 80% of its
  samples) it is shuffled separately, so the partial epoch does not favour some documents.
- sample index `[num_samples + 1, 2]`: for each sample start, (position in the document index,
  token offset inside that document); row j+1 is where sample j ends.
- shuffle index: a permutation of samples (the separate final epoch again shuffled apart).

The same RNG draws in the same order as Megatron make the same samples in the same order, so a
Megatron run and a RapidGPT run on one corpus see identical batches.
"""
import os
from dataclasses import dataclass
from typing import Optional

import numpy as np

from rapidgpt.data.index_cache import cached_arrays

# Bump when the index algorithm changes so stale caches are not reused. Version 2: split ranges
# and blend sizes follow current Megatron-core instead of Megatron's legacy rounding.
INDEX_FORMAT_VERSION = 2
SPLIT_NAMES = ("train", "valid", "test")


@dataclass
class GPTDatasetConfig:
    """Everything that shapes GPT samples (the data flags of Megatron with the same names)."""
    seq_length: int
    seed: int = 1234
    eod: Optional[int] = None                 # end-of-document token id (tokenizer.eod)
    eod_mask_loss: bool = False               # --eod-mask-loss
    reset_position_ids: bool = False          # --reset-position-ids
    reset_attention_mask: bool = False        # --reset-attention-mask
    data_cache_path: Optional[str] = None     # --data-cache-path; None: `cache/` beside the data
    fim: Optional[object] = None              # --fim-data: a fim.FIMConfig that permutes each sample

    def __post_init__(self):
        if self.seq_length < 1:
            raise ValueError(f"--seq-length must be positive, got {self.seq_length}")
        if (self.eod_mask_loss or self.reset_position_ids or self.reset_attention_mask) and self.eod is None:
            raise ValueError("--eod-mask-loss/--reset-position-ids/--reset-attention-mask need the "
                             "tokenizer's end-of-document id; set a tokenizer (--tokenizer-type)")


def normalize(weights):
    """`weights / sum(weights)` in float64, as Megatron's `utils.normalize` (numpy's sum, so the
    last bits match Megatron's even with many weights)."""
    w = np.asarray(weights, dtype=np.float64)
    return (w / np.sum(w)).tolist()


def parse_split(split_string):
    """`--split "969,30,1"` (or "969/30/1", or "98") to three weights normalised to sum 1. Quotes
    left around the value by a launch script (`--split '99,1,0'` inside a variable that the shell
    word-splits) are dropped, as Megatron's parser ignores them."""
    text = str(split_string).strip().strip("'\"")
    parts = text.split(",") if "," in text else text.split("/")
    try:
        weights = [float(p) for p in parts]
    except ValueError:
        weights = []
    if not weights or len(weights) > 3 or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"--split {split_string!r}: expected up to three non-negative weights for "
                         f"train,valid,test with a positive sum, e.g. --split 969,30,1")
    return normalize(weights + [0.0] * (3 - len(weights)))


def split_boundaries(split_string, size):
    """Boundaries `[0, a, b, c]` of the train/valid/test ranges `[0, a)`, `[a, b)`, `[b, c)` of
    `size` items, as current Megatron-core cuts them: split i spans
    `round(cumulative_weight_before_i * size) .. round(cumulative_weight_through_i * size)`.

    Follows megatron/core/datasets/blended_megatron_dataset_config.py (parse_and_normalize_split,
    convert_split_vector_to_split_matrix) and blended_megatron_dataset_builder.py
    (_build_megatron_dataset_splits) of NVIDIA/Megatron-LM at commit d98e8a64ddf3 (Aug 2026):
    the same float sums in the same order and Python's round (half to even). E.g. 81 documents
    with 969,30,1 give `[0, 78, 81, 81]`; the old `legacy/data/dataset_utils.py` rule gave
    `[0, 79, 81, 81]`.
    """
    cumulative = [0]
    for weight in parse_split(split_string):
        cumulative.append(cumulative[-1] + weight)
    return [int(round(c * float(size))) for c in cumulative]


def num_epochs_needed(tokens_per_epoch, seq_length, num_samples):
    """Smallest epoch count E with `(E * tokens_per_epoch - 1) // seq_length >= num_samples`.

    The `- 1` is the overlap: every sample but the last shares its final token with the next.
    """
    if not num_samples:
        return 1
    return max(1, -(-(num_samples * seq_length + 1) // tokens_per_epoch))


def build_document_index(documents, num_epochs, rng, separate_final_epoch):
    """`documents` repeated `num_epochs` times and shuffled (final epoch apart if requested)."""
    if separate_final_epoch and num_epochs > 1:
        first = build_document_index(documents, num_epochs - 1, rng, False)
        last = build_document_index(documents, 1, rng, False)
        return np.concatenate((first, last))
    dtype = np.int32 if len(documents) == 0 or documents.max() < 2**31 - 1 else np.int64
    index = np.tile(np.asarray(documents, dtype=dtype), num_epochs)
    rng.shuffle(index)
    return index


def build_sample_index(sequence_lengths, document_index, seq_length, num_epochs, tokens_per_epoch):
    """`[num_samples + 1, 2]` (document-index position, offset) of every sample boundary.

    Sample j spans stream positions `j*seq_length .. (j+1)*seq_length` inclusive; its boundary is
    the document containing that position. Vectorised with a search over document start positions
    (Megatron walks the same boundaries one sample at a time in C++).
    """
    num_samples = (num_epochs * tokens_per_epoch - 1) // seq_length
    doc_lengths = np.asarray(sequence_lengths)[document_index].astype(np.int64)
    doc_starts = np.zeros(len(doc_lengths), np.int64)
    np.cumsum(doc_lengths[:-1], out=doc_starts[1:])
    positions = np.arange(num_samples + 1, dtype=np.int64) * seq_length
    doc_pos = np.searchsorted(doc_starts, positions, side="right") - 1
    offsets = positions - doc_starts[doc_pos]
    doc_pos[0], offsets[0] = 0, 0     # the first sample starts at the first document, empty or not
    dtype = np.int32 if len(doc_lengths) < 2**31 - 1 else np.int64
    return np.stack((doc_pos, offsets), axis=1).astype(dtype)


def build_shuffle_index(num_samples, total_size, rng):
    """Permutation of `total_size` samples; samples from `num_samples` on are shuffled apart."""
    dtype = np.uint32 if total_size < np.iinfo(np.uint32).max - 1 else np.int64
    first = np.arange(num_samples, dtype=dtype)
    rng.shuffle(first)
    if num_samples == total_size:
        return first
    last = np.arange(num_samples, total_size, dtype=dtype)
    rng.shuffle(last)
    return np.concatenate((first, last))


def build_gpt_indices(sequence_lengths, documents, num_samples, seq_length, seed):
    """The three index arrays of a GPT dataset over `documents` (ids of sequences)."""
    tokens_per_epoch = int(np.asarray(sequence_lengths)[documents].sum(dtype=np.int64))
    num_epochs = num_epochs_needed(tokens_per_epoch, seq_length, num_samples)
    separate_final_epoch, samples_before_final = False, None
    if num_epochs > 1:
        samples_before_final = ((num_epochs - 1) * tokens_per_epoch - 1) // seq_length
        samples_from_final = num_samples - samples_before_final
        samples_per_epoch = (tokens_per_epoch - 1) // seq_length
        separate_final_epoch = samples_from_final < int(0.80 * samples_per_epoch)
    rng = np.random.RandomState(seed)
    document_index = build_document_index(documents, num_epochs, rng, separate_final_epoch)
    sample_index = build_sample_index(sequence_lengths, document_index, seq_length, num_epochs,
                                      tokens_per_epoch)
    total = sample_index.shape[0] - 1
    shuffle_index = build_shuffle_index(samples_before_final if separate_final_epoch else total,
                                        total, rng)
    return {"document_index": document_index, "sample_index": sample_index,
            "shuffle_index": shuffle_index}


def ltor_masks_and_position_ids(tokens, eod, eod_mask_loss, reset_position_ids, reset_attention_mask):
    """Loss mask, position ids and (with document resets) the attention mask of one sample `[s]`.

    As Megatron's get_ltor_masks_and_position_ids: the loss is masked where the *input* token is
    EOD; with resets, positions restart and attention is blocked after every EOD.
    Attention mask is `[1, s, s]` bool, True = masked out (Megatron's convention).
    """
    s = tokens.shape[0]
    loss_mask = np.ones(s, np.float32)
    if eod_mask_loss:
        loss_mask[tokens == eod] = 0.0
    position_ids = np.arange(s, dtype=np.int32)
    attention_mask = None
    if reset_attention_mask:
        attention_mask = ~np.tril(np.ones((s, s), dtype=bool))[None]
    if reset_position_ids or reset_attention_mask:
        previous = 0
        for i in np.flatnonzero(tokens == eod):
            if reset_attention_mask:
                attention_mask[0, i + 1:, : i + 1] = True
            if reset_position_ids:
                position_ids[i + 1:] -= i + 1 - previous
                previous = i + 1
    return loss_mask, position_ids, attention_mask


class GPTDataset:
    """`num_samples` GPT samples drawn from `documents` (sequence ids) of an IndexedDataset.

    `ds[i]` is a dict of numpy arrays: `tokens` int32 `[s]`, `labels` int32 `[s]`,
    `loss_mask` float32 `[s]`, `position_ids` int32 `[s]`, and `attention_mask` bool `[1, s, s]`
    only with `reset_attention_mask` (otherwise the model applies the plain causal mask).
    `build_on_this_rank`/`barrier` let one rank build the index cache while the others wait.
    """

    def __init__(self, indexed_dataset, split, documents, num_samples, config,
                 build_on_this_rank=True, barrier=None):
        self.indexed_dataset = indexed_dataset
        self.split = split
        self.config = config
        self.num_samples = num_samples       # requested; len(self) may be larger (whole epochs)
        documents = np.asarray(documents)
        if len(documents) == 0:
            raise ValueError(f"the {split} split of {indexed_dataset.path_prefix} has no documents; "
                             f"change --split or give a larger corpus")
        prefix = indexed_dataset.path_prefix
        self.cache_dir = config.data_cache_path or os.path.join(os.path.dirname(os.path.abspath(prefix)),
                                                                "cache", "GPTDataset_indices")
        description = {
            "class": "GPTDataset", "format": INDEX_FORMAT_VERSION, "path_prefix": os.path.abspath(prefix),
            "num_sequences": len(indexed_dataset), "num_tokens": indexed_dataset.num_tokens,
            "split": split, "documents": [int(documents[0]), int(documents[-1]) + 1, len(documents)],
            "num_samples": num_samples, "seq_length": config.seq_length, "seed": config.seed,
        }
        arrays, self.cache_key, self.built_cache = cached_arrays(
            self.cache_dir, f"GPTDataset-{split}", description,
            ("document_index", "sample_index", "shuffle_index"),
            lambda: build_gpt_indices(indexed_dataset.sequence_lengths, documents, num_samples,
                                      config.seq_length, config.seed),
            build_on_this_rank, barrier)
        self.document_index = arrays["document_index"]
        self.sample_index = arrays["sample_index"]
        self.shuffle_index = arrays["shuffle_index"]

    def __len__(self):
        return self.sample_index.shape[0] - 1

    def sample_tokens(self, idx):
        """The `seq_length + 1` tokens of sample `idx` (after shuffling), int32."""
        j = int(self.shuffle_index[idx])
        first_doc, first_offset, last_doc, last_offset = self.sample_index[j:j + 2].ravel().tolist()
        get, documents = self.indexed_dataset.get, self.document_index
        if first_doc == last_doc:
            return get(documents[first_doc], first_offset, last_offset - first_offset + 1).astype(np.int32)
        pieces = [get(documents[first_doc], first_offset)]
        pieces += [get(documents[d]) for d in range(first_doc + 1, last_doc)]
        pieces.append(get(documents[last_doc], 0, last_offset + 1))
        return np.concatenate(pieces).astype(np.int32)

    def __getitem__(self, idx):
        n = len(self)
        if not -n <= idx < n:
            raise IndexError(f"sample {idx} out of range ({n} samples)")
        sample = self.sample_tokens(idx % n)
        c = self.config
        if c.fim is not None:
            sample = c.fim.permute(sample, c.seed, self.split, idx % n)
        tokens, labels = sample[:-1], sample[1:]
        loss_mask, position_ids, attention_mask = ltor_masks_and_position_ids(
            tokens, c.eod, c.eod_mask_loss, c.reset_position_ids, c.reset_attention_mask)
        item = {"tokens": tokens, "labels": labels, "loss_mask": loss_mask, "position_ids": position_ids}
        if attention_mask is not None:
            item["attention_mask"] = attention_mask
        return item
