"""The decoder's architecture: Megatron-core's flags for the Llama family beside GPT-2's defaults,
and `TransformerConfig`, the typed record the models are built from (models/ never reads flags).

    --position-embedding-type {learned_absolute,rope,none}    (--use-rotary-position-embeddings: rope)
    --rotary-base B --rotary-percent P --rotary-interleaved
    --use-rope-scaling --rope-scaling-factor F                 Llama 3.1's frequency scaling
    --normalization {LayerNorm,RMSNorm} --norm-epsilon E --apply-layernorm-1p
    --swiglu --ffn-hidden-size F
    --group-query-attention --num-query-groups G --kv-channels D
    --disable-bias-linear --add-qkv-bias --qk-layernorm
    --multi-latent-attention ...                               DeepSeek's MLA (rapidgpt/config/mla.py)
    --sequence-parallel                                        with TP: norms, dropouts, residuals on s / tp

Defaults give GPT-2 (learned positions, LayerNorm, GELU MLP, biases everywhere, one key/value
head per query head). Llama 3 is `--position-embedding-type rope --rotary-base 500000
--normalization RMSNorm --swiglu --group-query-attention --num-query-groups 8
--disable-bias-linear --untie-embeddings-and-output-weights`; Qwen2 adds `--add-qkv-bias`,
Qwen3 `--qk-layernorm --kv-channels 128`. Semantics as Megatron-core's GPTModel; derived defaults
as Megatron's arguments.py: --ffn-hidden-size 4h (with --swiglu int(8h/3 / 64) * 64),
--kv-channels h / heads, --num-query-groups the heads (1 with --group-query-attention alone).
"""
import dataclasses
import math
from dataclasses import dataclass

from rapidgpt.config.mla import MLA_FLAGS, MlaConfig
from rapidgpt.config.mup import MupConfig

POSITION_EMBEDDING_TYPES = ("learned_absolute", "rope", "none")
NORMALIZATIONS = ("LayerNorm", "RMSNorm")
# Flags that change the model's parameters or its function: recorded in checkpoints
# (rapidgpt/training/checkpoint_files.py), so a run that loads one needs none of them again.
ARCHITECTURE_FLAGS = ("position_embedding_type", "rotary_base", "rotary_percent", "rotary_interleaved",
                      "use_rope_scaling", "rope_scaling_factor", "rope_scaling_low_freq_factor",
                      "rope_scaling_high_freq_factor", "rope_scaling_original_max_position_embeddings",
                      "normalization", "apply_layernorm_1p", "swiglu", "squared_relu", "group_query_attention",
                      "num_query_groups",
                      "kv_channels",
                      "add_bias_linear", "add_qkv_bias", "qk_layernorm", "bias_gelu_fusion",
                      "use_mup", "mup_base_hidden_size", "mup_embedding_mult", "mup_output_mult", "mup_base_head_dim",
                      "mup_attn_scale_power") + MLA_FLAGS


