"""Multi-latent attention (DeepSeek-V2/V3's MLA): Megatron-core's flags, their checks, and `MlaConfig`.

    --multi-latent-attention
    --q-lora-rank R_q          queries through a rank-R_q latent (None: a direct projection)
    --kv-lora-rank R_kv        keys and values through a rank-R_kv latent (Megatron's default 32)
    --qk-head-dim D            each head's query/key channels without position (128)
    --qk-pos-emb-head-dim P    each head's rotated query channels, and the key's, shared by the heads (64)
    --v-head-dim V             each head's value channels (128)
    --rope-type {rope,yarn}    MLA's rotary embedding (Megatron's default for MLA: yarn)
    --rotary-scaling-factor F --mscale M --mscale-all-dim A     YaRN's (defaults 1, 1, 0)

The layer (rapidgpt/models/mla.py) follows Megatron-core's MLASelfAttention; its latent norms
exist with --qk-layernorm. The rotary embedding turns the P positional channels (read as the
pairs (2i, 2i+1), Megatron's MLA order) by YaRN's frequencies: for i < P/2 with ramp
r_i = clamp((i - low) / (high - low), 0, 1) over the correction range [low, high] (beta_fast 32,
beta_slow 1, original context 4096: Megatron's fixed values),

    inv_freq_i = (1 - r_i) base^(-2i/P) + r_i base^(-2i/P) / F,

its cos and sin multiplied by mscale(F, M) / mscale(F, A), mscale(F, m) = 0.1 m ln F + 1 (1 when
F <= 1); the scores are scaled by mscale(F, A)^2 / sqrt(D + P). With `--rope-type rope` the
frequencies are RoPE's over int(P * --rotary-percent) channels and nothing is scaled. At F = 1
(Megatron's default) YaRN is plain RoPE. `--position-embedding-type` stays the model's own: the
learned positions (its default) are added to the embeddings as well, as Megatron's GPTModel does.
"""
import math
from dataclasses import dataclass

import numpy as np

ROPE_TYPES = ("rope", "yarn")
# YaRN's settings MLATransformerConfig fixes (Megatron's command line does not reach them for MLA).
YARN_ORIGINAL_MAX_POSITION_EMBEDDINGS, YARN_BETA_FAST, YARN_BETA_SLOW = 4096, 32.0, 1.0
MLA_FLAGS = ("multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim",
             "v_head_dim", "rope_type", "rotary_scaling_factor", "mscale", "mscale_all_dim")


