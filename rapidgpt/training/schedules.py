"""Schedules: how one optimizer step's micro-batches run forward and backward (Megatron's
forward_backward_func). A schedule produces the step's loss and gradients; the optimizer wrapper
(rapidgpt/optim/mixed_precision.py) consumes them.

The micro-batches of a step arrive stacked, a dict (or tuple) of tensors `[num_micro, ...]`;
`forward(micro_batch)` is the user's forward hook, returning a loss (or Megatron's
`(output, loss_fn)`, whose loss_fn may return `(loss, {name: value})`: those statistics, e.g.
BERT's "lm loss" and "sop loss", are averaged as the loss is and logged instead of it).

Per-token loss (--calculate-per-token-loss, Megatron's): the loss function returns Megatron's
`(loss summed over its tokens, number of tokens)` (optionally with the statistics dict, summed the
same way). Without the flag such a loss is that micro-batch's mean (sum / tokens), averaged over
the micro-batches and data-parallel ranks as any loss; with it the step's gradient is the gradient
of the sum of every token's loss over all micro-batches and data-parallel ranks, divided by the
number of those tokens (`per_token_finalize`), and the logged loss is that per-token mean: the
result no longer depends on how tokens fall into micro-batches and ranks.
"""
import mindspore as ms
import numpy as np
from mindspore import ParameterTuple, Tensor, nn, ops

from rapidgpt.emulated_bf16 import round_to_bf16
from rapidgpt.parallel import comm
from rapidgpt.parallel.data_parallel import REDUCED_IN_BACKWARD, GradientShardReducer, GradientSummer
from rapidgpt.parallel.random import micro_batch_key, set_dropout_key
from rapidgpt.parallel.state import get_data_parallel_group, get_data_parallel_rank, get_data_parallel_world_size
from rapidgpt.tensor_tuples import map_tensors, to_fp32


def loss_and_stats(output, per_token=False):
    """A forward hook's result as `(loss, tokens, stats)` in fp32: `loss`, `(output, loss_fn)` as
    Megatron's forward_step returns, and a loss_fn returning `loss`, `(loss, {name: scalar})`
    (Megatron's logged statistics; `stats` is empty without them), or Megatron's per-token
    `(loss sum, tokens)` / `(loss sum, tokens, {name: sum})` are all accepted. `per_token`
    (--calculate-per-token-loss): `loss` and `stats` are sums and `tokens` their count; else they
    are means and `tokens` is None."""
    stats, tokens = {}, None
    if isinstance(output, tuple):
        output = output[1](output[0])
        if isinstance(output, tuple):
            stats = output[-1] if isinstance(output[-1], dict) else {}
            values = output[:-1] if isinstance(output[-1], dict) else output
            output, tokens = values[0], values[1] if len(values) > 1 else None
    loss = ops.cast(output, ms.float32)
    stats = {name: ops.cast(value, ms.float32).reshape(()) for name, value in stats.items()}
    if per_token:
        if tokens is None:
            raise ValueError("--calculate-per-token-loss: the loss function must return (loss summed over "
                             "its tokens, number of tokens)")
        return loss, ops.cast(tokens, ms.float32).reshape(()), stats
    if tokens is not None:
        tokens = ops.cast(tokens, ms.float32)
        return loss / tokens, None, {name: value / tokens for name, value in stats.items()}
    return loss, None, stats


def add_stats(total, values):
    """Statistics' values (tuples in the names' order) summed (`total` None: the first micro-batch's)."""
    return values if total is None else tuple(a + b for a, b in zip(total, values))


def stacked_losses(loss, values):
    """`[1 + k]`: the loss and its k statistics' values in one vector, reduced over ranks together."""
    return ops.stack((loss,) + tuple(values))


def unstacked_losses(stacked, names):
    """`stacked_losses`' inverse: (loss, {name: value}) for the statistics' `names` (any iterable
    of them in order, e.g. the statistics' dict)."""
    named, i = {}, 1
    for name in names:
        named[name] = stacked[i]
        i += 1
    return stacked[0], named


