"""Seeded, layout-independent parameter initialisation.

Every parameter's FULL tensor (as it would be on one process) is drawn from a generator seeded
by (`--seed`, the parameter's global name), and each rank keeps its own slice. The weights
therefore do not depend on how the model is split over tensor or pipeline ranks, nor on the order
in which layers are built: a TP/PP run starts from exactly the single-process model.
"""
import hashlib
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
from mindspore import Tensor

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
    """Give every parameter declared in a cell's `param_inits` its seeded value (this rank's slice).

    Names are the cell paths of `model.cells_and_names()` plus the attribute, e.g.
    `decoder.layers.3.mlp.dense_h_to_4h.weight`. Call before the first compiled step: MindSpore
    graphs do not see `set_data` made after they ran.
    """
    rank, world = get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
    for prefix, cell in model.cells_and_names():
        for attr, spec in getattr(cell, "param_inits", {}).items():
            param = getattr(cell, attr)
            if param is None:
                continue
            name = f"{prefix}.{attr}" if prefix else attr
            value = local_slice(full_value(spec, seed, name), spec.partition_dim, rank, world)
            param.set_data(Tensor(value, dtype=param.dtype))
