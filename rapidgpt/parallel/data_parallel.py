"""Data parallelism: averaging gradients over the data-parallel ranks in a few flat buffers.

Each DP rank computes the gradients of its own slice of the global batch, from its loss already
divided by the DP size (as Megatron's DDP scales gradients by 1/DP before reducing them: the sum is
then the mean, and in fp16 no partial sum grows beyond one rank's gradient, so an overflow happens
at the same loss scale as in one process); after the step's micro-batches are accumulated,
`GradientSummer` adds them over the DP ranks, so every rank holds the mean, applies the same update
and the replicas stay identical (they start identical: the
initialisation is seeded by parameter name). Why flat buffers: a collective costs a fixed latency
on top of its bytes (several ms on the CPU backend), so one call per parameter would cost more than
the model; gradients are concatenated into buckets of up to `bucket_elements` (per dtype, in
parameter order), each reduced with one all-reduce and split back.

ZeRO (rapidgpt/optim/distributed_optimizer.py) lays the parameters end to end as one flat
vector cut into one equal range per DP rank (ShardPlan). From stage 2 on the gradients are summed
into that layout instead: `GradientShardReducer` reduce-scatters the flat gradient vector, so each
rank ends the step holding only the sums of the elements it owns. At stage 3 the model's
parameters are pieces too, cut parameter by parameter (rapidgpt/parallel/fully_sharded.py,
EvenShardPlan), and the backward of their gathers already sums their gradients over the ranks
(`REDUCED_IN_BACKWARD`). Whatever the stage, a
checkpoint holds whole tensors: `ShardedState` is one as seen from a rank holding pieces of it.
"""
import math

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

from rapidgpt.parallel import comm
from rapidgpt.tensor_tuples import map_tensors

DEFAULT_BUCKET_ELEMENTS = 1 << 25          # 32M elements (128 MB of fp32) per all-reduce

# An optimizer wrapper's `gradient_layout` under ZeRO-3: one gradient per parameter piece, already
# summed over the data-parallel ranks by the backward (nothing left to reduce).
REDUCED_IN_BACKWARD = "reduced in backward"


def plan_buckets(params, bucket_elements=DEFAULT_BUCKET_ELEMENTS):
    """Group parameter indices into buckets: same dtype, consecutive, at most `bucket_elements`
    elements each (a larger parameter gets a bucket of its own)."""
    buckets, current, size, dtype = [], [], 0, None
    for i, p in enumerate(params):
        n = int(p.size)
        if current and (p.dtype != dtype or size + n > bucket_elements):
            buckets.append(tuple(current))
            current, size = [], 0
        current.append(i)
        size, dtype = size + n, p.dtype
    if current:
        buckets.append(tuple(current))
    return tuple(buckets)


class GradientSummer(nn.Cell):
    """`grads` (tuple, in `params` order) -> their sum over the data-parallel group."""

    def __init__(self, params, group, bucket_elements=DEFAULT_BUCKET_ELEMENTS):
        super().__init__()
        self.size = comm.group_size(group)
        # Buckets hold consecutive indices: each is a slice of the gradient tuple, laid out flat
        # as a ShardPlan of one rank lays out its parameters.
        self.buckets = tuple((bucket[0], bucket[-1] + 1, ShardPlan([params[i].shape for i in bucket], 1, 0))
                             for bucket in plan_buckets(params, bucket_elements))
        self.all_reduce = comm.AllReduce(group)

    def construct(self, grads):
        if self.size == 1:
            return grads
        summed = ()
        for first, end, layout in self.buckets:
            summed = summed + layout.split(self.all_reduce(ops.cat(map_tensors(flattened, grads[first:end]))))
        return summed


