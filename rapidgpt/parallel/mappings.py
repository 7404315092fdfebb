"""Megatron's tensor-parallel region boundaries, as differentiable cells (custom bprop).

Each is the identity at tensor-parallel size 1. `x` is `[..., d]`; "split" and "gather" act on
the last dimension, which is where a ColumnParallelLinear's output is sharded.

    cell                          forward                     backward
    CopyToTensorParallelRegion    identity                    all-reduce (sum) over TP
    ReduceFromTensorParallelRegion all-reduce (sum) over TP   identity
    ScatterToTensorParallelRegion keep this rank's d/tp slice all-gather along d
    GatherFromTensorParallelRegion all-gather along d         keep this rank's slice

Why the pairs: a ColumnParallelLinear consumes a replicated input, so each rank's input gradient
is only its shard's contribution and they must be summed (copy's backward); a RowParallelLinear
produces partial sums that must be summed in the forward (reduce's forward), after which the
gradient is already replicated.

Sequence parallelism (--sequence-parallel, Megatron's): between the tensor-parallel layers the
hidden states `[b, s, h]` are split along the sequence, `[b, s / tp, h]` on each rank; the
boundaries act on dimension 1:

    ScatterToSequenceParallelRegion   keep this rank's s/tp slice  all-gather along s
    GatherFromSequenceParallelRegion  all-gather along s           reduce-scatter along s (the
                                                                   input of a ColumnParallelLinear:
                                                                   partial gradients), or keep the
                                                                   slice (`reduce_grad=False`: the
                                                                   gradient is already whole)
    ReduceScatterToSequenceParallelRegion reduce-scatter along s    all-gather along s (the output
                                                                   of a RowParallelLinear)
"""
from mindspore import nn, ops

from rapidgpt.parallel import comm
from rapidgpt.parallel.state import get_tensor_model_parallel_group


class _TensorParallelRegion(nn.Cell):
    def __init__(self, group=None):
        super().__init__()
        group = get_tensor_model_parallel_group() if group is None else group
        self.size, self.rank = comm.group_size(group), comm.group_rank(group)
        self.all_reduce = comm.AllReduce(group)
        self.all_gather = comm.AllGather(group, axis=-1)

    def split(self, x):
        return ops.chunk(x, self.size, -1)[self.rank] if self.size > 1 else x


class CopyToTensorParallelRegion(_TensorParallelRegion):
    def construct(self, x):
        # The identity, written so that MindSpore cannot fold it into x: returned as is (or as
        # a no-op reshape/cast/identity), and with the dropout key's assign inside the
        # differentiated function, MindSpore 2.10 handed this bprop the gradient of every use of
        # x, e.g. also BERT's residual branch (input gradients summed over TP twice; measured).
        # Only the bprop's gradient reaches x, so stop_gradient changes nothing else.
        return ops.stop_gradient(x)

    def bprop(self, x, out, dout):
        return (self.all_reduce(dout),)


class ReduceFromTensorParallelRegion(_TensorParallelRegion):
    def construct(self, x):
        return self.all_reduce(x)

    def bprop(self, x, out, dout):
        return (dout,)


class ScatterToTensorParallelRegion(_TensorParallelRegion):
    def construct(self, x):
        return self.split(x)

    def bprop(self, x, out, dout):
        return (self.all_gather(dout),)


class GatherFromTensorParallelRegion(_TensorParallelRegion):
    def construct(self, x):
        return self.all_gather(x)

    def bprop(self, x, out, dout):
        return (self.split(dout),)


class _SequenceParallelRegion(nn.Cell):
    """The tensor-parallel group's collectives along the sequence dimension (1) of `[b, s, h]`."""

    def __init__(self):
        super().__init__()
        group = get_tensor_model_parallel_group()
        self.size, self.rank = comm.group_size(group), comm.group_rank(group)
        self.all_gather = comm.AllGather(group, axis=1)
        self.reduce_scatter = comm.ReduceScatter(group, axis=1)

    def split(self, x):
        return ops.chunk(x, self.size, 1)[self.rank] if self.size > 1 else x


class ScatterToSequenceParallelRegion(_SequenceParallelRegion):
    def construct(self, x):
        return self.split(x)

    def bprop(self, x, out, dout):
        return (self.all_gather(dout),)


class GatherFromSequenceParallelRegion(_SequenceParallelRegion):
    def __init__(self, reduce_grad=True):
        super().__init__()
        self.reduce_grad = reduce_grad

    def construct(self, x):
        return self.all_gather(x)

    def bprop(self, x, out, dout):
        return (self.reduce_scatter(dout) if self.reduce_grad else self.split(dout),)


class ReduceScatterToSequenceParallelRegion(_SequenceParallelRegion):
    def construct(self, x):
        return self.reduce_scatter(x)

    def bprop(self, x, out, dout):
        return (self.all_gather(dout),)