@ops.constexpr
def encode_names(names):
    """The statistics' names (a tuple of str, a graph constant) as a constant uint8 tensor, for the
    step graph to return (`decode_names` reads it). Why not the names themselves: MindSpore 2.10's
    graph cache cannot keep a graph that returns them (a dict built in the graph is a
    Python-fallback node, which does not export; returned strings export but do not load back).
    The leading '#' keeps the tensor non-empty when there are no statistics."""
    return Tensor(np.frombuffer(("#" + "\n".join(names)).encode("utf-8"), np.uint8))


def decode_names(code):
    """`encode_names`' inverse, on the host: the list of names."""
    text = code.asnumpy().tobytes().decode("utf-8")[1:]
    return text.split("\n") if text else []


def select_micro_batch(stacked, i):
    if isinstance(stacked, dict):
        return {key: value[i] for key, value in stacked.items()}
    return tuple(value[i] for value in stacked)


# The per-step bookkeeping every schedule shares (with and without pipelining).

def loss_multiplier(loss_scale, num_micro_batches, dp_size, per_token=False):
    """What each micro-batch's loss is multiplied by before its backward: loss_scale / (n * dp).
    (Megatron divides the loss by n before the backward and its DDP scales the gradients by 1/dp,
    so the sum over DP ranks is the mean and fp16 overflows at the same loss scale in every
    layout.) With `per_token` the loss scale alone: the gradients are divided by the step's
    tokens after the data-parallel sum (`per_token_finalize`)."""
    divisor = 1 if per_token else num_micro_batches * dp_size
    return 1.0 / divisor if loss_scale is None else loss_scale / divisor


def micro_batch_dropout_key(iteration, i, dp_size, dp_rank):
    """Micro-batch i's dropout key: from its place in the global batch, i * dp + dp_rank, as
    Megatron's sampler deals micro-batches to the DP ranks (the masks do not depend on the layout)."""
    return micro_batch_key(iteration, i * dp_size + dp_rank)


def casts_to_fp32(params, accumulate_in_fp32):
    """Whether gradients are cast before they are accumulated: in fp32 when `accumulate_in_fp32`
    (fp32 and bf16 models; fp16 with --accumulate-allreduce-grads-in-fp32), fp32 ones need no cast
    (a copy per parameter and micro-batch otherwise)."""
    return accumulate_in_fp32 and any(p.dtype != ms.float32 for p in params)


def rounds_to_bf16(params, accumulate_in_fp32):
    """Whether gradients are rounded to bf16 values as they are summed: an emulated bf16 model
    (rapidgpt/emulated_bf16.py) with --grad-reduce-in-bf16, whose bf16 run sums the micro-batches'
    gradients and reduces them over the data-parallel ranks in a bf16 buffer."""
    return not accumulate_in_fp32 and any(getattr(p, "emulated_bf16", False) for p in params)


def accumulate(grads, micro_grads, cast_to_fp32, round_bf16=False):
    """`grads + micro_grads` (tuples in params order; `grads` None for the first micro-batch);
    with `round_bf16` each micro-batch's gradients and each sum rounded to bf16 values."""
    if cast_to_fp32:
        micro_grads = map_tensors(to_fp32, micro_grads)
    if round_bf16:
        micro_grads = map_tensors(round_to_bf16, micro_grads)
    if grads is None:
        return micro_grads
    total = map_tensors(ops.add, grads, micro_grads)
    return map_tensors(round_to_bf16, total) if round_bf16 else total


def _itemsize(dtype):
    return ms.Tensor(0, dtype).itemsize


def gradient_dtype(params, cast_to_fp32):
    """The dtype of the step's accumulated gradients (fp32 when cast, or when the parameters'
    dtypes differ and the gradients must share one flat buffer)."""
    dtypes = {p.dtype for p in params}
    return ms.float32 if cast_to_fp32 or len(dtypes) > 1 else dtypes.pop()