class ShardPlan:
    """Which elements of which parameters data-parallel rank `rank` of `size` owns, Megatron's
    distributed-optimizer layout: the parameters (of `shapes`) laid end to end, in order, as one
    flat vector of `total` elements padded to size x S (S = `shard` = ceil(total / size)); rank r
    owns elements [r S, (r+1) S). `pieces`: a tuple of (parameter index, first, end) over that
    parameter's flattened elements (a parameter may be cut between two ranks); `offsets[i]`: where
    parameter i starts in the flat vector; `padding`: the zeros ending this rank's range."""

    def __init__(self, shapes, size, rank):
        self.shapes = tuple(tuple(shape) for shape in shapes)
        counts = [math.prod(shape) for shape in shapes]
        self.offsets = tuple(sum(counts[:i]) for i in range(len(counts)))
        self.total = sum(counts)
        self.shard = math.ceil(self.total / size)
        self.size = size
        start, end = rank * self.shard, (rank + 1) * self.shard
        self.pieces = tuple((i, max(start, a) - a, min(end, a + n) - a)
                            for i, (a, n) in enumerate(zip(self.offsets, counts)) if a < end and a + n > start)
        # The pieces as three columns (parameter indices, firsts, ends), to map over in a graph.
        self.piece_columns = tuple(tuple(column) for column in zip(*self.pieces))
        self.padding = self.shard - sum(hi - lo for _, lo, hi in self.pieces)
        self.flat_padding = size * self.shard - self.total          # all ranks' padding: the last ranks'

    def split(self, flat):
        """The whole flat vector (all ranks' ranges) -> each parameter's tensor, in order."""
        return map_tensors(ops.partial(_cut, flat), self.offsets, self.shapes)


def _cut(flat, offset, shape):
    """The tensor of `shape` that starts at `offset` of the 1-D `flat`."""
    return flat[offset:offset + math.prod(shape)].reshape(shape)


def flattened(tensor):
    return tensor.reshape(-1)


def padded_cat(parts, zeros, dtype):
    """The 1-D `parts` end to end, then `zeros` zeros: a flat vector of a ShardPlan's layout."""
    parts = list(parts)
    if zeros:
        parts.append(ops.zeros((zeros,), dtype))
    return ops.cat(parts)


class GradientShardReducer(nn.Cell):
    """`grads` (tuple, one per parameter, in `plan` order) -> this rank's pieces (1-D, in
    `plan.pieces` order) of their sum over the data-parallel group: the flat vector (in `dtype`,
    padded to size x S) reduce-scattered in one collective."""

    def __init__(self, plan, group, dtype):
        super().__init__()
        self.dtype = dtype
        self.flat_padding = plan.flat_padding
        self.reduce_scatter = comm.ReduceScatter(group)
        starts, ends, start = [], [], 0
        for _, lo, hi in plan.pieces:
            starts.append(start)
            start += hi - lo
            ends.append(start)
        self.starts, self.ends = tuple(starts), tuple(ends)

    def construct(self, grads):
        flat = padded_cat(map_tensors(ops.partial(_flattened_as, self.dtype), grads), self.flat_padding, self.dtype)
        shard = self.reduce_scatter(flat)
        return map_tensors(ops.partial(_range_of, shard), self.starts, self.ends)


def _flattened_as(dtype, tensor):
    return ops.cast(tensor.reshape(-1), dtype)


def _range_of(flat, start, end):
    return flat[start:end]


class ShardedKind:
    """One kind of sharded tensor (the main parameters, Adam's m, a ZeRO-3 layer's weights, ...) of
    one layout (`layout`: its `plan`, a ShardPlan or ZeRO-3's EvenShardPlan, and
    `gather_pieces(pieces)`, the whole fp32 tensors from every rank's pieces): this rank's piece
    Parameters in plan order, gathered into whole per-parameter values at most once."""

    def __init__(self, layout, pieces):
        self.layout, self.pieces, self._whole = layout, pieces, None
        self.of_parameter = {}                   # parameter index -> [(piece, first, end)]
        for piece, (i, lo, hi) in zip(pieces, layout.plan.pieces):
            self.of_parameter.setdefault(i, []).append((piece, lo, hi))

    def whole(self, i):
        if self._whole is None:
            self._whole = self.layout.gather_pieces(tuple(p.value().astype(ms.float32) for p in self.pieces))
        return self._whole[i]


class ShardedState:
    """A checkpoint tensor of which this rank holds pieces (the whole tensor's name and `shape`, as
    an unsharded run saves it): `whole_value()` (called on every data-parallel rank when saving)
    is the whole fp32 value; `set_data(whole)` (loading) keeps this rank's pieces of it."""

    def __init__(self, kind, index, shape):
        self.kind, self.index, self.shape, self.dtype = kind, index, tuple(shape), ms.float32

    def whole_value(self):
        return self.kind.whole(self.index)

    def set_data(self, value):
        flat = value.astype(ms.float32).asnumpy().reshape(-1)
        for piece, lo, hi in self.kind.of_parameter.get(self.index, ()):
            # A piece longer than its range (ZeRO-3's EvenShardPlan) ends in zeros.
            padded = np.zeros(piece.shape, np.float32)
            padded[:hi - lo] = flat[lo:hi]
            piece.set_data(Tensor(padded).astype(piece.dtype))
