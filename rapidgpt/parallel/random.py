"""Seeded, layout-independent randomness: parameter initialisation and dropout.

Initialisation: every parameter's FULL tensor (as it would be on one process) is drawn from a
generator seeded by (`--seed`, the parameter's global name), and each rank keeps its own slice.
The weights therefore do not depend on how the model is split over tensor or pipeline ranks, nor
on the order in which layers are built: a TP/PP run starts from exactly the single-process model.

Dropout: `Dropout`'s keep mask is a pure function of (`--seed`, the cell's global name, the
training iteration, the micro-batch number within it, the element's position in the FULL tensor).
Nothing about it needs saving: a resumed run draws exactly the masks the uninterrupted run drew,
and a tensor-parallel rank draws exactly its slice of the single-process mask (so dropout inside
TP regions differs between ranks, as Megatron's RNG tracker makes it, and is reproducible). Why
not MindSpore's own dropout: its CPU kernel's generator lives inside the kernel, where no API can
read or restore it, and the generator-based ops (mint dropout, RandExt) have no CPU kernel.
"""
import hashlib
import itertools
import logging
from dataclasses import dataclass
from typing import Optional, Tuple

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from rapidgpt.emulated_bf16 import RoundsToBf16
from rapidgpt.parallel.state import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size


@dataclass(frozen=True)
class ParamInit:
    """How a layer's parameter is initialised.

    std:            normal(0, std); 0 means zeros.
    full_shape:     the shape across all tensor-parallel ranks.
    partition_dim:  the dimension split over TP ranks (None: replicated).
    drawn_rows:     vocabulary padding: only the first `drawn_rows` rows are random, the padded
                    rows are zero. The drawn block has the same shape whatever the padding, so the
                    real rows do not change when `--make-vocab-size-divisible-by` does.
    """
    std: float
    full_shape: Tuple[int, ...]
    partition_dim: Optional[int] = None
    drawn_rows: Optional[int] = None


def seeded_normal(seed, name, shape, std):
    """N(0, std^2) float32 array of `shape` from a generator keyed by (seed, name)."""
    key = int.from_bytes(hashlib.sha256(f"{seed}/{name}".encode("utf-8")).digest()[:16], "little")
    rng = np.random.Generator(np.random.PCG64(key))
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(std)


def full_value(spec, seed, name):
    """The parameter's full (unsplit) initial value."""
    full = np.zeros(spec.full_shape, np.float32)
    if spec.std:
        rows = spec.full_shape[0] if spec.drawn_rows is None else spec.drawn_rows
        full[:rows] = seeded_normal(seed, name, (rows,) + tuple(spec.full_shape[1:]), spec.std)
    return full


def local_slice(full, partition_dim, rank, world_size):
    if partition_dim is None or world_size == 1:
        return full
    return np.split(full, world_size, axis=partition_dim)[rank]


def initialize_parameters(model, seed):
    """Give every parameter declared in a cell's `param_inits` its seeded value (this rank's slice),
    and every `Dropout` its stream key.

    Names are the cell paths of `model.cells_and_names()` plus the attribute, e.g.
    `decoder.layers.3.mlp.dense_h_to_4h.weight`. Call before the first compiled step: MindSpore
    graphs do not see `set_data` made after they ran, and a dropout key is a graph constant.
    """
    rank, world = get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
    for prefix, cell in model.cells_and_names():
        if isinstance(cell, Dropout):
            cell.stream_key = _stream_key(seed, prefix)
        elif isinstance(cell, nn.Dropout) and cell.p > 0:
            logging.getLogger("rapidgpt").warning(
                f"{prefix or type(model).__name__} is a mindspore.nn.Dropout: its masks come from a "
                "kernel-internal generator, so a resumed run will not repeat them; use "
                "rapidgpt.parallel.Dropout for reproducible dropout")
        for attr, spec in getattr(cell, "param_inits", {}).items():
            param = getattr(cell, attr)
            if param is None:
                continue
            name = f"{prefix}.{attr}" if prefix else attr
            value = local_slice(full_value(spec, seed, name), spec.partition_dim, rank, world)
            param.set_data(Tensor(value, dtype=param.dtype))