def _times(factor, grad):
    return grad * factor.astype(grad.dtype)


def per_token_finalize(values, grads, dp_size):
    """--calculate-per-token-loss, after DataParallelFinalize: `values` `[1 + 1 + k]` are the loss
    sum, the token count and k statistics' sums, each averaged over the data-parallel ranks, and
    `grads` the gradients of the loss sums, summed over them -> (`[1 + k]` per-token means, the
    gradients divided by the tokens of every rank: Megatron's finalize_model_grads with num_tokens)."""
    tokens = values[1]
    means = ops.cat((values[:1], values[2:])) / tokens
    return means, map_tensors(ops.partial(_times, 1.0 / (tokens * dp_size)), grads)


class DataParallelFinalize(nn.Cell):
    """Megatron's finalize_model_grads over the data-parallel ranks: `(losses, grads) -> (losses
    averaged, grads summed)` (`losses`: the loss, or the loss and its statistics stacked) (flat buckets, rapidgpt/parallel/data_parallel.py). With a
    `gradient_layout` (a ShardPlan: the optimizer wrapper keeps gradient shards, ZeRO-2) the sum
    is reduce-scattered and `grads` come back as this rank's pieces of it; REDUCED_IN_BACKWARD
    (ZeRO-3) leaves the gradients as they are. `round_bf16`: the reduced gradients rounded to bf16
    values (`rounds_to_bf16`). `gradient_bytes`: the bytes of the gradients it hands the optimizer."""

    def __init__(self, params, cast_to_fp32, gradient_layout=None, round_bf16=False):
        super().__init__(auto_prefix=False)
        self.round_bf16 = round_bf16
        self.dp_size = get_data_parallel_world_size()
        self.reduces_grads = gradient_layout is not REDUCED_IN_BACKWARD
        self.sharded = self.reduces_grads and gradient_layout is not None
        dtype = gradient_dtype(params, cast_to_fp32)
        group = get_data_parallel_group()
        if self.sharded:
            self.sum_over_dp = GradientShardReducer(gradient_layout, group, dtype)
            self.gradient_bytes = (gradient_layout.shard - gradient_layout.padding) * _itemsize(dtype)
        else:
            self.sum_over_dp = GradientSummer(params, group) if self.reduces_grads else None
            self.gradient_bytes = sum(int(p.size) * _itemsize(ms.float32 if cast_to_fp32 else p.dtype)
                                      for p in params)
        self.dp_sum = comm.AllReduce(group)

    def construct(self, loss, grads):
        if self.dp_size == 1:
            return loss, self.sum_over_dp(grads) if self.sharded else grads
        if self.reduces_grads:
            grads = self.sum_over_dp(grads)
            if self.round_bf16:
                grads = map_tensors(round_to_bf16, grads)
        return self.dp_sum(loss) / self.dp_size, grads


