"""Activation recompute: the flags, their validation and the `RecomputeConfig` built once.

Megatron's flags: `--recompute-granularity full|selective`, `--recompute-method uniform|block`,
`--recompute-num-layers N`; `--recompute-activations` is selective recompute, and Rapidformer's
(and old Megatron's) `--checkpoint-activations` is full, uniform, 1 layer per chunk.

- full, uniform: the layers are divided into chunks of N consecutive layers; only each chunk's
  input is kept, the chunk is recomputed in the backward.
- full, block: the first N layers (of each pipeline stage) are recomputed one by one, the others
  are not.
- selective: only the core attention (scores, softmax, attention dropout, probabilities x values)
  is recomputed: the part whose activations grow with the square of the sequence length.

How a model is transformed: rapidgpt/training/model_transforms.py.
"""
from dataclasses import dataclass
from typing import Optional

GRANULARITIES = ("full", "selective")
METHODS = ("uniform", "block")


@dataclass(frozen=True)
class RecomputeConfig:
    granularity: Optional[str] = None        # None: no recompute
    method: Optional[str] = None             # full only
    num_layers: Optional[int] = None         # full only

    @classmethod
    def from_args(cls, args):
        return cls(args.recompute_granularity, args.recompute_method, args.recompute_num_layers)

    def describe(self):
        if self.granularity is None:
            return "off"
        if self.granularity == "selective":
            return "selective (core attention)"
        return f"full, {self.method}, {self.num_layers} layer(s)"


def add_recompute_args(parser):
    g = parser.add_argument_group("activation recompute",
                                  "keep fewer activations, recompute them in the backward (Megatron's flags)")
    g.add_argument("--recompute-granularity", choices=GRANULARITIES, default=None,
                   help="full: whole transformer layers; selective: the core attention only")
    g.add_argument("--recompute-method", choices=METHODS, default=None,
                   help="full recompute: uniform = chunks of --recompute-num-layers layers, only each "
                        "chunk's input kept; block = the first --recompute-num-layers layers recomputed")
    g.add_argument("--recompute-num-layers", type=int, default=None,
                   help="full recompute: layers per chunk (uniform) or recomputed layers (block)")
    g.add_argument("--recompute-activations", action="store_true", help="the same as --recompute-granularity selective")
    g.add_argument("--checkpoint-activations", action="store_true",
                   help="Rapidformer / old Megatron: full recompute, uniform, 1 layer per chunk")


def check_recompute_args(args, check):
    """Validate into `check` (a flag_parser.Problems) and set `args.recompute` (a RecomputeConfig)."""
    if args.recompute_activations:
        check.require(args.recompute_granularity in (None, "selective"),
                      "--recompute-activations: it means --recompute-granularity selective; remove one of them")
        args.recompute_granularity = "selective"
    if args.checkpoint_activations:
        check.require(args.recompute_granularity in (None, "full") and args.recompute_method in (None, "uniform")
                      and args.recompute_num_layers in (None, 1),
                      "--checkpoint-activations: it means --recompute-granularity full --recompute-method uniform "
                      "--recompute-num-layers 1; give either it or those flags")
        args.recompute_granularity, args.recompute_method, args.recompute_num_layers = "full", "uniform", 1
    granularity, method, n = args.recompute_granularity, args.recompute_method, args.recompute_num_layers
    if granularity == "full":
        check.require(method is not None, "--recompute-method: full recompute needs --recompute-method uniform "
                                          "or block")
        if check.require(n is not None, "--recompute-num-layers: full recompute needs --recompute-num-layers N"):
            check.require(1 <= n <= args.num_layers,
                          f"--recompute-num-layers: must be in [1, --num-layers {args.num_layers}], got {n}")
    else:
        what = "selective recompute" if granularity else "no --recompute-granularity"
        check.require(method is None, f"--recompute-method: only for --recompute-granularity full ({what} given)")
        check.require(n is None or not granularity,
                      f"--recompute-num-layers: only for --recompute-granularity full ({what} given)")
        if n is not None and not granularity:   # Megatron ignores it so (its functional tests give it)
            line = " > --recompute-num-layers: accepted; no effect without --recompute-granularity full, as in Megatron"
            lines = list(getattr(args, "megatron_flag_lines", ()))      # shown with the Megatron flags' lines
            args.megatron_flag_lines = lines + [line] * (line not in lines)
    args.recompute = RecomputeConfig.from_args(args)