def add_architecture_args(parser):
    g = parser.add_argument_group("architecture (Megatron-core's GPTModel: GPT-2 by default, the Llama family by flags)")
    g.add_argument("--position-embedding-type", choices=POSITION_EMBEDDING_TYPES, default="learned_absolute",
                   help="learned_absolute: GPT-2's learned table; rope: rotary embeddings on q and k; none")
    g.add_argument("--use-rotary-position-embeddings", action="store_true",
                   help="Megatron's older spelling of --position-embedding-type rope")
    g.add_argument("--rotary-base", type=int, default=10000, help="RoPE's base (theta): Llama 2 10000, Llama 3 500000")
    g.add_argument("--rotary-percent", type=float, default=1.0,
                   help="fraction of each head's channels that are rotated (the rest pass unchanged)")
    g.add_argument("--rotary-interleaved", action="store_true",
                   help="rotate channel pairs (2i, 2i+1) instead of (i, i + d/2) (Llama's and Megatron's default)")
    g.add_argument("--use-rope-scaling", action="store_true",
                   help="Llama 3.1's RoPE frequency scaling (long context)")
    g.add_argument("--rope-scaling-factor", type=float, default=8.0, help="Llama 3.1 scaling: factor")
    g.add_argument("--rope-scaling-low-freq-factor", type=float, default=1.0,
                   help="Llama 3.1 scaling: low_freq_factor (Megatron fixes it at 1)")
    g.add_argument("--rope-scaling-high-freq-factor", type=float, default=4.0,
                   help="Llama 3.1 scaling: high_freq_factor (Megatron fixes it at 4)")
    g.add_argument("--rope-scaling-original-max-position-embeddings", type=int, default=8192,
                   help="Llama 3.1 scaling: the context length the model was first trained at (Megatron fixes 8192)")
    g.add_argument("--normalization", choices=NORMALIZATIONS, default="LayerNorm")
    g.add_argument("--apply-layernorm-1p", action="store_true",
                   help="norm weights stored centred on zero: the scale applied is 1 + weight")
    g.add_argument("--swiglu", action="store_true",
                   help="gated MLP: silu(x W_gate) * (x W_up), then the down projection")
    g.add_argument("--squared-relu", action="store_true",
                   help="MLP activation relu(x)^2 (Nemotron's), instead of GELU; not gated, not with --swiglu")
    g.add_argument("--group-query-attention", action="store_true",
                   help="grouped-query attention: --num-query-groups key/value heads shared by the query heads")
    g.add_argument("--num-query-groups", type=int, default=None)
    g.add_argument("--kv-channels", type=int, default=None, help="channels per attention head; default hidden / heads")
    g.add_argument("--disable-bias-linear", action="store_false", dest="add_bias_linear",
                   help="no biases in the attention and MLP linear layers")
    g.add_argument("--add-qkv-bias", action="store_true",
                   help="a bias on the query/key/value projection even with --disable-bias-linear (Qwen2)")
    g.add_argument("--qk-layernorm", action="store_true",
                   help="normalise each head's query and key (the --normalization kind) before RoPE (Qwen3); with "
                        "--multi-latent-attention, its query and key/value latents")
    g.add_argument("--no-bias-gelu-fusion", action="store_false", dest="bias_gelu_fusion",
                   help="GPT's GELU as Megatron computes it unfused: exact (erf). Megatron's fused bias-GELU "
                        "kernel, its default, is the tanh form; without biases (--disable-bias-linear) Megatron "
                        "never fuses, so its GELU is exact then too")
    g = parser.add_argument_group("sequence parallelism")
    g.add_argument("--sequence-parallel", action="store_true",
                   help="with --tensor-model-parallel-size > 1: the norm, dropout and residual regions hold "
                        "1/TP of the sequence on each rank (Megatron's; the same numbers, less activation memory)")


def check_architecture_args(args, check):
    """Validate into `check` (a flag_parser.Problems) and fill Megatron's derived defaults."""
    if args.use_rotary_position_embeddings:
        args.position_embedding_type = "rope"
    check.require(0.0 < args.rotary_percent <= 1.0,
                  f"--rotary-percent: must be in (0, 1], got {args.rotary_percent}")
    check.require(args.rotary_base > 0, f"--rotary-base: must be positive, got {args.rotary_base}")
    if args.use_rope_scaling:
        check.require(args.position_embedding_type == "rope",
                      "--use-rope-scaling: scales rotary embeddings; add --position-embedding-type rope")
        check.require(args.rope_scaling_factor >= 1.0 and
                      args.rope_scaling_high_freq_factor > args.rope_scaling_low_freq_factor > 0,
                      "--rope-scaling-factor: Llama 3.1 scaling needs factor >= 1 and high_freq_factor > "
                      "low_freq_factor > 0")
    heads = args.num_attention_heads
    if args.kv_channels is None and heads > 0:
        if check.require(args.hidden_size % heads == 0,
                         f"--hidden-size: {args.hidden_size} is not divisible by --num-attention-heads {heads}; "
                         f"choose sizes whose heads are equal, or give --kv-channels"):
            args.kv_channels = args.hidden_size // heads
    if args.num_query_groups is None:
        args.num_query_groups = 1 if args.group_query_attention else heads
    elif not args.group_query_attention:
        check.require(args.num_query_groups == heads,
                      f"--num-query-groups: {args.num_query_groups} needs --group-query-attention")
    if heads > 0:
        check.require(args.num_query_groups > 0 and heads % args.num_query_groups == 0,
                      f"--num-query-groups: {args.num_query_groups} must divide --num-attention-heads {heads}")
    check.require(not (args.squared_relu and args.swiglu),
                  "--squared-relu: not with --swiglu (the gated MLP's activation is SiLU); give one of them")
    if args.ffn_hidden_size is None:
        args.ffn_hidden_size = int(4 * args.hidden_size * 2 / 3 / 64) * 64 if args.swiglu else 4 * args.hidden_size
    if args.sequence_parallel:
        _check_sequence_parallel(args, check)
    if args.position_embedding_type == "rope" and args.kv_channels:
        check.require(rotary_dim(args.kv_channels, args.rotary_percent) >= 2,
                      f"--rotary-percent: {args.rotary_percent} of {args.kv_channels} channels rotates no pair")


