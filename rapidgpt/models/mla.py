"""Multi-latent attention (DeepSeek-V2/V3's MLA), as Megatron-core's MLASelfAttention computes it; its
flags and rotary embedding: rapidgpt/config/mla.py.

For x `[b, s, h]`, n heads, latent ranks R_q and R_kv, head channels D (query/key), P (rotary), V:

    q_latent = norm_q(x W_q_down)                 [b, s, R_q]        (no R_q: q = x W_q directly)
    q        = q_latent W_q_up                    [b, s, n, D + P]:  q_nope | q_pos
    kv, k_pos = split(x W_kv_down)                [b, s, R_kv], [b, s, P]  (one k_pos for every head)
    k_nope | v = norm_kv(kv) W_kv_up              [b, s, n, D + V]
    q = q_nope | rope(q_pos),  k = k_nope | rope(k_pos)       scores x mscale^2 / sqrt(D + P)
    out = attention(q, k, v) W_proj               [b, s, h]

The norms exist with --qk-layernorm (--normalization's kind). rope reads the P channels as the
pairs (2i, 2i+1) (Megatron's MLA order: they are de-interleaved, then turned as rotate_half), by
the model's rotary tables (rapidgpt/models/rotary.py: YaRN's, or RoPE's). Parameters keep
Megatron-core's names (linear_q_down_proj, linear_q_up_proj or linear_q_proj, linear_kv_down_proj,
linear_kv_up_proj, q_layernorm, kv_layernorm); the output projection is `dense`, as the other
attention's.

Tensor parallelism: the up projections are column-parallel (each rank its heads' rows), the output
row-parallel; the down projections and the latent norms are whole on every rank. A rank's heads use
all of the latents, so each latent's gradient is a sum over the ranks: the up projections' input
copy sums it (as any column-parallel layer's), and k_pos, used by every head, passes a copy of its
own. With --sequence-parallel (Megatron's layout with Transformer Engine's duplicated down
projections) the down projections and norms work on this rank's part of the sequence, the up
projections gather the latents along it and k_pos is gathered too (their gradients reduce-scattered
back), and the down projections' and norms' weight gradients are summed over the TP ranks.
"""
from mindspore import ops

from rapidgpt.models.attention import CoreAttention, SelfAttention
from rapidgpt.models.norms import build_norm
from rapidgpt.models.rotary import apply_rotary
from rapidgpt.parallel.layers import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear, divide
from rapidgpt.parallel.mappings import CopyToTensorParallelRegion, GatherFromSequenceParallelRegion
from rapidgpt.parallel.state import get_tensor_model_parallel_world_size


