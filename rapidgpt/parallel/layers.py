"""Megatron's tensor-parallel layers (public API for white-box users' own models).

Each layer holds only its rank's shard and declares, in `param_inits`, the full shape and split
dimension of each parameter, so `rapidgpt.parallel.random.initialize_parameters` can give every
layout the same weights. At tensor-parallel size 1 (this build) a shard is the whole tensor and
the layers are plain linear/embedding layers; the cross-rank exchanges join with the distributed
release.

Shapes: inputs are `[..., in]` (the GPT uses `[b, s, h]`); weights are `[out, in]` as Megatron's.
"""
from mindspore import Parameter, Tensor, nn, ops
import numpy as np

from rapidgpt.parallel.random import ParamInit
from rapidgpt.parallel.state import get_tensor_model_parallel_world_size


def divide(numerator, denominator, what="size"):
    if numerator % denominator:
        raise ValueError(f"{what} {numerator} is not divisible by tensor-parallel size {denominator}")
    return numerator // denominator


def _zeros(shape, name):
    return Parameter(Tensor(np.zeros(shape, np.float32)), name=name)


class _ParallelLinear(nn.Cell):
    """`y = x W^T + b` on the last dimension, W `[out_local, in_local]`."""

    def __init__(self, input_size, output_size, bias, init_std, partition_dim, drawn_rows=None):
        super().__init__()
        tp = get_tensor_model_parallel_world_size()
        self.input_size, self.output_size = input_size, output_size
        out_local = divide(output_size, tp, "output size") if partition_dim == 0 else output_size
        in_local = divide(input_size, tp, "input size") if partition_dim == 1 else input_size
        self.weight = _zeros((out_local, in_local), "weight")
        self.bias = _zeros((out_local if partition_dim == 0 else output_size,), "bias") if bias else None
        self.param_inits = {"weight": ParamInit(init_std, (output_size, input_size), partition_dim, drawn_rows)}
        if bias:
            self.param_inits["bias"] = ParamInit(0.0, (output_size,), 0 if partition_dim == 0 else None)
        self.matmul = ops.MatMul(transpose_b=True)

    def construct(self, x):
        shape = x.shape
        y = self.matmul(x.reshape(-1, shape[-1]), self.weight)
        y = y.reshape(shape[:-1] + (y.shape[-1],))
        return y if self.bias is None else y + self.bias


class ColumnParallelLinear(_ParallelLinear):
    """Linear layer with W split along its output rows: `[..., in] -> [..., out / tp]`.

    Used where the output feeds a per-shard computation (QKV projection, MLP up-projection).
    """

    def __init__(self, input_size, output_size, bias=True, init_std=0.02, drawn_rows=None):
        super().__init__(input_size, output_size, bias, init_std, partition_dim=0, drawn_rows=drawn_rows)


class RowParallelLinear(_ParallelLinear):
    """Linear layer with W split along its input columns: `[..., in / tp] -> [..., out]`.

    Takes a ColumnParallelLinear's sharded output; partial products are summed over TP ranks
    before the (replicated) bias is added.
    """

    def __init__(self, input_size, output_size, bias=True, init_std=0.02):
        super().__init__(input_size, output_size, bias, init_std, partition_dim=1)


class ReplicatedLinear(_ParallelLinear):
    """Linear layer kept whole on every TP rank: `[..., in] -> [..., out]` (small heads, e.g. a
    classifier's, whose output every rank needs)."""

    def __init__(self, input_size, output_size, bias=True, init_std=0.02):
        super().__init__(input_size, output_size, bias, init_std, partition_dim=None)


class VocabParallelEmbedding(nn.Cell):
    """Embedding table `[vocab, h]` split along the vocabulary over TP ranks: ids `[...]` -> `[..., h]`.

    `num_embeddings` is the padded vocabulary; only the first `real_vocab_size` rows are drawn.
    """

    def __init__(self, num_embeddings, embedding_dim, init_std=0.02, real_vocab_size=None):
        super().__init__()
        tp = get_tensor_model_parallel_world_size()
        self.num_embeddings = num_embeddings
        self.weight = _zeros((divide(num_embeddings, tp, "padded vocabulary"), embedding_dim), "weight")
        self.param_inits = {"weight": ParamInit(init_std, (num_embeddings, embedding_dim), 0,
                                                real_vocab_size)}

    def construct(self, ids):
        return ops.gather(self.weight, ids, 0)