def yarn_mscale(scale, mscale=1.0):
    """YaRN's attention factor for a context scaled by `scale` (1 when not scaled up)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


@dataclass(frozen=True)
class MlaConfig:
    enabled: bool = False
    q_lora_rank: int = None
    kv_lora_rank: int = 32
    qk_head_dim: int = 128
    qk_pos_emb_head_dim: int = 64
    v_head_dim: int = 128
    rope_type: str = "yarn"
    rotary_scaling_factor: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0

    @property
    def q_head_dim(self):
        return self.qk_head_dim + self.qk_pos_emb_head_dim

    @property
    def softmax_scale(self):
        return yarn_mscale(self.rotary_scaling_factor, self.mscale_all_dim) ** 2 / math.sqrt(self.q_head_dim)

    @property
    def rotary_scale(self):
        """What the rotary cos and sin are multiplied by (YaRN's concentration factor)."""
        if self.rope_type == "rope":
            return 1.0
        return (yarn_mscale(self.rotary_scaling_factor, self.mscale)
                / yarn_mscale(self.rotary_scaling_factor, self.mscale_all_dim))

    def rotary_dim(self, rotary_percent):
        """The rotated positional channels: all P under YaRN, int(P * percent) under RoPE."""
        if self.rope_type == "yarn":
            return self.qk_pos_emb_head_dim
        return int(self.qk_pos_emb_head_dim * rotary_percent) // 2 * 2

    def inverse_frequencies(self, rotary_base, rotary_percent):
        """inv_freq `[rotary_dim / 2]` float64 (module docstring)."""
        dim = self.rotary_dim(rotary_percent)
        base = 1.0 / rotary_base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
        if self.rope_type == "rope":
            return base

        def correction(rotations):      # the channel whose wavelength fits `rotations` turns in the context
            return dim * math.log(YARN_ORIGINAL_MAX_POSITION_EMBEDDINGS / (rotations * 2 * math.pi)) / (
                2 * math.log(rotary_base))
        low = max(math.floor(correction(YARN_BETA_FAST)), 0)
        high = min(math.ceil(correction(YARN_BETA_SLOW)), dim - 1)
        ramp = np.clip((np.arange(dim // 2) - low) / ((high - low) or 0.001), 0, 1)
        return (1 - ramp) * base + ramp * base / self.rotary_scaling_factor

    def describe(self):
        q = f"queries through a rank-{self.q_lora_rank} latent" if self.q_lora_rank else "queries projected directly"
        rope = (f"YaRN (factor {self.rotary_scaling_factor:g}, mscale {self.mscale:g}, mscale_all_dim "
                f"{self.mscale_all_dim:g})" if self.rope_type == "yarn" else "RoPE")
        return (f" > multi-latent attention: {q}, keys and values through a rank-{self.kv_lora_rank} latent; per head "
                f"{self.qk_head_dim} + {self.qk_pos_emb_head_dim} (rotary, {rope}) query/key channels, "
                f"{self.v_head_dim} value channels; scores x{self.softmax_scale:.6g}")


def add_mla_args(parser):
    g = parser.add_argument_group("multi-latent attention (DeepSeek's MLA, Megatron-core's MLASelfAttention)")
    g.add_argument("--multi-latent-attention", action="store_true",
                   help="attention through low-rank query and key/value latents, with separate rotary channels")
    g.add_argument("--q-lora-rank", type=int, default=None, help="rank of the query latent (none: direct)")
    g.add_argument("--kv-lora-rank", type=int, default=32, help="rank of the key/value latent")
    g.add_argument("--qk-head-dim", type=int, default=128, help="query/key channels per head without position")
    g.add_argument("--qk-pos-emb-head-dim", type=int, default=64, help="rotated query/key channels per head")
    g.add_argument("--v-head-dim", type=int, default=128, help="value channels per head")
    g.add_argument("--rope-type", choices=ROPE_TYPES, default=None,
                   help="MLA's rotary embedding (default yarn); the standard attention's is rope")
    g.add_argument("--rotary-scaling-factor", type=float, default=1.0, help="YaRN's context scaling factor")
    g.add_argument("--mscale", type=float, default=1.0, help="YaRN's mscale")
    g.add_argument("--mscale-all-dim", type=float, default=0.0, help="YaRN's mscale_all_dim")


def check_mla_args(args, check):
    """args.mla (an MlaConfig); MLA's flags without it, and what it does not combine with, refused."""
    args.mla = MlaConfig()
    if not args.multi_latent_attention:
        check.require(args.rope_type in (None, "rope"),
                      "--rope-type yarn: YaRN goes with --multi-latent-attention here (the standard attention's "
                      "rotary embedding is RoPE, --position-embedding-type rope)")
        given = [f"--{name.replace('_', '-')}" for name in MLA_FLAGS[1:] if name != "rope_type"
                 and getattr(args, name) != MlaConfig.__dataclass_fields__[name].default]
        check.require(not given, f"{', '.join(given)}: multi-latent attention's settings; add "
                                 f"--multi-latent-attention, or drop them")
        return
    refusals = [("--group-query-attention", args.group_query_attention,
                 "multi-latent attention shares one key latent, not query groups (Megatron refuses the pair too)"),
                ("--rotary-interleaved", args.rotary_interleaved,
                 "multi-latent attention reads its rotary channels as pairs (2i, 2i+1) already"),
                ("--use-rope-scaling", args.use_rope_scaling, "Llama 3.1's scaling is not MLA's; use YaRN's flags"),
                ("--use-mup", args.use_mup, "muP's attention scale is not built for MLA"),
                ("--model-type bert", args.model_type == "bert", "multi-latent attention is a decoder's (GPT's)"),
                ("--pretrained-model-name-or-path", args.pretrained_model_name_or_path,
                 "Hugging Face's DeepSeek folders are not read; convert a Megatron checkpoint "
                 "(data_tools/convert_megatron.py) or train from scratch")]
    for flag, given, reason in refusals:
        check.require(not given, f"{flag}: not with --multi-latent-attention: {reason}")
    sizes = {"--kv-lora-rank": args.kv_lora_rank, "--qk-head-dim": args.qk_head_dim,
             "--qk-pos-emb-head-dim": args.qk_pos_emb_head_dim, "--v-head-dim": args.v_head_dim}
    if args.q_lora_rank is not None:
        sizes["--q-lora-rank"] = args.q_lora_rank
    for flag, size in sizes.items():
        check.require(size > 0, f"{flag}: must be positive, got {size}")
    check.require(args.qk_pos_emb_head_dim % 2 == 0,
                  f"--qk-pos-emb-head-dim: {args.qk_pos_emb_head_dim} must be even (channel pairs are rotated)")
    check.require(args.rotary_scaling_factor > 0, f"--rotary-scaling-factor: must be positive, got "
                                                  f"{args.rotary_scaling_factor}")
    args.mla = MlaConfig(True, args.q_lora_rank, args.kv_lora_rank, args.qk_head_dim, args.qk_pos_emb_head_dim,
                         args.v_head_dim, args.rope_type or "yarn", args.rotary_scaling_factor, args.mscale,
                         args.mscale_all_dim)
    check.require(args.mla.rotary_dim(args.rotary_percent) >= 2,
                  f"--rotary-percent: {args.rotary_percent} of --qk-pos-emb-head-dim {args.qk_pos_emb_head_dim} "
                  f"rotates no pair")
