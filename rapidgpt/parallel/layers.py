"""Megatron's tensor-parallel layers (public API for white-box users' own models).

Each layer holds only its rank's shard and declares, in `param_inits`, the full shape and split
dimension of each parameter, so `rapidgpt.parallel.random.initialize_parameters` gives every
layout the same weights. Exchanges between ranks go through the region cells of
`rapidgpt.parallel.mappings`; at tensor-parallel size 1 they are left out and the layers are
plain linear/embedding layers.

Shapes: inputs are `[..., in]` (the GPT uses `[b, s, h]`); weights are `[out, in]` as Megatron's.

ZeRO-3 (rapidgpt/parallel/fully_sharded.py): each layer is a ShardableLayer, naming its
parameters in `weight_names` and computing with `whole_weights()`, which gathers them when they
are sharded.

Emulated bf16 (rapidgpt/emulated_bf16.py): the linear layers round each result a bf16 run holds in
bf16: the product, its sum over the TP ranks, the sum with the bias. A looked-up embedding row is a
parameter's, bf16 already.
"""
from mindspore import Parameter, Tensor, nn, ops
import numpy as np

from rapidgpt.emulated_bf16 import RoundsToBf16
from rapidgpt.parallel.fully_sharded import ShardableLayer
from rapidgpt.parallel.mappings import (CopyToTensorParallelRegion, GatherFromSequenceParallelRegion,
                                       GatherFromTensorParallelRegion, ReduceFromTensorParallelRegion,
                                       ReduceScatterToSequenceParallelRegion, ScatterToTensorParallelRegion)
from rapidgpt.parallel.random import ParamInit
from rapidgpt.parallel.state import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size


def check_tensor_parallel_model(model):
    """With --tensor-model-parallel-size > 1 the model must hold layers of this module: any other
    cell would be computed whole on every rank, with none of the work or memory split."""
    tp = get_tensor_model_parallel_world_size()
    if tp > 1 and not any(getattr(p, "tensor_model_parallel", False) for p in model.get_parameters()):
        raise ValueError(
            f"--tensor-model-parallel-size {tp}: the model ({type(model).__name__}) has no tensor-parallel "
            f"layers, so every rank would compute all of it; build it from rapidgpt.parallel's "
            f"ColumnParallelLinear/RowParallelLinear/VocabParallelEmbedding, or use "
            f"--tensor-model-parallel-size 1 (data parallelism works with any model)")


def divide(numerator, denominator, what="size"):
    if numerator % denominator:
        raise ValueError(f"{what} {numerator} is not divisible by tensor-parallel size {denominator}")
    return numerator // denominator


def _zeros(shape, name, sharded):
    """A zero fp32 parameter; `sharded`: each TP rank holds a different part of it (Megatron's
    `param.tensor_model_parallel`, read by the grad-norm and the checkpoint code)."""
    param = Parameter(Tensor(np.zeros(shape, np.float32)), name=name)
    param.tensor_model_parallel = sharded
    return param


