"""Loss scalers for fp16 training: Megatron's ConstantGradScaler and DynamicGradScaler.

The scale and the trackers are Parameters (graph state): the compiled step reads the scale,
multiplies the loss by it before the backward, and updates the scaler after the overflow check,
with no Python branch on a tensor. They are saved in checkpoints (`grad_scaler.*`), so a resumed
run continues with the scale and trackers of the uninterrupted one.

Megatron's dynamic rule (DynamicGradScaler.update), per optimizer step:

    overflow (found_inf):  growth_tracker = 0
                           hysteresis_tracker -= 1
                           if hysteresis_tracker <= 0:  scale = max(scale * 0.5, min_scale)
    otherwise:             growth_tracker += 1
                           if growth_tracker == loss_scale_window:
                               growth_tracker = 0;  hysteresis_tracker = hysteresis;  scale *= 2

Why not mindspore.amp.DynamicLossScaler: it has no hysteresis and no minimum scale.
"""
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops


class ConstantGradScaler(nn.Cell):
    """A fixed loss scale (`--loss-scale`)."""

    def __init__(self, scale):
        super().__init__(auto_prefix=False)
        self.scale = Parameter(Tensor(scale, ms.float32), name="grad_scaler.scale", requires_grad=False)

    def update(self, found_inf, held=None):
        return self.scale


class DynamicGradScaler(nn.Cell):
    """Megatron's dynamic loss scale (rule in the module docstring); growth x2, backoff x0.5."""

    def __init__(self, initial_scale, min_scale, growth_interval, hysteresis):
        super().__init__(auto_prefix=False)
        if not 0 < min_scale <= initial_scale:
            raise ValueError(f"loss scales must satisfy 0 < min ({min_scale}) <= initial ({initial_scale})")
        self.scale = Parameter(Tensor(initial_scale, ms.float32), name="grad_scaler.scale", requires_grad=False)
        self.growth_tracker = Parameter(Tensor(0, ms.int32), name="grad_scaler.growth_tracker", requires_grad=False)
        self.hysteresis_tracker = Parameter(Tensor(hysteresis, ms.int32), name="grad_scaler.hysteresis_tracker",
                                            requires_grad=False)
        self.min_scale = Tensor(min_scale, ms.float32)
        self.growth_interval = Tensor(growth_interval, ms.int32)
        self.hysteresis = Tensor(hysteresis, ms.int32)

    def update(self, found_inf, held=None):
        """Apply one step's outcome (`found_inf`: bool scalar tensor); returns the new scale. A step
        `held` by the rerun state machine (bool scalar tensor, or None) changes nothing: it is run
        again, and Megatron re-runs such a step before its optimizer (and scaler) sees it."""
        zero = ops.zeros((), ms.int32)
        hysteresis_left = self.hysteresis_tracker - 1
        grown = self.growth_tracker + 1
        grow = ops.logical_and(ops.logical_not(found_inf), grown == self.growth_interval)
        back_off = ops.logical_and(found_inf, hysteresis_left <= 0)
        scale = ops.select(back_off, ops.maximum(self.scale * 0.5, self.min_scale),
                           ops.select(grow, self.scale * 2.0, self.scale))
        growth = ops.select(ops.logical_or(found_inf, grow), zero, grown)
        hysteresis = ops.select(found_inf, hysteresis_left,
                                ops.select(grow, self.hysteresis, self.hysteresis_tracker))
        if held is not None:
            growth = ops.select(held, self.growth_tracker, growth)
            hysteresis = ops.select(held, self.hysteresis_tracker, hysteresis)
            scale = ops.select(held, self.scale, scale)
        ops.assign(self.growth_tracker, growth)
        ops.assign(self.hysteresis_tracker, hysteresis)
        ops.assign(self.scale, scale)
        return scale


def build_grad_scaler(precision):
    """The scaler a PrecisionConfig asks for, or None (fp32; bf16 without --loss-scale)."""
    if not precision.scales_loss:
        return None
    if precision.loss_scale is not None:
        return ConstantGradScaler(precision.loss_scale)
    return DynamicGradScaler(precision.initial_loss_scale, precision.min_loss_scale,
                             precision.loss_scale_window, precision.hysteresis)
