"""Optimizers, their mixed-precision wrapper and loss scalers, learning-rate schedule and gradient
clipping, with Megatron's semantics."""
from .adamw import SGD, AdamW, build_optimizer, megatron_no_decay
from .clip_grads import clip_grads_by_global_norm, global_grad_norm
from .grad_scaler import ConstantGradScaler, DynamicGradScaler
from .lr_scheduler import OptimizerParamScheduler, build_lr_scheduler, learning_rates
from .mixed_precision import OptimizerWrapper, wrap_optimizer

__all__ = [
    "AdamW", "SGD", "build_optimizer", "megatron_no_decay",
    "global_grad_norm", "clip_grads_by_global_norm",
    "OptimizerParamScheduler", "build_lr_scheduler", "learning_rates",
    "ConstantGradScaler", "DynamicGradScaler", "OptimizerWrapper", "wrap_optimizer",
]
