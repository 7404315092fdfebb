"""The optimizer `RapidGPTEngine.compose()` hands to a hand-written training loop."""
import numpy as np
from mindspore import Tensor

from rapidgpt.training.step import TrainStep


class ComposedOptimizer:
    """`loss = optimizer.step(forward_fn, *inputs)`: one compiled forward/backward/clip/update.

    `forward_fn(*inputs) -> loss` must be traceable by mindspore.jit (it is compiled on the first
    call; new input shapes compile again). The learning rate is the scheduler's current value.
    After a step, `last_grad_norm`, `last_updated` (False: skipped on overflow, nothing changed) and
    `last_loss_scale` tell what happened; with --log-num-zeros-in-grad / --log-params-norm,
    `last_num_zeros` / `last_params_norm` too (None otherwise).
    `iteration` counts the steps taken and selects the dropout masks; a loop that resumes from a
    checkpoint sets it to the iteration it resumes at.
    """

    def __init__(self, optimizer, lr_scheduler, args):
        """`optimizer`: the run's rapidgpt.optim.OptimizerWrapper."""
        self.optimizer, self.lr_scheduler, self.args = optimizer, lr_scheduler, args
        self.parameters = optimizer.parameters
        self._steps = {}
        self.iteration = 0

    def step(self, forward_fn, *inputs):
        train_step = self._steps.get(forward_fn)
        if train_step is None:
            def forward(micro_batch):
                return forward_fn(*micro_batch)
            train_step = self._steps[forward_fn] = TrainStep(
                forward, self.optimizer, 1, self.args.precision.accumulate_allreduce_grads_in_fp32, jit=self.args.jit)
        stacked = tuple(Tensor(np.asarray(x)[None]) if not isinstance(x, Tensor) else x.expand_dims(0)
                        for x in inputs)
        self.iteration += 1
        result = train_step(stacked, self.lr_scheduler.get_lr(), self.iteration)
        self.last_grad_norm, self.last_updated, self.last_loss_scale = result.grad_norm, result.updated, result.loss_scale
        self.last_num_zeros, self.last_params_norm = result.num_zeros, result.params_norm
        return result.loss