class ForwardBackwardNoPipelining(nn.Cell):
    """Megatron's forward_backward_no_pipelining, unrolled into the compiled step.

    For micro-batch i of n (`micro_batch_dropout_key` selects its dropout masks):

        loss_i  = the hook's loss, in fp32
        grads  += d(loss_i * loss_multiplier) / d(params)

    accumulated as `accumulate` says; then `DataParallelFinalize`: gradients summed over the
    data-parallel ranks (into `gradient_layout`'s pieces, when given), the loss and the loss
    function's statistics averaged, for the log.

    `schedule(stacked, iteration, loss_scale) -> (losses, names, grads)`: losses `[1 + k]`, the mean
    loss then the k statistics' means; their names as `encode_names` codes them; grads in `params`
    order.
    """

    def __init__(self, forward, params, num_micro_batches, accumulate_in_fp32=True, gradient_layout=None,
                 per_token=False):
        super().__init__(auto_prefix=False)
        self.forward = forward
        self.num_micro_batches = num_micro_batches
        self.per_token = per_token
        self.cast_to_fp32 = casts_to_fp32(params, accumulate_in_fp32)
        self.round_bf16 = rounds_to_bf16(params, accumulate_in_fp32)
        self.grad_fn = ms.value_and_grad(self.micro_batch_loss, None, ParameterTuple(params), has_aux=True)
        self.dp_size, self.dp_rank = get_data_parallel_world_size(), get_data_parallel_rank()
        self.finalize = DataParallelFinalize(params, self.cast_to_fp32, gradient_layout, self.round_bf16)

    def micro_batch_loss(self, micro_batch, loss_multiplier, key):
        """(the loss the backward starts from, the hook's loss in fp32, its statistics' values, their
        names) of one micro-batch; the dropout key is an explicit input, set before the forward
        runs. Values and names travel as tuples: MindSpore 2.10 returns a dict given as
        value_and_grad's aux, when the gradient function is called more than once in a graph, as
        constants of the first compilation (measured)."""
        set_dropout_key(key)
        loss, tokens, stats = loss_and_stats(self.forward(micro_batch), self.per_token)
        # An `if` statement, not `x if tokens is None else y`: MindSpore 2.10 compiled that
        # conditional expression here so that the gradients came out ~8x too large (the GPT's
        # per-token step, measured; tests/test_user_scripts.py checks it).
        if tokens is None:
            return loss * loss_multiplier, loss, tuple(stats.values()), tuple(stats.keys())
        return loss * loss_multiplier, loss, (tokens,) + tuple(stats.values()), tuple(stats.keys())

    def micro_batch(self, stacked, i, iteration, multiplier):
        """Micro-batch i's forward and backward. The dropout key's assign is inside the
        differentiated function (set outside it, MindSpore 2.10 found a cycle in the graph of a
        16-bit ZeRO-3 step with recompute). With it inside, an identity with a custom backward must
        not be foldable into its input (rapidgpt/parallel/mappings.py, CopyToTensorParallelRegion)."""
        return self.grad_fn(select_micro_batch(stacked, i), multiplier,
                            micro_batch_dropout_key(iteration, i, self.dp_size, self.dp_rank))

    def construct(self, stacked, iteration, loss_scale=None):
        n = self.num_micro_batches
        multiplier = loss_multiplier(loss_scale, n, self.dp_size, self.per_token)
        # Every output is used (ops.depend): a graph with a side effect (the dropout key) and an
        # unused value makes MindSpore warn "Some side effect nodes were eliminated by mistake".
        (scaled, total, stats, names), grads = self.micro_batch(stacked, 0, iteration, multiplier)
        total = ops.depend(total, scaled)
        grads = accumulate(None, grads, self.cast_to_fp32, self.round_bf16)
        # Unrolled: each micro-batch is its own subgraph, so compiling costs ~n times one
        # micro-batch (benchmarks/compile_profile.py). Not a loop, measured with MindSpore 2.10 on
        # CPU: a `while` over a tensor index compiles to the same losses, but the step then hangs
        # at run time once a tensor-dependent `if` follows the loop (the optimizer's skip on
        # overflow); ops.ForiLoop refuses a body that reads the graph's inputs.
        for i in range(1, n):
            (scaled, loss, micro_stats, same_names), micro_grads = self.micro_batch(stacked, i, iteration, multiplier)
            total = total + ops.depend(ops.depend(loss, scaled), same_names)
            stats = add_stats(stats, micro_stats)
            grads = accumulate(grads, micro_grads, self.cast_to_fp32, self.round_bf16)
        if self.per_token:          # stats: the tokens, then the statistics' sums
            values, grads = per_token_finalize(*self.finalize(stacked_losses(total, stats), grads), self.dp_size)
        else:
            values, grads = self.finalize(stacked_losses(total, stats) / n, grads)
        return values, encode_names(names), grads