# ------------------------------------------------------------------------------------------------
# Dropout
# ------------------------------------------------------------------------------------------------

def _u32(value):
    return Tensor(np.uint32(value))


_SHIFT_16, _SHIFT_15, _ONE = _u32(16), _u32(15), _u32(1)
_MIX_1, _MIX_2, _GOLDEN = _u32(0x7FEB352D), _u32(0x846CA68B), _u32(0x9E3779B9)


def mix32(x):
    """An integer hash of uint32 tensors (the 'lowbias32' xor-shift-multiply finaliser): every
    output bit depends on every input bit; multiplications wrap modulo 2^32."""
    x = ops.bitwise_xor(x, ops.bitwise_right_shift(x, _SHIFT_16)) * _MIX_1
    x = ops.bitwise_xor(x, ops.bitwise_right_shift(x, _SHIFT_15)) * _MIX_2
    return ops.bitwise_xor(x, ops.bitwise_right_shift(x, _SHIFT_16))


def _stream_key(seed, name):
    digest = hashlib.sha256(f"{seed}/dropout/{name}".encode("utf-8")).digest()
    return _u32(int.from_bytes(digest[:4], "little"))


def micro_batch_key(iteration, micro_batch):
    """The dropout key of micro-batch number `micro_batch` (an int: its place in the global batch)
    of training iteration `iteration` (a uint32 scalar tensor): a pure function, traceable."""
    return mix32(ops.bitwise_xor(mix32(iteration), _u32(micro_batch)))


# The key every Dropout reads: graph state written by `set_dropout_key`, not a model parameter
# (nothing to save or optimise). The schedule passes each micro-batch's key explicitly into the
# function that runs its forward (and backward), which sets it first: the key in force is then
# always the one of the micro-batch being computed, also when a schedule interleaves the
# micro-batches (pipeline 1F1B) or recomputes a forward inside the backward.
_DROPOUT_KEY = Parameter(_u32(0), name="rapidgpt_dropout_micro_batch_key", requires_grad=False)


def set_dropout_key(key):
    """Make the Dropout cells draw the masks of `key` (from `micro_batch_key`). Traceable."""
    return ops.assign(_DROPOUT_KEY, key)


def set_micro_batch_key(iteration, micro_batch):
    """`set_dropout_key(micro_batch_key(iteration, micro_batch))`."""
    return set_dropout_key(micro_batch_key(iteration, micro_batch))


_range = ops.Range()


def graph_arange(start, stop, dtype=ms.int32):
    """`ops.arange(start, stop, dtype=dtype)` for Python ints, for use inside compiled graphs.

    Why not ops.arange: inside a graph its argument type check (`builtins.max` over type names)
    runs as interpreted Python (a JIT-fallback node), which MindSpore's analyzer counts as a side
    effect. Every function that calls it is then "side-effecting", and any value such a function
    leaves unused (`a, _ = f()`, `b, s, _ = x.shape`) makes the compile print "Some side effect
    nodes were eliminated by mistake". Range computes in int64 here, as ops.arange does."""
    one = ops.scalar_to_tensor(1, ms.int64)
    values = _range(ops.scalar_to_tensor(start, ms.int64), ops.scalar_to_tensor(stop, ms.int64), one)
    return values if dtype == ms.int64 else values.astype(dtype)


_construction_order = itertools.count()