class _ParallelLinear(ShardableLayer, RoundsToBf16, nn.Cell):
    """`y = x W^T + b` on the last dimension, W `[out_local, in_local]`; with `stacked` = k > 1
    (column-parallel only) W is `[k, out / k, in]`, k matrices split along their rows together, so
    each rank's output is its rows of every one: `[..., k * out / (k * tp)]`, k blocks in order."""

    def __init__(self, input_size, output_size, bias, init_std, partition_dim, drawn_rows=None, stacked=1):
        super().__init__()
        tp = get_tensor_model_parallel_world_size()
        self.input_size, self.output_size = input_size, output_size
        out_local = divide(output_size, tp, "output size") if partition_dim == 0 else output_size
        in_local = divide(input_size, tp, "input size") if partition_dim == 1 else input_size
        lead = (stacked,) if stacked > 1 else ()           # [k, rows, in]: split along the rows
        rows = divide(out_local, stacked, "output size") if stacked > 1 else out_local
        split = partition_dim + len(lead) if partition_dim is not None else None
        self.weight = _zeros(lead + (rows, in_local), "weight", partition_dim is not None)
        self.bias = _zeros(lead + ((rows,) if partition_dim == 0 else (output_size,)), "bias",
                           partition_dim == 0) if bias else None
        full_rows = output_size // stacked
        self.param_inits = {"weight": ParamInit(init_std, lead + (full_rows, input_size), split, drawn_rows)}
        if bias:
            column = partition_dim == 0          # a vocabulary-sized output keeps its padding mark
            self.param_inits["bias"] = ParamInit(0.0, lead + (full_rows,), len(lead) if column else None,
                                                 drawn_rows if column else None)
        self.stacked = stacked
        self.weight_names = ("weight", "bias") if bias else ("weight",)
        self.matmul = ops.MatMul(transpose_b=True)
        self.tp = tp

    def weight_and_bias(self):
        """(weight `[out_local, in_local]`, bias `[out_local]` or None), gathered under ZeRO-3 (stacked
        matrices as one, their blocks in order)."""
        weights = self.whole_weights()
        weight, bias = weights[0], weights[1] if len(weights) > 1 else None
        if self.stacked > 1:
            weight = weight.reshape(-1, weight.shape[-1])
            bias = None if bias is None else bias.reshape(-1)
        return weight, bias

    def local_linear(self, x, weight):
        """`x W_local^T` without the bias, on the last dimension."""
        shape = x.shape
        y = self.rounded(self.matmul(x.reshape(-1, shape[-1]), weight))
        return y.reshape(shape[:-1] + (y.shape[-1],))

    def construct(self, x):
        weight, bias = self.weight_and_bias()
        y = self.local_linear(x, weight)
        return y if bias is None else self.rounded(y + bias)


class ColumnParallelLinear(_ParallelLinear):
    """Linear layer with W split along its output rows: `[..., in] -> [..., out / tp]`
    (`[..., out]` with `gather_output=True`).

    Used where the output feeds a per-shard computation (QKV projection, MLP up-projection). The
    input is replicated over the TP ranks; its gradient is summed over them. With
    `sequence_parallel` the input is `[b, s / tp, h]`, this rank's part of the sequence, all-gathered
    here (its gradient reduce-scattered back).
    """

    def __init__(self, input_size, output_size, bias=True, init_std=0.02, drawn_rows=None,
                 gather_output=False, stacked=1, sequence_parallel=False):
        super().__init__(input_size, output_size, bias, init_std, partition_dim=0, drawn_rows=drawn_rows,
                         stacked=stacked)
        self.gather_output = gather_output and self.tp > 1
        if self.tp > 1:
            self.copy_to_region = (GatherFromSequenceParallelRegion() if sequence_parallel
                                   else CopyToTensorParallelRegion())
            self.gather_from_region = GatherFromTensorParallelRegion()

    def construct(self, x):
        weight, bias = self.weight_and_bias()
        if self.tp > 1:
            x = self.copy_to_region(x)
        y = self.local_linear(x, weight)
        if bias is not None:
            y = self.rounded(y + bias)
        return self.gather_from_region(y) if self.gather_output else y


class RowParallelLinear(_ParallelLinear):
    """Linear layer with W split along its input columns: `[..., in / tp] -> [..., out]`.

    Takes a ColumnParallelLinear's sharded output (`input_is_parallel=True`; otherwise the full
    input is split here); partial products are summed over TP ranks before the (replicated) bias
    is added. With `sequence_parallel` the sum is reduce-scattered along the sequence, so the output
    is `[b, s / tp, h]`, and the bias, added to this rank's part only, gets its gradient summed
    over the TP ranks.
    """

    def __init__(self, input_size, output_size, bias=True, init_std=0.02, input_is_parallel=True,
                 sequence_parallel=False):
        super().__init__(input_size, output_size, bias, init_std, partition_dim=1)
        self.scatter_input = not input_is_parallel and self.tp > 1
        self.sequence_parallel = sequence_parallel and self.tp > 1
        if self.tp > 1:
            self.scatter_to_region = ScatterToTensorParallelRegion()
            self.reduce_from_region = (ReduceScatterToSequenceParallelRegion() if self.sequence_parallel
                                       else ReduceFromTensorParallelRegion())
        if self.sequence_parallel and bias:
            self.copy_bias = CopyToTensorParallelRegion()

    def construct(self, x):
        weight, bias = self.weight_and_bias()
        if self.scatter_input:
            x = self.scatter_to_region(x)
        y = self.local_linear(x, weight)
        if self.tp > 1:
            y = self.rounded(self.reduce_from_region(y))
        if bias is None:
            return y
        return self.rounded(y + (self.copy_bias(bias) if self.sequence_parallel else bias))


