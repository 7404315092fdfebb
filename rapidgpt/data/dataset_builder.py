"""From Megatron's data flags to the train/valid/test GPT datasets.

- `--data-path PREFIX` or `--data-path W1 PREFIX1 W2 PREFIX2 ...`: each corpus is cut into
  train/valid/test document ranges by `--split`; with several corpora each split is a weighted
  blend, every part built with `ceil(1.005 * weight * N)` samples so the blend never runs short.
- `--train-data-path / --valid-data-path / --test-data-path`: each split from its own corpora
  (same weighted syntax), every corpus used whole.
"""
import math
import os

import numpy as np

from rapidgpt.data.blended_dataset import BlendedDataset
from rapidgpt.data.gpt_dataset import SPLIT_NAMES, GPTDataset, split_boundaries
from rapidgpt.data.indexed_dataset import IndexedDataset

# Headroom Megatron gives each part of a blend so that rounding never leaves it short.
BLEND_MARGIN = 1.005


def parse_data_path(data_path, flag="--data-path"):
    """`["prefix"]` or `["0.3", "a", "0.7", "b"]` to `(prefixes, weights)` with weights summing to 1."""
    if isinstance(data_path, str):
        data_path = data_path.split()
    items = list(data_path or [])
    if len(items) == 1:
        return items, [1.0]
    weights = []
    try:
        weights = [float(w) for w in items[0::2]]
    except ValueError:
        pass
    if not items or len(items) % 2 or len(weights) != len(items) // 2 or any(w < 0 for w in weights) \
            or sum(weights) <= 0:
        raise ValueError(f"{flag}: expected one dataset prefix, or weight/prefix pairs such as "
                         f"'{flag} 0.3 corpus_a_text_document 0.7 corpus_b_text_document'; "
                         f"got {' '.join(items) or 'nothing'}")
    total = sum(weights)
    return items[1::2], [w / total for w in weights]


class _Builder:
    """Shared state of one build: config, rank-0-builds protocol, opened corpora."""

    def __init__(self, config, build_on_this_rank, barrier):
        self.config = config
        self.build_on_this_rank = build_on_this_rank
        self.barrier = barrier
        self._corpora = {}

    def corpus(self, prefix):
        if prefix not in self._corpora:
            self._corpora[prefix] = IndexedDataset(prefix)
        return self._corpora[prefix]

    def gpt(self, prefix, split, documents, num_samples):
        return GPTDataset(self.corpus(prefix), split, documents, num_samples, self.config,
                          self.build_on_this_rank, self.barrier)

    def blend(self, prefixes, weights, parts, num_samples):
        """One part alone is returned as is; several are mixed into `num_samples` samples."""
        if len(parts) == 1:
            return parts[0]
        cache_dir = self.config.data_cache_path or os.path.join(
            os.path.dirname(os.path.abspath(prefixes[0])), "cache", "BlendedDataset_indices")
        size = num_samples if num_samples else sum(len(p) for p in parts)
        return BlendedDataset(parts, weights, size, cache_dir, self.build_on_this_rank, self.barrier)


def _part_samples(num_samples, weight):
    return None if num_samples is None else int(math.ceil(num_samples * weight * BLEND_MARGIN))


def build_train_valid_test_datasets(config, train_valid_test_num_samples, data_path=None,
                                    split="969,30,1", train_data_path=None, valid_data_path=None,
                                    test_data_path=None, build_on_this_rank=True, barrier=None):
    """`[train, valid, test]` datasets (None where a split is empty or asks for 0 samples).

    `train_valid_test_num_samples[i]` is how many samples split i must provide; None means one
    pass over its documents. `build_on_this_rank` / `barrier` make one rank build index caches.
    """
    builder = _Builder(config, build_on_this_rank, barrier)
    separate = (train_data_path, valid_data_path, test_data_path)
    if data_path and any(separate):
        raise ValueError("give either --data-path (cut by --split) or --train-data-path/"
                         "--valid-data-path/--test-data-path, not both")
    if not data_path and not any(separate):
        raise ValueError("no training data: pass --data-path PREFIX (a Megatron .bin/.idx prefix "
                         "made by data_tools/preprocess_data.py)")
    datasets = [None, None, None]
    if data_path:
        prefixes, weights = parse_data_path(data_path)
        bounds = {p: split_boundaries(split, len(builder.corpus(p))) for p in prefixes}
        for i, name in enumerate(SPLIT_NAMES):
            n = train_valid_test_num_samples[i]
            if n == 0:
                continue
            parts = []
            for prefix, weight in zip(prefixes, weights):
                start, stop = bounds[prefix][i], bounds[prefix][i + 1]
                if stop > start:
                    documents = np.arange(start, stop, dtype=np.int64)
                    samples = n if len(prefixes) == 1 else _part_samples(n, weight)
                    parts.append(builder.gpt(prefix, name, documents, samples))
            if len(parts) == len(prefixes):
                datasets[i] = builder.blend(prefixes, weights, parts, n)
            elif parts:
                raise ValueError(f"--split {split!r} leaves the {name} split empty for some corpora "
                                 f"of --data-path but not others; use a split every corpus can fill")
        return datasets
    for i, (name, path) in enumerate(zip(SPLIT_NAMES, separate)):
        n = train_valid_test_num_samples[i]
        if not path or n == 0:
            continue
        prefixes, weights = parse_data_path(path, f"--{name}-data-path")
        parts = [builder.gpt(p, name, np.arange(len(builder.corpus(p)), dtype=np.int64),
                             n if len(prefixes) == 1 else _part_samples(n, w))
                 for p, w in zip(prefixes, weights)]
        datasets[i] = builder.blend(prefixes, weights, parts, n)
    return datasets