class Dropout(RoundsToBf16, nn.Cell):
    """Dropout `y = x * keep / (1 - p)` whose keep mask is reproducible across resume and layouts.

    x: any shape `[..., c]`; `partition_dim`: the dimension of x split over tensor-parallel ranks
    (None: x is replicated on them). Mask of the element at FULL-tensor row r (all dimensions but
    the last, flattened) and column c, for stream key k (cell name + seed) and micro-batch key m:

        key = mix32(m ^ k);   h_r = mix32(r * G + key) | 1;   b_c = mix32(c * G + mix32(key)) | 1
        keep = (h_r * b_c mod 2^32) >= round(p * 2^32)

    Only the row and column hashes are full hashes (a vector each); the per-element work is one
    multiply and one compare, as cheap as MindSpore's own dropout kernel on CPU. Both factors are
    odd, so every row is a permutation of the column hashes scaled by a random odd multiplier.
    Identity in eval mode (`set_train(False)`) and for p = 0.
    """

    def __init__(self, p, partition_dim=None):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p
        self.partition_dim = partition_dim
        self.scale = 1.0 / (1.0 - p)
        self.threshold = _u32(min(round(p * 2.0 ** 32), 2 ** 32 - 1))
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        # Replaced by a key of (seed, cell name) in initialize_parameters; until then distinct
        # per cell by construction order.
        self.stream_key = _stream_key(0, f"#{next(_construction_order)}")

    def _split_dim(self, shape):
        """The dimension of x split over tensor-parallel ranks, or None (also when TP is 1)."""
        if self.partition_dim is None or self.tp_size == 1:
            return None
        return self.partition_dim % len(shape)

    def row_ids(self, shape):
        """FULL-tensor row numbers (uint32) of x's rows, shaped `[..., 1]` to broadcast.

        Row-major over all dimensions but the last, counted in the full (unsplit) tensor: one range
        when the rows are not split, else outer * (N * I) + (tp_rank * n + j) * I + inner for a
        split dimension of local size n (full N) with I rows inside it."""
        rank = len(shape)
        split = self._split_dim(shape)
        if split is None or split == rank - 1:
            count = 1
            for size in shape[:-1]:
                count *= size
            self._check_rows(count)
            return graph_arange(0, count, ms.uint32).reshape(shape[:-1] + (1,))
        outer, inner = 1, 1
        for size in shape[:split]:
            outer *= size
        for size in shape[split + 1:-1]:
            inner *= size
        local = shape[split]
        full = local * self.tp_size
        self._check_rows(outer * full * inner)
        start = self.tp_rank * local
        ones = (1,) * (rank - split)
        rows = graph_arange(0, outer, ms.int64).reshape(shape[:split] + ones) * (full * inner)
        rows = rows + (graph_arange(start, start + local, ms.int64) * inner).reshape((local,) + ones[1:])
        if inner > 1:
            rows = rows + graph_arange(0, inner, ms.int64).reshape(shape[split + 1:-1] + (1,))
        return rows.astype(ms.uint32)

    @staticmethod
    def _check_rows(count):
        if count >= 2 ** 31:
            raise ValueError(f"Dropout: a tensor of {count} rows is beyond this implementation's "
                             "2^31 rows")

    def column_ids(self, shape):
        """FULL-tensor column numbers (uint32) of x's last dimension."""
        size = shape[-1]
        start = self.tp_rank * size if self._split_dim(shape) == len(shape) - 1 else 0
        return graph_arange(start, start + size, ms.uint32)

    def keep_mask(self, shape):
        """The boolean keep mask for an x of this (local) shape, under the current micro-batch key."""
        key = mix32(ops.bitwise_xor(_DROPOUT_KEY, self.stream_key))
        row_hash = ops.bitwise_or(mix32(self.row_ids(shape) * _GOLDEN + key), _ONE)
        column_hash = ops.bitwise_or(mix32(self.column_ids(shape) * _GOLDEN + mix32(key)), _ONE)
        return row_hash * column_hash >= self.threshold

    def construct(self, x):
        if not self.training or self.p == 0.0:
            return x
        # A product, as torch's dropout: fusion fuses it forward and backward, where ops.where's
        # gradient needs a zeros tensor per call (~1.5 ms each on the bench model's CPU step). As in
        # torch, a dropped inf/NaN activation stays non-finite (inf * 0), which loss scaling skips.
        return self.rounded(x * (self.keep_mask(x.shape).astype(x.dtype) * self.scale))