class ReplicatedLinear(_ParallelLinear):
    """Linear layer kept whole on every TP rank: `[..., in] -> [..., out]` (small heads, e.g. a
    classifier's, whose output every rank needs). `summed_over_tp`: each rank computes it on a part
    of the data (its part of the sequence, with --sequence-parallel), so the weights' gradients are
    summed over the TP ranks, as a sequence-parallel norm's (Megatron's `sequence_parallel` weights)."""

    def __init__(self, input_size, output_size, bias=True, init_std=0.02, summed_over_tp=False):
        super().__init__(input_size, output_size, bias, init_std, partition_dim=None)
        self.summed_over_tp = summed_over_tp and self.tp > 1
        if self.summed_over_tp:
            self.copy_to_region = CopyToTensorParallelRegion()

    def weight_and_bias(self):
        weight, bias = super().weight_and_bias()
        if self.summed_over_tp:
            weight = self.copy_to_region(weight)
            bias = None if bias is None else self.copy_to_region(bias)
        return weight, bias


class ReplicatedEmbedding(ShardableLayer, nn.Cell):
    """A small table `[rows, h]` kept whole on every TP rank (learned positions, token types):
    ids `[...]` -> `[..., h]`."""

    def __init__(self, num_embeddings, embedding_dim, init_std=0.02):
        super().__init__()
        self.weight = _zeros((num_embeddings, embedding_dim), "weight", False)
        self.param_inits = {"weight": ParamInit(init_std, (num_embeddings, embedding_dim))}
        self.weight_names = ("weight",)

    def construct(self, ids):
        return ops.gather(self.whole_weights()[0], ids, 0)


class VocabParallelEmbedding(ShardableLayer, nn.Cell):
    """Embedding table `[vocab, h]` split along the vocabulary over TP ranks: ids `[...]` -> `[..., h]`.

    `num_embeddings` is the padded vocabulary; only the first `real_vocab_size` rows are drawn.
    """

    def __init__(self, num_embeddings, embedding_dim, init_std=0.02, real_vocab_size=None):
        super().__init__()
        self.tp = get_tensor_model_parallel_world_size()
        self.num_embeddings = num_embeddings
        rows = divide(num_embeddings, self.tp, "padded vocabulary")
        self.vocab_start = get_tensor_model_parallel_rank() * rows     # this rank's rows [start, start + rows)
        self.weight = _zeros((rows, embedding_dim), "weight", True)
        self.param_inits = {"weight": ParamInit(init_std, (num_embeddings, embedding_dim), 0,
                                                real_vocab_size)}
        if self.tp > 1:
            self.reduce_from_region = ReduceFromTensorParallelRegion()
        self.weight_names = ("weight",)

    def construct(self, ids):
        weight = self.whole_weights()[0]
        if self.tp == 1:
            return ops.gather(weight, ids, 0)
        # Ids of other ranks' rows look up row 0 and are zeroed; the sum over ranks then holds
        # each id's row exactly once.
        local = ids - self.vocab_start
        mine = ops.logical_and(local >= 0, local < weight.shape[0])
        rows = ops.gather(weight, ops.where(mine, local, 0), 0)
        rows = rows * ops.expand_dims(mine, -1).astype(rows.dtype)
        return self.reduce_from_region(rows)
