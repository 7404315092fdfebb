"""One optimizer step as ONE compiled MindSpore graph: the schedule, then the optimizer wrapper.

    losses, names, grads = schedule(micro-batches, iteration, loss scale)  rapidgpt/training/schedules.py
    updated, grad norm, loss scale, num zeros, params norm, held = optimizer(grads, lr[, loss, validation])
                                                                    rapidgpt/optim/mixed_precision.py

`validation` (the rerun state machine's limits, rapidgpt/training/rerun_state_machine.py) is a
graph input only when its checks are on; a step they reject is `held`: computed, not applied.

Everything runs inside a single `mindspore.jit` graph. Measured on CPU
(benchmarks/bench_pretrain.py): the fused graph trains as fast as GRAPH_MODE `TrainOneStepCell`,
while the same work split over two graphs (gradients, then update) is about 2x slower, and an
eager forward with a compiled model is slower still. The tensor-dependent `if` around the update
(skipped on overflow) also stops a MindSpore runtime thread from spinning.

`forward(micro_batch)` must be traceable by `mindspore.jit` (see Pretrainer/Finetuner docs). With
`jit=False` the very same function runs eagerly (PyNative) for debugging.
"""
import logging
import time
from typing import NamedTuple

import mindspore as ms
from mindspore import Tensor, nn, ops

from rapidgpt.mindspore_private import compile_without_running
from rapidgpt.training.hook_contract import diagnose_first_step
from rapidgpt.training.schedules import ForwardBackwardNoPipelining, decode_names, loss_and_stats, select_micro_batch


def compile_then_meet(jitted, inputs, barrier, what):
    """Before a graph's first run on several ranks (`barrier` not None): compile `jitted` for
    `inputs`, then wait at `barrier` until every rank has compiled its own, so that no rank reaches
    the graph's collectives while another still compiles; the wait is logged."""
    if barrier is None or not compile_without_running(jitted, *inputs):
        return
    start = time.perf_counter()
    barrier()
    logging.getLogger("rapidgpt").info(f" > {what} compiled on every rank (this rank waited "
                                       f"{time.perf_counter() - start:.1f} s for the others)")


class StepResult(NamedTuple):
    loss: float          # mean over the step's micro-batches and data-parallel ranks
    grad_norm: float     # before clipping (non-finite when the step overflowed)
    updated: bool        # False: skipped (overflow / NaN), nothing changed but the loss scale
    loss_scale: float    # after this step's update (1.0 when the loss is not scaled)
    stats: dict = {}     # the loss function's statistics ({name: mean}), e.g. BERT's lm/sop loss
    num_zeros: float = None     # --log-num-zeros-in-grad: zeros in the (clipped) gradients, else None
    params_norm: float = None   # --log-params-norm: the main parameters' L2 norm after the step, else None
    held: bool = False          # rejected by the rerun state machine's checks: not applied, to be run again


def step_result(optimizer, outputs, loss, stats):
    """The StepResult of a step whose optimizer wrapper `optimizer` returned `outputs`."""
    updated, norm, scale, zeros, params_norm, held = outputs
    return StepResult(loss, float(norm), bool(updated), float(scale), stats,
                      float(zeros) if optimizer.counts_zeros else None,
                      float(params_norm) if optimizer.measures_params else None, bool(held))


def floats(stats):
    return {name: float(value) for name, value in stats.items()}


class _StepCell(nn.Cell):
    """The step graph as a Cell, as MindSpore's TrainOneStepCell is."""

    def __init__(self, schedule, optimizer):
        super().__init__(auto_prefix=False)
        self.schedule = schedule
        self.optimizer = optimizer

    def construct(self, stacked, lr, iteration, validation=None):
        loss_scale = self.optimizer.loss_scale() if self.optimizer.grad_scaler is not None else None
        losses, names, grads = self.schedule(stacked, iteration, loss_scale)
        if validation is None:
            return losses, names, self.optimizer(grads, lr)
        return losses, names, self.optimizer(grads, lr, losses[0], validation)


# MindSpore's graph compiler unrolls a loop over the parameters (the optimizer's update, ZeRO's
# gathers, the gradient casts) into nested calls, and stops at 1000 levels by default ("Exceed
# function call depth limit 1000"). Measured (MindSpore 2.10, CPU, the GPT with ZeRO-1, 12
# parameters a layer): 8 layers (100 parameters) need a limit between 300 and 375, 16 layers (196)
# at most 700, 32 layers (388) more than 1000, so a 32-layer model stopped at its first step. The
# limit grows with the parameters, about twice what was measured.
DEFAULT_CALL_DEPTH = 1000
_call_depth = DEFAULT_CALL_DEPTH


