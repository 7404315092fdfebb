"""Data-parallel-aware, resumable samplers and the micro-batch loader.

Every sampler walks one global order of sample indices in groups of
`micro_batch_size x data_parallel_size` and hands each DP rank its own contiguous slice of each
group (Megatron's MegatronPretrainingSampler). The samples of a global batch are therefore the
same whatever the DP size, which is what makes a DP run train the single-process model, and a
sampler restarted with `consumed_samples` continues exactly where the last run stopped.
"""
from multiprocessing.pool import ThreadPool

import numpy as np

from rapidgpt.utils import bounded_imap


def _rank_slices(order, micro_batch_size, dp_rank, dp_size, drop_last):
    group = micro_batch_size * dp_size
    start, stop = dp_rank * micro_batch_size, (dp_rank + 1) * micro_batch_size
    for i in range(0, len(order), group):
        chunk = order[i:i + group]
        if len(chunk) < group and drop_last:
            return
        mine = chunk[start:stop]
        if len(mine):
            yield [int(x) for x in mine]


class PretrainingSampler:
    """Samples `consumed_samples .. total_samples` in dataset order (the dataset is pre-shuffled)."""

    def __init__(self, total_samples, consumed_samples, micro_batch_size, dp_rank=0, dp_size=1):
        if consumed_samples >= total_samples:
            raise ValueError(f"no samples left: consumed {consumed_samples} of {total_samples}")
        self.total_samples, self.consumed_samples = total_samples, consumed_samples
        self.micro_batch_size, self.dp_rank, self.dp_size = micro_batch_size, dp_rank, dp_size

    def __iter__(self):
        order = np.arange(self.consumed_samples, self.total_samples)
        return _rank_slices(order, self.micro_batch_size, self.dp_rank, self.dp_size, drop_last=True)


class EpochSampler:
    """Epochs over a dataset of `size` samples, each a fresh permutation seeded by (seed, epoch).

    Endless: epoch e covers consumed samples `[e * per_epoch, (e + 1) * per_epoch)`, where
    `per_epoch` drops the last incomplete global micro-batch group, as Megatron does.
    """

    def __init__(self, size, consumed_samples, micro_batch_size, dp_rank=0, dp_size=1, seed=1234):
        group = micro_batch_size * dp_size
        self.samples_per_epoch = (size // group) * group
        if self.samples_per_epoch == 0:
            raise ValueError(f"the training set has {size} samples, fewer than one micro batch x "
                             f"data-parallel size ({group}); lower --micro-batch-size")
        self.size, self.consumed_samples, self.seed = size, consumed_samples, seed
        self.micro_batch_size, self.dp_rank, self.dp_size = micro_batch_size, dp_rank, dp_size

    def epoch_order(self, epoch):
        return np.random.default_rng([self.seed, epoch]).permutation(self.size)[:self.samples_per_epoch]

    def __iter__(self):
        epoch, offset = divmod(self.consumed_samples, self.samples_per_epoch)
        while True:
            yield from _rank_slices(self.epoch_order(epoch)[offset:], self.micro_batch_size,
                                    self.dp_rank, self.dp_size, drop_last=True)
            epoch, offset = epoch + 1, 0


class SequentialSampler:
    """Every sample once, in order (evaluation); the last group may be short, so a rank may have
    one micro-batch fewer than another. With `equal_batches` such a rank ends with one padding
    micro-batch (the set's first sample again; `padding_batches` says how many), for models whose
    forward every data-parallel rank must run together (ZeRO-3 gathers each layer's weights from
    all of them)."""

    def __init__(self, size, micro_batch_size, dp_rank=0, dp_size=1, equal_batches=False):
        self.size, self.micro_batch_size, self.dp_rank, self.dp_size = size, micro_batch_size, dp_rank, dp_size
        groups = -(-size // (micro_batch_size * dp_size))
        self.padding_batches = groups - len(self.real_batches()) if equal_batches else 0

    def real_batches(self):
        """This rank's micro-batches of the set's samples (index lists)."""
        return list(_rank_slices(np.arange(self.size), self.micro_batch_size, self.dp_rank, self.dp_size,
                                 drop_last=False))

    def __iter__(self):
        return iter(self.real_batches() + [[0]] * self.padding_batches)


def default_collate(samples):
    """Stack a list of samples (dicts, tuples or arrays of numpy-compatible values) along a new axis 0."""
    first = samples[0]
    if isinstance(first, dict):
        return {key: np.stack([np.asarray(s[key]) for s in samples]) for key in first}
    if isinstance(first, (tuple, list)):
        return tuple(np.stack([np.asarray(s[i]) for s in samples]) for i in range(len(first)))
    return np.stack([np.asarray(s) for s in samples])


def micro_batches(dataset, sampler, collate_fn=None, num_workers=0):
    """Iterator of collated micro-batches; `num_workers` threads prepare the next ones ahead."""
    collate_fn = collate_fn or default_collate

    def load(indices):
        return collate_fn([dataset[i] for i in indices])

    if num_workers == 0:
        yield from map(load, sampler)
        return
    with ThreadPool(num_workers) as pool:
        yield from bounded_imap(pool, load, iter(sampler), 2 * num_workers)