def _check_sequence_parallel(args, check):
    tp = args.tensor_model_parallel_size
    if tp == 1:
        args.sequence_parallel = False            # Megatron's rule: nothing to split
        return
    check.require(args.seq_length % tp == 0,
                  f"--sequence-parallel: --seq-length {args.seq_length} is not divisible by "
                  f"--tensor-model-parallel-size {tp}; each TP rank holds an equal part of the sequence")
    check.require(args.task != "text_generation",
                  "--sequence-parallel: generation runs the whole sequence on every TP rank; drop the flag "
                  "(a model trained with it generates without it)")


def rotary_dim(kv_channels, rotary_percent):
    """Channels of a head that RoPE rotates: an even number, as Megatron's int(d * percent)."""
    return int(kv_channels * rotary_percent) // 2 * 2


@dataclass(frozen=True)
class TransformerConfig:
    """What the built-in decoder and encoder layers are made from (rapidgpt/models/)."""
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    seq_length: int
    max_position_embeddings: int
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    init_method_std: float = 0.02
    embedding_init_method_std: float = None       # None: init_method_std
    layernorm_epsilon: float = 1e-5
    attention_softmax_in_fp32: bool = False
    apply_query_key_layer_scaling: bool = False
    position_embedding_type: str = "learned_absolute"
    rotary_base: int = 10000
    rotary_percent: float = 1.0
    rotary_interleaved: bool = False
    use_rope_scaling: bool = False
    rope_scaling_factor: float = 8.0
    rope_scaling_low_freq_factor: float = 1.0
    rope_scaling_high_freq_factor: float = 4.0
    rope_scaling_original_max_position_embeddings: int = 8192
    normalization: str = "LayerNorm"
    apply_layernorm_1p: bool = False
    swiglu: bool = False
    num_query_groups: int = None
    kv_channels: int = None
    add_bias_linear: bool = True
    add_qkv_bias: bool = False
    qk_layernorm: bool = False
    sequence_parallel: bool = False
    # GPT's; BERT (rapidgpt/models/bert.py) sets bidirectional attention and the exact GELU.
    causal: bool = True
    activation: str = "gelu_tanh"         # of the MLP without --swiglu: gelu_tanh, gelu (exact) or squared_relu
    # Which layers each pipeline stage builds (rapidgpt/config/pipeline_split.py); None: evenly.
    pipeline_split: object = None
    # --use-mup's init, attention scale and multipliers (rapidgpt/config/mup.py); none by default.
    mup: MupConfig = MupConfig()
    # --multi-latent-attention's shapes and rotary embedding (rapidgpt/config/mla.py); off by default.
    mla: MlaConfig = MlaConfig()

    def __post_init__(self):
        if self.kv_channels is None:
            object.__setattr__(self, "kv_channels", self.hidden_size // self.num_attention_heads)
        if self.num_query_groups is None:
            object.__setattr__(self, "num_query_groups", self.num_attention_heads)

    @classmethod
    def from_args(cls, args):
        names = [f for f in cls.__dataclass_fields__ if f not in ("causal", "activation")]
        config = cls(**{name: getattr(args, name) for name in names if hasattr(args, name)})
        # Megatron-core's MLP (GELU, not gated): the fused bias-GELU kernel is the tanh approximation,
        # and it is used only with --bias-gelu-fusion and biases; otherwise torch's exact F.gelu.
        fused = getattr(args, "bias_gelu_fusion", True) and config.add_bias_linear
        activation = "squared_relu" if getattr(args, "squared_relu", False) else "gelu_tanh" if fused else "gelu"
        return dataclasses.replace(config, activation=activation)

    @property
    def embedding_init_std(self):
        """The embeddings' init std (Megatron's embedding_init_method): --embedding-init-method-std,
        by default --init-method-std, never scaled by muP."""
        return self.init_method_std if self.embedding_init_method_std is None else self.embedding_init_method_std

    @property
    def output_layer_init_std(self):
        """An untied output layer's init std: Megatron's init_method, or with --use-mup its
        embedding_init_method."""
        return self.embedding_init_std if self.mup.enabled else self.init_method_std

    @property
    def hidden_init_std(self):
        """The init std of the layers' other matrices (muP: divided by sqrt(width multiplier))."""
        return self.init_method_std / math.sqrt(self.mup.width_mult)

    @property
    def output_init_std(self):
        """Megatron's scaled init of the layers that write into the residual stream (muP: divided
        by sqrt(width multiplier) too)."""
        return self.hidden_init_std / math.sqrt(2.0 * self.num_layers)

    @property
    def qkv_bias(self):
        return self.add_bias_linear or self.add_qkv_bias

    @property
    def rotary_dim(self):
        return rotary_dim(self.kv_channels, self.rotary_percent)