def allow_call_depth_for(parameter_count):
    """Raise MindSpore's compile call-depth limit for a graph looping over `parameter_count`
    parameters (never lowers it: another graph of the process may need more)."""
    global _call_depth
    needed = DEFAULT_CALL_DEPTH + 6 * parameter_count
    if needed > _call_depth:
        ms.set_recursion_limit(needed)
        _call_depth = needed


class TrainStep:
    """Callable `step(stacked_batches, lr, iteration, validation=None) -> StepResult` for a fixed
    model; `iteration` (the number of the training iteration) selects the dropout masks, so a step
    run again on the same batches computes the same; `validation`: the rerun state machine's
    limits (a run gives them at every step or never).

    `optimizer`: a rapidgpt.optim.OptimizerWrapper (its `parameters` are differentiated);
    `accumulate_in_fp32`: sum micro-batch gradients in fp32 (see the schedule).
    `gradient_bytes`: the bytes of the gradients the schedule hands the optimizer on this rank.
    `compile_cache`: a rapidgpt.config.compile_cache.StepGraphCache for the first call, or None.
    `barrier`: with several ranks, the world's barrier (rapidgpt.parallel.comm.barrier): the first
    call compiles the step, waits there until every rank has compiled its own, then runs it, so
    no rank reaches the step's collectives while another still compiles (those wait at most
    --distributed-timeout-minutes; the barrier's wait is logged).
    """

    def __init__(self, forward, optimizer, num_micro_batches, accumulate_in_fp32=True, jit=True,
                 compile_cache=None, barrier=None, per_token=False):
        schedule = ForwardBackwardNoPipelining(forward, optimizer.parameters, num_micro_batches, accumulate_in_fp32,
                                               optimizer.gradient_layout, per_token)
        self.gradient_bytes = schedule.finalize.gradient_bytes
        cell = _StepCell(schedule, optimizer)
        allow_call_depth_for(len(optimizer.parameters))
        self._step = ms.jit(cell.construct) if jit else cell
        self._optimizer, self._forward, self._ran = optimizer, forward, False
        self._compile_cache = compile_cache if jit else None
        self._barrier = barrier if jit else None

    def __call__(self, stacked, lr, iteration, validation=None):
        def run():
            # mutable: a dict/tuple of tensors is otherwise a compile-time constant, and the step
            # would be compiled again for every batch.
            inputs = (ms.mutable(stacked), Tensor(lr, ms.float32), Tensor(iteration, ms.uint32)) + \
                (() if validation is None else (Tensor(validation, ms.float32),))
            if not self._ran:
                compile_then_meet(self._step, inputs, self._barrier, "training step")
            return self._step(*inputs)

        try:
            if self._compile_cache is not None and not self._ran:
                outputs = self._compile_cache.first_call(run, stacked)
            else:
                outputs = run()
            losses, names, optimizer_outputs = outputs
            losses = losses.asnumpy()
            if losses.ndim != 1:                # a non-scalar "loss" from the hook
                raise TypeError(f"the step's losses have shape {losses.shape}, not [1 + statistics]")
            result = step_result(self._optimizer, optimizer_outputs, float(losses[0]),
                                 dict(zip(decode_names(names), map(float, losses[1:]))))
        except Exception as error:
            if self._ran:
                raise
            diagnose_first_step(self._forward, select_micro_batch(stacked, 0), error)
        self._ran = True
        return result


class EvalStep:
    """Callable `step(micro_batch) -> (loss, {name: statistic}, tokens)` (forward only, compiled
    unless jit=False): means and tokens 1.0, or with `per_token` (--calculate-per-token-loss) sums
    and their token count. `barrier`: as TrainStep's, for the first evaluation."""

    def __init__(self, forward, jit=True, barrier=None, per_token=False):
        def step(micro_batch):
            loss, tokens, stats = loss_and_stats(forward(micro_batch), per_token)
            stats = {name: ops.stop_gradient(value) for name, value in stats.items()}
            return ops.stop_gradient(loss), stats, (ops.stop_gradient(tokens) if per_token else loss)

        self._step = ms.jit(step) if jit else step
        self._forward, self._ran, self._per_token = forward, False, per_token
        self._barrier = barrier if jit else None

    def __call__(self, micro_batch):
        try:
            batch = ms.mutable(micro_batch)
            if not self._ran:
                compile_then_meet(self._step, (batch,), self._barrier, "evaluation step")
            loss, stats, tokens = self._step(batch)
            result = float(loss), floats(stats), float(tokens) if self._per_token else 1.0
        except Exception as error:
            if self._ran:
                raise
            diagnose_first_step(self._forward, micro_batch, error)
        self._ran = True
        return result
