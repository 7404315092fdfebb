"""Mixed precision: the flags, their validation and the `PrecisionConfig` the engine builds once.

Megatron's semantics (see rapidgpt/optim/mixed_precision.py for the optimizer side and
rapidgpt/training/model_transforms.py for the model side):

- `--fp16` / `--bf16` (Rapidformer: `--mixed-precision` = `--fp16`): model parameters, gradients and
  activations in 16-bit; the optimizer keeps fp32 main parameters and fp32 state. LayerNorm, the
  loss and the grad norm are computed in fp32, the attention softmax too with
  `--attention-softmax-in-fp32`.
- fp16 scales the loss: dynamically from `--initial-loss-scale` (2^32) with `--loss-scale-window`,
  `--hysteresis` and `--min-loss-scale`, or statically with `--loss-scale`. bf16 needs no scaling and
  gets a static one only with `--loss-scale`.
- `--accumulate-allreduce-grads-in-fp32`: micro-batch gradients are summed and data-parallel
  averaged in fp32 (always in fp32 runs; for bf16 unless `--grad-reduce-in-bf16`, as in Megatron).
- bf16 on the CPU backend, which has no bf16 kernels, is emulated: fp32 tensors holding bf16 values
  (rapidgpt/emulated_bf16.py: what is rounded where). The same algorithm, in 4 bytes a value.
"""
from dataclasses import dataclass, replace
from typing import Optional

DEFAULT_INITIAL_LOSS_SCALE = 2.0 ** 32
DEFAULT_MIN_LOSS_SCALE = 1.0
DEFAULT_LOSS_SCALE_WINDOW = 1000
DEFAULT_HYSTERESIS = 2
_DYNAMIC_SCALING_FLAGS = {"initial_loss_scale": DEFAULT_INITIAL_LOSS_SCALE, "min_loss_scale": DEFAULT_MIN_LOSS_SCALE,
                          "loss_scale_window": DEFAULT_LOSS_SCALE_WINDOW, "hysteresis": DEFAULT_HYSTERESIS}


@dataclass(frozen=True)
class PrecisionConfig:
    """params_dtype: "float32", "float16" or "bfloat16" (MindSpore dtype names).
    loss_scale: a static scale, or None (fp16: dynamic scaling; bf16/fp32: no scaling).
    emulated_bf16: bf16 values in fp32 tensors (a backend without bf16 kernels: `on_device`)."""
    params_dtype: str = "float32"
    loss_scale: Optional[float] = None
    initial_loss_scale: float = DEFAULT_INITIAL_LOSS_SCALE
    min_loss_scale: float = DEFAULT_MIN_LOSS_SCALE
    loss_scale_window: int = DEFAULT_LOSS_SCALE_WINDOW
    hysteresis: int = DEFAULT_HYSTERESIS
    attention_softmax_in_fp32: bool = False
    accumulate_allreduce_grads_in_fp32: bool = True
    emulated_bf16: bool = False

    def on_device(self, device):
        """This precision as `device` (cpu/gpu/ascend) runs it: bf16 is emulated on the CPU."""
        return replace(self, emulated_bf16=self.params_dtype == "bfloat16" and device == "cpu")

    @property
    def storage_dtype(self):
        """The dtype of the model's parameters and activations (MindSpore's name)."""
        return "float32" if self.emulated_bf16 else self.params_dtype

    @property
    def param_bytes(self):
        return 4 if self.storage_dtype == "float32" else 2

    @property
    def half(self):
        """Whether the model runs in 16-bit (fp16 or bf16) with fp32 main parameters."""
        return self.params_dtype != "float32"

    @property
    def dynamic_loss_scaling(self):
        return self.params_dtype == "float16" and self.loss_scale is None

    @property
    def scales_loss(self):
        return self.dynamic_loss_scaling or (self.half and self.loss_scale is not None)

    def describe(self):
        if not self.half:
            return "fp32"
        bits = "fp16" if self.params_dtype == "float16" else "bf16"
        if self.emulated_bf16:
            bits = "emulated bf16 (fp32 tensors holding bf16 values: the CPU backend has no bf16 kernels)"
        text = f"{bits} parameters and activations, fp32 main parameters and optimizer state; "
        if self.dynamic_loss_scaling:
            text += (f"dynamic loss scale from {self.initial_loss_scale:g} (window {self.loss_scale_window}, "
                     f"hysteresis {self.hysteresis}, min {self.min_loss_scale:g})")
        else:
            text += f"static loss scale {self.loss_scale:g}" if self.loss_scale else "no loss scaling"
        return text

    @classmethod
    def from_args(cls, args):
        dtype = "float16" if args.fp16 else "bfloat16" if args.bf16 else "float32"
        return cls(params_dtype=dtype, loss_scale=args.loss_scale,
                   initial_loss_scale=args.initial_loss_scale, min_loss_scale=args.min_loss_scale,
                   loss_scale_window=args.loss_scale_window, hysteresis=args.hysteresis,
                   attention_softmax_in_fp32=args.attention_softmax_in_fp32,
                   accumulate_allreduce_grads_in_fp32=args.accumulate_allreduce_grads_in_fp32)


