"""One optimizer step as ONE compiled MindSpore graph.

    for each micro-batch i:   select the dropout masks of (iteration, i's place in the global batch)
                              loss_i, grads_i = value_and_grad(forward)(micro_batch_i)
    grads = mean_i grads_i, then the mean over data-parallel ranks (flat-buffer all-reduce)
    norm = ||grads|| over the whole model (TP shards summed over the TP group, replicated
           parameters counted once);   clip to --clip-grad
    if norm is finite:        optimizer(grads, lr)      (skipped steps are counted and logged)

Everything above runs inside a single `mindspore.jit` graph. Measured on CPU
(benchmarks/bench_pretrain.py): the fused graph trains as fast as GRAPH_MODE `TrainOneStepCell`,
while the same work split over two graphs (gradients, then update) is about 2x slower, and an
eager forward with a compiled model is slower still. The tensor-dependent `if` around the update
is what loss scaling needs anyway, and it also stops a MindSpore runtime thread from spinning.

The micro-batches of a step arrive stacked, a dict (or tuple) of tensors `[num_micro, ...]`;
`forward(micro_batch)` must be traceable by `mindspore.jit` (see Pretrainer/Finetuner docs).
With `jit=False` the very same function runs eagerly (PyNative) for debugging.
"""
import mindspore as ms
from mindspore import Tensor, nn, ops

from rapidgpt.optim.clip_grads import clip_grads_by_global_norm, global_grad_norm
from rapidgpt.parallel import comm
from rapidgpt.parallel.data_parallel import GradientAverager
from rapidgpt.parallel.random import set_micro_batch_key
from rapidgpt.parallel.state import (get_data_parallel_group, get_data_parallel_rank,
                                     get_data_parallel_world_size, get_tensor_model_parallel_group,
                                     get_tensor_model_parallel_rank)
from rapidgpt.training.hook_contract import diagnose_first_step


def loss_of(output):
    """A forward hook's result as a scalar loss: `loss`, `(output, loss_fn)` as Megatron's
    forward_step returns, and a loss_fn returning `(loss, stats)` are all accepted."""
    if isinstance(output, tuple):
        output = output[1](output[0])
        if isinstance(output, tuple):
            output = output[0]
    return output


def select_micro_batch(stacked, i):
    if isinstance(stacked, dict):
        return {key: value[i] for key, value in stacked.items()}
    return tuple(value[i] for value in stacked)


class _StepCell(nn.Cell):
    """The step graph as a Cell, as MindSpore's TrainOneStepCell is."""

    def __init__(self, forward, optimizer, num_micro_batches, clip_grad):
        super().__init__(auto_prefix=False)
        self.forward = forward
        self.optimizer = optimizer
        self.grad_fn = ms.value_and_grad(self.forward_loss, None, ms.ParameterTuple(optimizer.parameters))
        self.num_micro_batches = num_micro_batches
        self.clip_grad = clip_grad
        # Megatron's sampler gives DP rank r micro-batch j of the global batch's j*dp + r.
        self.dp_size, self.dp_rank = get_data_parallel_world_size(), get_data_parallel_rank()
        self.average_over_dp = GradientAverager(optimizer.parameters, get_data_parallel_group())
        self.dp_sum = comm.AllReduce(get_data_parallel_group())
        # The norm counts a TP-sharded parameter's shards on every TP rank, a replicated one on
        # TP rank 0 only; the partial sums of squares are added over the TP group.
        first = get_tensor_model_parallel_rank() == 0
        self.in_norm = tuple(first or getattr(p, "tensor_model_parallel", False) for p in optimizer.parameters)
        self.tp_sum = comm.AllReduce(get_tensor_model_parallel_group())

    def forward_loss(self, micro_batch):
        return loss_of(self.forward(micro_batch))

    def construct(self, stacked, lr, iteration):
        n = self.num_micro_batches
        total, grads = None, None
        for i in range(n):          # unrolled: each micro-batch is its own subgraph
            set_micro_batch_key(iteration, i * self.dp_size + self.dp_rank)
            loss, micro_grads = self.grad_fn(select_micro_batch(stacked, i))
            total = loss if total is None else total + loss
            grads = micro_grads if grads is None else tuple(a + b for a, b in zip(grads, micro_grads))
        if n > 1:
            grads = tuple(g / n for g in grads)
            total = total / n
        if self.dp_size > 1:
            grads = self.average_over_dp(grads)
            total = self.dp_sum(total) / self.dp_size
        norm = global_grad_norm(tuple(g for g, counted in zip(grads, self.in_norm) if counted), self.tp_sum)
        grads, norm = clip_grads_by_global_norm(grads, self.clip_grad, norm)
        # A NaN/Inf gradient makes the norm non-finite (as does a norm beyond fp32, which
        # clipping would turn into a zero update): one scalar test instead of a pass over grads.
        finite = ops.isfinite(norm)
        if finite:
            self.optimizer(grads, lr)
        return total, norm, finite


class TrainStep:
    """Callable `step(stacked_batches, lr, iteration) -> (mean loss, grad norm, finite)` for a
    fixed model; `iteration` (the number of the training iteration) selects the dropout masks.

    `forward(micro_batch) -> loss` (or Megatron's `(output, loss_fn)`); `optimizer(grads, lr)`
    updates `optimizer.parameters`.
    """

    def __init__(self, forward, optimizer, num_micro_batches, clip_grad, jit=True):
        cell = _StepCell(forward, optimizer, num_micro_batches, clip_grad)
        self._step = ms.jit(cell.construct) if jit else cell
        self._forward, self._ran = forward, False

    def __call__(self, stacked, lr, iteration):
        # mutable: a dict/tuple of tensors is otherwise a compile-time constant, and the step
        # would be compiled again for every batch.
        try:
            loss, norm, finite = self._step(ms.mutable(stacked), Tensor(lr, ms.float32),
                                            Tensor(iteration, ms.uint32))
            result = float(loss), float(norm), bool(finite)     # a non-scalar "loss" fails here
        except Exception as error:
            if self._ran:
                raise
            diagnose_first_step(self._forward, select_micro_batch(stacked, 0), error)
        self._ran = True
        return result


class EvalStep:
    """Callable `step(micro_batch) -> loss` (forward only, compiled unless jit=False)."""

    def __init__(self, forward, jit=True):
        def step(micro_batch):
            return ops.stop_gradient(loss_of(forward(micro_batch)))

        self._step = ms.jit(step) if jit else step
        self._forward, self._ran = forward, False

    def __call__(self, micro_batch):
        try:
            loss = float(self._step(ms.mutable(micro_batch)))
        except Exception as error:
            if self._ran:
                raise
            diagnose_first_step(self._forward, micro_batch, error)
        self._ran = True
        return loss
