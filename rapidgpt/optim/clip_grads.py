"""Gradient clipping by global L2 norm (Megatron's clip_grad_norm_fp32), as pure functions.

They take and return tuples of Tensors and branch on no tensor value, so they run unchanged in
PyNative and inside an `ms.jit` step.

With tensor parallelism each rank holds a shard of the sharded parameters: the caller passes the
gradients this rank counts (its shards, and the replicated ones on one rank only) and the
all-reduce that adds the partial sums of squares over the TP group before the square root.
"""
import mindspore as ms
from mindspore import ops


def _sum_of_squares(g):
    g = ops.square(ops.cast(g, ms.float32))
    if g.ndim > 1:
        # Two stages: a full reduction of a >1-D tensor is several times slower on MindSpore's
        # CPU backend than reducing the last axis first (measured in benchmarks/bench_pretrain.py).
        g = ops.sum(g, -1)
    return ops.sum(g)


def global_grad_norm(grads, sum_over_ranks=None):
    """L2 norm over all gradients together, accumulated in fp32 (fp16 squares overflow);
    `sum_over_ranks` (a rapidgpt.parallel.comm.AllReduce) adds other ranks' sums of squares.

    It is non-finite whenever some gradient holds a NaN/Inf, so it doubles as the finite check
    of the step (no second pass over the gradients).
    """
    # No gradients: a rank whose ZeRO-2 pieces are all of parameters another rank counts.
    squares = ops.addn([_sum_of_squares(g) for g in grads]) if grads else ops.zeros((), ms.float32)
    return ops.sqrt(squares if sum_over_ranks is None else sum_over_ranks(squares))


def clip_grads_by_global_norm(grads, max_norm, norm=None):
    """Scale all gradients by `max_norm / (norm + 1e-6)` when that is below 1; returns (grads, norm).

    `max_norm` is the `--clip-grad` value, a Python number: <= 0 disables clipping (the norm is
    still computed, for logging). `norm` may be passed if already computed. The scale is
    `min(coeff, 1)`, applied unconditionally: multiplying by exactly 1.0 leaves a gradient
    bit-identical, and it avoids a data-dependent branch in the compiled graph.
    """
    if norm is None:
        norm = global_grad_norm(grads)
    if max_norm <= 0:
        return grads, norm
    coeff = ops.minimum(max_norm / (norm + 1e-6), 1.0)
    return tuple(g * ops.cast(coeff, g.dtype) for g in grads), norm