def add_precision_args(parser):
    g = parser.add_argument_group(
        "mixed precision",
        "16-bit model with fp32 main parameters and optimizer state, as Megatron's Float16 optimizer")
    g.add_argument("--fp16", action="store_true", help="fp16 parameters and activations, dynamic loss scaling")
    g.add_argument("--bf16", action="store_true",
                   help="bf16 parameters and activations, no loss scaling (MindSpore's CPU backend has no "
                        "bf16 kernels: there fp32 tensors hold the bf16 values, emulated)")
    g.add_argument("--mixed-precision", action="store_true", help="Rapidformer's switch: the same as --fp16")
    g.add_argument("--loss-scale", type=float, default=None,
                   help="static loss scale (fp16/bf16); without it fp16 scales dynamically")
    g.add_argument("--initial-loss-scale", type=float, default=None,
                   help="fp16 dynamic scaling: the starting scale (default 2^32)")
    g.add_argument("--min-loss-scale", type=float, default=None,
                   help=f"fp16 dynamic scaling: the scale never drops below this (default {DEFAULT_MIN_LOSS_SCALE})")
    g.add_argument("--loss-scale-window", type=int, default=None,
                   help=f"fp16 dynamic scaling: double the scale after this many steps without overflow "
                        f"(default {DEFAULT_LOSS_SCALE_WINDOW})")
    g.add_argument("--hysteresis", type=int, default=None,
                   help=f"fp16 dynamic scaling: the scale halves at every overflow from the N-th one "
                        f"counted since the last growth on (default {DEFAULT_HYSTERESIS})")
    g.add_argument("--attention-softmax-in-fp32", action="store_true",
                   help="16-bit runs: compute the attention softmax in fp32 (otherwise in 16-bit, as Megatron)")
    g.add_argument("--apply-query-key-layer-scaling", action="store_true",
                   help="Megatron's: layer L's attention scores q k^T are computed divided by L more (they overflow "
                        "fp16 later) and multiplied back by L in fp32 before the mask and softmax; implies "
                        "--attention-softmax-in-fp32")
    g.add_argument("--accumulate-allreduce-grads-in-fp32", action="store_true",
                   help="fp16 runs: sum micro-batch gradients and average them over data-parallel ranks in "
                        "fp32 (bf16 does unless --grad-reduce-in-bf16)")
    g.add_argument("--grad-reduce-in-bf16", action="store_true",
                   help="bf16 runs: sum and data-parallel average the gradients in bf16 instead of fp32 (Megatron's "
                        "flag; no effect in fp16 and fp32 runs, as in Megatron)")


def check_precision_args(args, check):
    """Validate the precision flags into `check` (a flag_parser.Problems), fill in Megatron's
    defaults and set `args.precision` (a PrecisionConfig)."""
    if args.mixed_precision:
        args.fp16 = True
    if args.apply_query_key_layer_scaling:      # Megatron's rule: the scaled scores go back up in fp32
        args.attention_softmax_in_fp32 = True
    check.require(not (args.fp16 and args.bf16), "--bf16: give either --fp16 (or --mixed-precision) or --bf16, "
                                                 "not both")
    half = args.fp16 or args.bf16
    check.require(half or args.loss_scale is None,
                  "--loss-scale: loss scaling is for 16-bit training; add --fp16 or --bf16, or remove it")
    for name, default in _DYNAMIC_SCALING_FLAGS.items():
        flag = "--" + name.replace("_", "-")
        given = getattr(args, name)
        check.require(given is None or (args.fp16 and args.loss_scale is None),
                      f"{flag}: dynamic loss scaling is fp16's (without a static --loss-scale); "
                      f"{'add --fp16' if not args.fp16 else 'remove --loss-scale'} or remove {flag}")
        check.require(given is None or given > 0, f"{flag}: must be positive, got {given}")
        if given is None:
            setattr(args, name, default)
    check.require(args.loss_scale is None or args.loss_scale > 0,
                  f"--loss-scale: must be positive, got {args.loss_scale}")
    check.require(args.min_loss_scale <= args.initial_loss_scale,
                  f"--min-loss-scale: {args.min_loss_scale} is above --initial-loss-scale {args.initial_loss_scale}")
    # fp32 runs accumulate in fp32 anyway; bf16 does unless told otherwise (Megatron forces it:
    # 8 mantissa bits lose small gradients in a sum, and only --grad-reduce-in-bf16 opts out).
    if args.bf16 and args.grad_reduce_in_bf16:
        args.accumulate_allreduce_grads_in_fp32 = False
    elif not args.fp16:
        args.accumulate_allreduce_grads_in_fp32 = True
    args.precision = PrecisionConfig.from_args(args)
    if args.device:          # else the engine settles it once it has picked the device
        args.precision = args.precision.on_device(args.device)
