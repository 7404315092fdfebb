"""From Megatron's data flags to the train/valid/test GPT or BERT datasets, sized as Megatron-core
sizes them. The config says which: a GPTDatasetConfig gives GPT samples (rapidgpt/data/gpt_dataset.py,
split by sequences), a BertDatasetConfig BERT samples of a sentence-level corpus
(rapidgpt/data/bert_dataset.py, split by documents, as Megatron's BERT splits them).

- `--data-path PREFIX`: the corpus is cut into train/valid/test document ranges by `--split`,
  split i being documents `[round(c_i * N), round(c_(i+1) * N))` of N, with `c` the cumulative
  split weights (see gpt_dataset.split_boundaries); a split asked for S samples gets them.
- `--data-path W1 PREFIX1 W2 PREFIX2 ...`: every corpus is cut the same way, and split i, asked for
  S samples, is a weighted blend of `sum_j ceil(S * w_j)` samples whose part j is built with
  `ceil(ceil(S * w_j) * 1.005)` samples (the 0.5% surplus keeps the blend from running short).
  A single weighted prefix (`1 PREFIX`) is a blend of one part, as in Megatron.
- `--train-data-path / --valid-data-path / --test-data-path`: each split from its own corpora,
  every corpus used whole; one prefix is used as is, several are blended as above.
- Any prefix may instead be a MindFormers MindRecord file (`NAME.mindrecord`, see
  mindrecord_dataset.py): its rows are cut by `--split` like documents, each row one sample.
- `--mock-data`: Megatron's mock documents (mock_dataset.py), cut "1,1,1" as Megatron cuts them.

These are the rules of NVIDIA/Megatron-LM's megatron/core/datasets/blended_megatron_dataset_builder.py
(`BlendedMegatronDatasetBuilder._build_blended_dataset_splits`, `_get_size_per_split_per_dataset`)
at commit d98e8a64ddf3 (Aug 2026), not those of its older `legacy/data/dataset_utils.py`.

Index caches are built as Megatron builds them: with several processes global rank 0 builds
while every other rank waits at a barrier, then all map the same files. The cache directory
(`--data-cache-path`, or `cache/` beside the data) must therefore be one every rank sees.
"""
import math
import os
from dataclasses import replace

import numpy as np

from rapidgpt.data.bert_dataset import BertDataset, BertDatasetConfig
from rapidgpt.data.blended_dataset import BlendedDataset
from rapidgpt.data.gpt_dataset import SPLIT_NAMES, GPTDataset, normalize, split_boundaries
from rapidgpt.data.indexed_dataset import IndexedDataset
from rapidgpt.data.mindrecord_dataset import (MindRecordCorpus, MindRecordGPTDataset,
                                              is_mindrecord)
from rapidgpt.data.mock_dataset import MOCK_SPLIT
from rapidgpt.utils import cache_root

# Megatron's mid_level_dataset_surplus: the extra share of samples each part of a blend is built
# with, so that the blend's greedy interleaving never asks a part for more than it has.
MID_LEVEL_DATASET_SURPLUS = 0.005


def parse_data_path(data_path, flag="--data-path"):
    """`["prefix"]` to `(["prefix"], None)`; `["0.3", "a", "0.7", "b"]` to `(prefixes, weights)`
    with the weights normalised to sum 1 (None: no weights given, the corpus is used alone)."""
    if isinstance(data_path, str):
        data_path = data_path.split()
    items = list(data_path or [])
    if len(items) == 1:
        return items, None
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
    return items[1::2], normalize(weights)


def blend_sizes(num_samples, weights):
    """`(blend_size, part_sizes)` of a weighted blend asked for `num_samples` samples: the blend
    has `sum_j ceil(num_samples * w_j)` samples, part j is built with
    `ceil(ceil(num_samples * w_j) * (1 + surplus))` (Megatron's target and buffer sizes)."""
    targets = [int(math.ceil(num_samples * w)) for w in weights]
    parts = [int(math.ceil(t * (1 + MID_LEVEL_DATASET_SURPLUS))) for t in targets]
    return sum(targets), parts


def rank_zero_builds():
    """`(build_on_this_rank, barrier)` of this process: alone it builds and waits for nobody; in a
    job of several processes only global rank 0 builds and every rank meets at a barrier over all
    ranks (so each rank must build the same datasets, in the same order)."""
    # Imported here: rapidgpt.parallel loads MindSpore (~2 s), which the data tools do not need.
    from rapidgpt.parallel import comm
    from rapidgpt.parallel.state import get_parallel_state
    state = get_parallel_state()
    if state.world_size == 1:
        return True, None
    return state.rank == 0, comm.barrier


