"""muP, the maximal update parametrization (Megatron-LM's --use-mup): a model whose width is
--mup-base-hidden-size times `width_mult` trains with the hyper-parameters tuned at the base width.

    --use-mup --mup-base-hidden-size B       width_mult m = --hidden-size / B (1 without B)
    --mup-embedding-mult A                   the embeddings' output times A (default 1)
    --mup-output-mult O                      the logits times O (default 1/m)
    --mup-base-head-dim D --mup-attn-scale-power P
                                             attention scores times sqrt(D) / kv_channels^P
                                             (default 1 / kv_channels: P = 1, D unset)

As Megatron-core (TransformerConfig.__post_init__, get_mup_config_overrides at the commit of
rapidgpt/config/megatron_flag_shapes.py), the muP parameter classes are: "vector-like", the
embeddings (word, position), the output layer and every 1-D parameter (norms, biases); "hidden",
every other matrix. Then:
- init: hidden matrices N(0, std / sqrt(m)), the output projections of each layer (attention's
  dense, the MLP's down projection) N(0, std / (sqrt(2 L) sqrt(m))); the embeddings and an
  untied output layer N(0, --embedding-init-method-std, by default std);
- Adam: hidden matrices take --lr / m (and --min-lr / m; the warmup starts from --lr-warmup-init
  alike) and --adam-eps / m; vector-like parameters keep --lr and --adam-eps. SGD: vector-like
  parameters take --lr x m, hidden ones keep --lr. With --decoupled-lr the word embeddings and the
  output layer keep their decoupled rate (muP does not scale it).
At m = 1 muP changes nothing but the attention scale (and the multipliers given).

The model reads its share from TransformerConfig (rapidgpt/config/transformer.py), the optimizer
and the schedule theirs from MupConfig (rapidgpt/optim/). Megatron's --mup-width-mult is derived
there, never read: a value that contradicts --hidden-size / --mup-base-hidden-size is refused.
"""
from dataclasses import dataclass


# Megatron's defaults of muP's settings (written once: the flags and their check read them).
FLAG_DEFAULTS = {"--mup-base-hidden-size": None, "--mup-width-mult": 1.0, "--mup-embedding-mult": 1.0,
                 "--mup-output-mult": 1.0, "--mup-base-head-dim": None, "--mup-attn-scale-power": 1.0}


def add_mup_args(parser):
    g = parser.add_argument_group("muP (maximal update parametrization)")
    g.add_argument("--use-mup", action="store_true",
                   help="muP: init, learning rates, Adam's eps and the attention scale set by the width "
                        "multiplier --hidden-size / --mup-base-hidden-size, so hyper-parameters tuned at the base "
                        "width transfer")
    helps = {"--mup-base-hidden-size": "the hidden size the hyper-parameters were tuned at (default --hidden-size: "
                                       "multiplier 1)",
             "--mup-width-mult": "Megatron's derived multiplier; RapidGPT derives it too (--hidden-size / "
                                 "--mup-base-hidden-size) and refuses a value that contradicts it",
             "--mup-embedding-mult": "the embeddings' output times this",
             "--mup-output-mult": "the logits times this; the default 1 means 1 / width multiplier",
             "--mup-base-head-dim": "attention scale sqrt(this) / kv_channels^--mup-attn-scale-power (default 1 / ...)",
             "--mup-attn-scale-power": "the power of kv_channels the attention scores are divided by (0.5: standard "
                                       "attention)"}
    for flag, default in FLAG_DEFAULTS.items():
        kind = int if flag == "--mup-base-hidden-size" else float
        g.add_argument(flag, type=kind, default=default, help=helps[flag])


@dataclass(frozen=True)
class MupConfig:
    """A run's muP (see the module docstring); by default none."""
    enabled: bool = False
    width_mult: float = 1.0
    embedding_mult: float = 1.0
    output_mult: float = 1.0
    softmax_scale: float = None          # of the attention scores; None: 1 / sqrt(kv_channels)

    @classmethod
    def from_args(cls, args):
        """Megatron-core's derived values for the flags (after --kv-channels is settled)."""
        if not getattr(args, "use_mup", False):
            return cls()
        width_mult = args.hidden_size / (args.mup_base_hidden_size or args.hidden_size)
        base_head_scale = 1.0 if args.mup_base_head_dim is None else args.mup_base_head_dim ** 0.5
        output_mult = args.mup_output_mult
        if output_mult == 1.0 and width_mult != 1.0:          # Megatron's rule: 1.0 means "derive it"
            output_mult = 1.0 / width_mult
        return cls(True, width_mult, args.mup_embedding_mult, output_mult,
                   base_head_scale / args.kv_channels ** args.mup_attn_scale_power)

    def lr_mult(self, optimizer):
        """The rate multiplier of muP's scaled parameter class for `optimizer` ("adam": the hidden
        matrices', 1 / m; "sgd": the vector-like parameters', m), or None when nothing is scaled."""
        if self.width_mult == 1.0:
            return None
        return self.width_mult if optimizer == "sgd" else 1.0 / self.width_mult

    def describe(self, optimizer):
        """One start-up line."""
        scaled = ("vector-like parameters' lr" if optimizer == "sgd" else "hidden matrices' lr and Adam eps")
        lr_mult = self.lr_mult(optimizer)
        return (f" > muP: width multiplier {self.width_mult:g}, attention scale {self.softmax_scale:.6g}, "
                f"embeddings x{self.embedding_mult:g}, logits x{self.output_mult:g}"
                + (f", {scaled} x{lr_mult:g}" if lr_mult else ""))


def check_mup_args(args, check):
    """Validate into `check` (a flag_parser.Problems) and set `args.mup` (a MupConfig)."""
    given = [flag for flag, default in FLAG_DEFAULTS.items() if getattr(args, _name(flag)) != default]
    args.mup = MupConfig()
    if not args.use_mup:
        check.require(not given, f"{', '.join(given)}: muP's settings; add --use-mup, or drop them")
        return
    base = args.mup_base_hidden_size
    ok = check.require(base is None or base > 0, f"--mup-base-hidden-size: must be positive, got {base}")
    check.require(args.model_type != "bert",
                  "--use-mup: built for GPT models (Megatron's BERT applies only part of it); drop --use-mup")
    check.require(not args.pretrained_model_name_or_path,
                  "--use-mup: changes the attention scale and the logits of a Hugging Face model trained without "
                  "it; drop --use-mup to finetune it")
    if ok and args.kv_channels:
        args.mup = MupConfig.from_args(args)
        check.require(args.mup_width_mult in (1.0, args.mup.width_mult),
                      f"--mup-width-mult: {args.mup_width_mult:g} contradicts --hidden-size {args.hidden_size} / "
                      f"--mup-base-hidden-size {base or args.hidden_size}; drop it (it is derived, as in Megatron)")


def _name(flag):
    return flag[2:].replace("-", "_")
