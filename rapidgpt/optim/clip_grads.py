"""Gradient clipping by global L2 norm (Megatron's clip_grad_norm_fp32), as pure functions.

They take and return tuples of Tensors and branch on no tensor value, so they run unchanged in
PyNative and inside an `ms.jit` step.

With tensor parallelism each rank holds a shard of the sharded parameters: the caller passes the
gradients this rank counts (its shards, and the replicated ones on one rank only) and the
all-reduce that adds the partial sums of squares over the TP group before the square root.
"""
import mindspore as ms
from mindspore import Tensor, ops

from rapidgpt.tensor_tuples import map_tensors


def _sum_of_squares(counted, g):
    """g's sum of squares in fp32, or 0 when this rank does not count it (`counted` a Python bool)."""
    if not counted:
        return ops.zeros((), ms.float32)
    g = ops.square(ops.cast(g, ms.float32))
    if g.ndim > 1:
        # Two stages: a full reduction of a >1-D tensor is several times slower on MindSpore's
        # CPU backend than reducing the last axis first (measured in benchmarks/bench_pretrain.py).
        g = ops.sum(g, -1)
    return ops.sum(g)


def _total(fn, tensors, counted, dtype):
    """The sum over `tensors` of `fn(counted_i, tensor_i)` (a scalar of `dtype`; 0 where not counted).
    A left-out tensor adds a constant 0, which the compiler drops; MindSpore's CPU AddN refuses
    fewer than 2 inputs, so a rank counting none or one (ZeRO-2 pieces) adds nothing."""
    number = counted.count(True)
    if number == 0:
        return ops.zeros((), dtype)
    if number == 1:
        return fn(True, tensors[counted.index(True)])
    return ops.addn(map_tensors(fn, counted, tensors))


def global_grad_norm(grads, sum_over_ranks=None, counted=None):
    """L2 norm over all gradients together, accumulated in fp32 (fp16 squares overflow);
    `counted` (Python bools, one per gradient; default all) leaves out the ones another rank
    counts, `sum_over_ranks` (a rapidgpt.parallel.comm.AllReduce) adds other ranks' sums of squares.

    It is non-finite whenever some gradient holds a NaN/Inf, so it doubles as the finite check
    of the step (no second pass over the gradients).
    """
    counted = counted if counted is not None else (True,) * len(grads)
    squares = _total(_sum_of_squares, grads, counted, ms.float32)
    return ops.sqrt(squares if sum_over_ranks is None else sum_over_ranks(squares))


def _zeros_in(g):
    """The number of g's elements equal to 0, exactly (int64: MindSpore's graph mode sums int32 into
    int64, PyNative into int32, so the dtype is set)."""
    return ops.cast(ops.sum(ops.cast(ops.equal(g, 0), ms.int32)), ms.int64)


def _statistic(fn, tensors, counted, dtype):
    """The sum over `tensors` of `fn(tensor_i)` where `counted_i` (a scalar of `dtype`), every term
    computed on every rank and the left-out ones multiplied by 0, so that the graph is the same on
    the ranks of a tensor-parallel group, which differ in `counted` only. Not `_total`'s pruned sum:
    with it, a TP=2 full-recompute run logging both statistics computed another step from its first
    iteration on (MindSpore 2.10, CPU: loss 8.329145 instead of 8.329035, grad norm 13.3 instead of
    1.34), also with the statistics' all-reduces removed; with the same graph on both ranks it prints
    the run without recompute (tests/test_parallel.py). The cause inside MindSpore was not found."""
    if not tensors:
        return ops.zeros((), dtype)
    terms = ops.stack(map_tensors(fn, tensors))
    return ops.sum(terms * Tensor(counted, dtype))


def _sum_statistic(value, sum_over_ranks, after):
    """`value` added over the ranks, once `after` is computed (a statistic's all-reduce waits for the
    one before it: two all-reduces on one group that no data orders may run at once in MindSpore's
    graph, and then exchange each other's data, as rapidgpt/optim/mixed_precision.py notes)."""
    if sum_over_ranks is None:
        return value
    return sum_over_ranks(value if after is None else ops.depend(value, after))


def count_zeros(grads, sum_over_ranks=None, counted=None):
    """Megatron's count_zeros_fp32 (--log-num-zeros-in-grad): the number of gradient elements equal
    to 0 over the whole model, each element counted once as in `global_grad_norm` (same `counted`
    and `sum_over_ranks`). Counted exactly per rank; the ranks' counts are added in fp32, as
    Megatron's all-reduce of the statistic does."""
    counted = counted if counted is not None else (True,) * len(grads)
    zeros = ops.cast(_statistic(_zeros_in, grads, counted, ms.int64), ms.float32)
    return _sum_statistic(zeros, sum_over_ranks, None)


def params_norm(params, sum_over_ranks=None, counted=None, after=None):
    """Megatron's calc_params_l2_norm (--log-params-norm): the L2 norm of `params` in fp32, each
    element counted once over the ranks (`counted`, `sum_over_ranks` as in `global_grad_norm`); its
    all-reduce runs after `after` is computed (the zero count's, when both are logged)."""
    counted = counted if counted is not None else (True,) * len(params)
    squares = _statistic(ops.partial(_sum_of_squares, True), params, counted, ms.float32)
    return ops.sqrt(_sum_statistic(squares, sum_over_ranks, after))


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
    return map_tensors(ops.partial(_scaled, coeff), grads), norm


def _scaled(coeff, g):
    return g * ops.cast(coeff, g.dtype)