class _Builder:
    """Shared state of one build: config, rank-0-builds protocol, opened corpora."""

    def __init__(self, config, build_on_this_rank, barrier, mock=None):
        self.config = config
        self.build_on_this_rank = build_on_this_rank
        self.barrier = barrier
        self._corpora = {} if mock is None else {mock.path_prefix: mock}

    def corpus(self, prefix):
        """The documents (.bin/.idx) or rows (MindRecord) of `prefix`, opened once."""
        if prefix not in self._corpora:
            self._corpora[prefix] = (MindRecordCorpus(prefix, self.config.seq_length + 1)
                                     if is_mindrecord(prefix) else IndexedDataset(prefix))
        return self._corpora[prefix]

    def is_bert(self):
        return isinstance(self.config, BertDatasetConfig)

    def split_units(self, prefix):
        """What --split cuts: the documents of a BERT corpus, else the sequences (MindRecord rows)."""
        corpus = self.corpus(prefix)
        return len(corpus.document_indices) - 1 if self.is_bert() else len(corpus)

    def single(self, prefix, split, documents, num_samples):
        """Samples from `documents` (sequences, BERT's documents, rows of a MindRecord file) of `prefix`."""
        corpus = self.corpus(prefix)
        if self.is_bert():
            if isinstance(corpus, MindRecordCorpus):
                raise ValueError(f"{prefix}: BERT reads a sentence-level .bin/.idx corpus (preprocess_data.py "
                                 f"--split-sentences), not MindRecord rows")
            return BertDataset(corpus, split, documents, num_samples, self.config,
                               self.build_on_this_rank, self.barrier)
        if isinstance(corpus, MindRecordCorpus):
            if self.config.fim is not None:
                raise ValueError(f"{prefix}: --fim-data permutes the documents of a .bin/.idx corpus; MindRecord "
                                 f"rows (padded samples) are not built for it: remove --fim-data or give .bin/.idx data")
            return MindRecordGPTDataset(corpus, split, documents, num_samples, self.config)
        return GPTDataset(corpus, split, documents, num_samples, self.config,
                          self.build_on_this_rank, self.barrier)

    def weighted(self, name, prefixes, weights, documents, num_samples):
        """Split `name` as a blend of `prefixes` (the `documents` of each) asked for `num_samples`."""
        if num_samples is None:
            raise ValueError(f"the {name} split blends weighted corpora, which needs a sample count "
                             f"(as in Megatron); give one or use a single corpus")
        size, part_sizes = blend_sizes(num_samples, weights)
        parts = [self.single(p, name, d, n) for p, d, n in zip(prefixes, documents, part_sizes)]
        cache_dir = self.config.data_cache_path or os.path.join(
            os.path.dirname(os.path.abspath(prefixes[0])), "cache", "BlendedDataset_indices")
        return BlendedDataset(parts, weights, size, cache_dir, self.build_on_this_rank, self.barrier)


def build_train_valid_test_datasets(config, train_valid_test_num_samples, data_path=None,
                                    split="969,30,1", train_data_path=None, valid_data_path=None,
                                    test_data_path=None, build_on_this_rank=None, barrier=None, mock=None):
    """`[train, valid, test]` datasets (None where a split is empty or asks for 0 samples).

    `mock`: a mock_dataset.MockCorpus (--mock-data), the data instead of the paths; its index
    caches go to --data-cache-path, else to RapidGPT's cache.

    `train_valid_test_num_samples[i]` is how many samples split i must provide; None means one
    pass over its documents (single corpora only). Every rank of the job must call this.
    `build_on_this_rank` / `barrier` say whether this process builds missing index caches and how
    it waits for the builder; None (default): `rank_zero_builds()`, rank 0 builds, all wait.
    """
    if build_on_this_rank is None:
        build_on_this_rank, barrier = rank_zero_builds()
    separate = (train_data_path, valid_data_path, test_data_path)
    if mock is not None:
        if data_path or any(separate):
            raise ValueError("--mock-data: give one data source, --mock-data or the data paths, not both")
        data_path, split = [mock.path_prefix], MOCK_SPLIT
        if config.data_cache_path is None:
            config = replace(config, data_cache_path=os.path.join(cache_root(), "mock_data"))
    builder = _Builder(config, build_on_this_rank, barrier, mock)
    if data_path and any(separate):
        raise ValueError("give either --data-path (cut by --split) or --train-data-path/"
                         "--valid-data-path/--test-data-path, not both")
    if not data_path and not any(separate):
        raise ValueError("no training data: pass --data-path PREFIX (a Megatron .bin/.idx prefix "
                         "made by data_tools/preprocess_data.py, or a MindRecord file)")
    datasets = [None, None, None]
    if data_path:
        prefixes, weights = parse_data_path(data_path)
        bounds = {p: split_boundaries(split, builder.split_units(p)) for p in prefixes}
        for i, name in enumerate(SPLIT_NAMES):
            n = train_valid_test_num_samples[i]
            if n == 0:
                continue
            documents = [np.arange(bounds[p][i], bounds[p][i + 1], dtype=np.int64) for p in prefixes]
            if not any(len(d) for d in documents):
                continue
            if not all(len(d) for d in documents):
                raise ValueError(f"--split {split!r} leaves the {name} split empty for some corpora "
                                 f"of --data-path but not others; use a split every corpus can fill")
            if weights is None:
                datasets[i] = builder.single(prefixes[0], name, documents[0], n)
            else:
                datasets[i] = builder.weighted(name, prefixes, weights, documents, n)
        return datasets
    for i, (name, path) in enumerate(zip(SPLIT_NAMES, separate)):
        n = train_valid_test_num_samples[i]
        if not path or n == 0:
            continue
        prefixes, weights = parse_data_path(path, f"--{name}-data-path")
        documents = [np.arange(builder.split_units(p), dtype=np.int64) for p in prefixes]
        if len(prefixes) == 1:       # weighted or not, as Megatron: no blend around one corpus
            datasets[i] = builder.single(prefixes[0], name, documents[0], n)
        else:
            datasets[i] = builder.weighted(name, prefixes, weights, documents, n)
    return datasets