def pairs_first(x, rotated):
    """x `[..., P]` with its first `rotated` channels reordered from pairs (x0 x1)(x2 x3).. to
    x0 x2 .. x1 x3 .. (Megatron's MLA de-interleaving before rotate_half); the rest as they are."""
    head, rest = (x, None) if rotated == x.shape[-1] else ops.split(x, [rotated, x.shape[-1] - rotated], axis=-1)
    even, odd = ops.split(head.reshape(*head.shape[:-1], rotated // 2, 2), 1, axis=-1)
    head = ops.cat((even.squeeze(-1), odd.squeeze(-1)), axis=-1)
    return head if rest is None else ops.cat((head, rest), axis=-1)


class MultiLatentAttention(SelfAttention):
    """Multi-latent self-attention over `x` `[b, s, h]` -> `[b, s, h]` (module docstring) of layer
    `layer_number` (1-based)."""

    def __init__(self, config, layer_number=1):
        super().__init__(config)
        mla, h, std = config.mla, config.hidden_size, config.hidden_init_std
        tp = get_tensor_model_parallel_world_size()
        n = config.num_attention_heads
        self.heads_per_rank = divide(n, tp, "number of attention heads")
        self.qk_dim, self.pos_dim, self.v_dim = mla.qk_head_dim, mla.qk_pos_emb_head_dim, mla.v_head_dim
        self.kv_lora_rank = mla.kv_lora_rank
        sp = config.sequence_parallel and tp > 1          # the latents are computed on s / tp
        self.q_lora = mla.q_lora_rank is not None
        self.qk_layernorm = config.qk_layernorm
        if self.q_lora:
            self.linear_q_down_proj = ReplicatedLinear(h, mla.q_lora_rank, bias=False, init_std=std, summed_over_tp=sp)
            if config.qk_layernorm:
                self.q_layernorm = build_norm(config, mla.q_lora_rank, summed_over_tp=sp)
            self.linear_q_up_proj = ColumnParallelLinear(mla.q_lora_rank, n * mla.q_head_dim, bias=False, init_std=std,
                                                         sequence_parallel=sp)
        else:
            self.linear_q_proj = ColumnParallelLinear(h, n * mla.q_head_dim, bias=False, init_std=std,
                                                      sequence_parallel=sp)
        self.linear_kv_down_proj = ReplicatedLinear(h, mla.kv_lora_rank + mla.qk_pos_emb_head_dim, bias=False,
                                                    init_std=std, summed_over_tp=sp)
        if config.qk_layernorm:
            self.kv_layernorm = build_norm(config, mla.kv_lora_rank, summed_over_tp=sp)
        self.linear_kv_up_proj = ColumnParallelLinear(mla.kv_lora_rank, n * (mla.qk_head_dim + mla.v_head_dim),
                                                      bias=False, init_std=std, sequence_parallel=sp)
        self.k_pos_to_heads = None
        if tp > 1:
            self.k_pos_to_heads = GatherFromSequenceParallelRegion() if sp else CopyToTensorParallelRegion()
        self.dense = RowParallelLinear(n * mla.v_head_dim, h, bias=config.add_bias_linear,
                                       init_std=config.output_init_std, sequence_parallel=sp)
        self.core_attention = CoreAttention(config, mla.q_head_dim, layer_number, scale=mla.softmax_scale)

    def heads(self, x, rotary=None):
        """q, k `[b, n, s, D + P]` and v `[b, n, s, V]` of this rank's n heads (rotated by
        `rotary`, the model's tables for the P channels)."""
        if self.q_lora:
            latent = self.linear_q_down_proj(x)
            q = self.linear_q_up_proj(self.q_layernorm(latent) if self.qk_layernorm else latent)
        else:
            q = self.linear_q_proj(x)
        kv, k_pos = ops.split(self.linear_kv_down_proj(x), [self.kv_lora_rank, self.pos_dim], axis=-1)
        kv = self.linear_kv_up_proj(self.kv_layernorm(kv) if self.qk_layernorm else kv)
        if self.k_pos_to_heads is not None:
            k_pos = self.k_pos_to_heads(k_pos)
        b, s, _ = q.shape
        n = self.heads_per_rank
        q = q.reshape(b, s, n, self.qk_dim + self.pos_dim).transpose(0, 2, 1, 3)             # [b, n, s, D + P]
        kv = kv.reshape(b, s, n, self.qk_dim + self.v_dim).transpose(0, 2, 1, 3)
        q_nope, q_pos = ops.split(q, [self.qk_dim, self.pos_dim], axis=-1)
        k_nope, v = ops.split(kv, [self.qk_dim, self.v_dim], axis=-1)
        k_pos = ops.expand_dims(k_pos, 1)                                                     # [b, 1, s, P]
        rotary = self.rounded(rotary)                   # a bf16 run's cos and sin are in bf16 too
        rotated = rotary.shape[-1]
        q_pos = self.rounded(apply_rotary(pairs_first(q_pos, rotated), rotary))
        k_pos = self.rounded(apply_rotary(pairs_first(k_pos, rotated), rotary))
        k_pos = ops.broadcast_to(k_pos, (b, n, s, self.pos_dim))
        return ops.cat((q_nope, q_pos), axis=-1), ops.cat((k_nope, k_pos), axis=-1), v

    def attend(self, q, k, v, mask):
        return self.dense(self.core_attention(q, k, v, mask))
