"""GPT's decoder layer from tensor-parallel layers: pre-LayerNorm attention and MLP blocks.

Layout: hidden states are `[b, s, h]` (batch, sequence, hidden). Each layer computes

    x = x + dropout(attention(layernorm(x)))
    x = x + dropout(mlp(layernorm(x)))

Attention: one ColumnParallelLinear makes q, k, v for this rank's heads, laid out per head as
`[np, 3, hn]` (Megatron's order, so a TP split of the output keeps each head's q, k and v
together); the core attention (its own cell, what selective recompute recomputes): scores
`q k^T / sqrt(hn)` get the causal mask (and, with --reset-attention-mask, the batch's document
mask) filled with -10000 as Megatron does, softmax (in fp32 for fp32 models and with
--attention-softmax-in-fp32, else in the model's 16-bit dtype, as Megatron), attention dropout,
probabilities x values; then the RowParallelLinear output projection. Dropout is rapidgpt.parallel.random.Dropout: its
masks survive a resume and do not depend on the TP layout. MLP: ColumnParallelLinear h -> ffn, tanh-GELU
(GPT-2's `gelu_new`), RowParallelLinear ffn -> h. Output projections use Megatron's scaled init
std / sqrt(2 * num_layers).

Mixed precision: in a 16-bit model every matrix product runs in 16-bit, while LayerNorm computes
in fp32 (`LayerNorm` below) and the GPT's loss too (rapidgpt/models/gpt.py).

ZeRO-3 (rapidgpt/parallel/fully_sharded.py): every layer here that owns parameters is a
ShardableLayer and gathers its own weights (`whole_weights()`); the composite cells hold no
ZeRO-3 code.
"""
import math

import numpy as np
from mindspore import Tensor, nn, ops
import mindspore as ms

from rapidgpt.parallel.fully_sharded import ShardableLayer
from rapidgpt.parallel.layers import ColumnParallelLinear, RowParallelLinear, divide
from rapidgpt.parallel.random import Dropout
from rapidgpt.parallel.state import get_tensor_model_parallel_world_size


class TransformerConfig:
    """The architecture flags a transformer needs (read from the args namespace)."""

    def __init__(self, args):
        self.num_layers = args.num_layers
        self.hidden_size = args.hidden_size
        self.num_attention_heads = args.num_attention_heads
        self.ffn_hidden_size = args.ffn_hidden_size
        self.seq_length = args.seq_length
        self.max_position_embeddings = args.max_position_embeddings
        self.hidden_dropout = args.hidden_dropout
        self.attention_dropout = args.attention_dropout
        self.init_method_std = args.init_method_std
        self.layernorm_epsilon = args.layernorm_epsilon
        self.attention_softmax_in_fp32 = getattr(args, "attention_softmax_in_fp32", False)
        # GPT's; BERT (rapidgpt/models/bert.py) sets bidirectional attention and the exact GELU.
        self.causal = True
        self.activation = "gelu_tanh"

    @property
    def output_init_std(self):
        return self.init_method_std / math.sqrt(2.0 * self.num_layers)


def composite_layer_norm(x, gamma, beta, epsilon):
    """LayerNorm over the last axis of `x` `[..., h]` written as the ops it is made of (mean,
    biased variance, normalisation, scale and shift), so that graph kernel fusion fuses it and its
    gradient into generated kernels. Why (MindSpore 2.10, CPU): its LayerNorm kernels are slow
    (forward and backward of `[1024, 256]`: 7.3-8.7 ms, this form fused: 1.75 ms; `[2048, 768]`: ~32
    ms for the kernel's backward alone), ~9% of the bench model's step. MindSpore's own expansion of
    those kernels (rapidgpt/config/kernel_fusion.py) computes a wrong forward at TP=2 with
    recompute; this form does not (the TP-with-recompute, pipeline and ZeRO equivalence tests hold
    with it)."""
    mean = x.mean(-1, keep_dims=True)
    centred = x - mean
    variance = (centred * centred).mean(-1, keep_dims=True)
    return centred * ops.rsqrt(variance + epsilon) * gamma + beta


class LayerNorm(ShardableLayer, nn.LayerNorm):
    """mindspore.nn.LayerNorm (same parameters, `gamma` and `beta`) computed in fp32 whatever the
    input and parameter dtype, the result in the input's dtype: Megatron's fused LayerNorm
    semantics for 16-bit models. A no-op cast in fp32 models. `composite` (set where the CPU step is fused,
    rapidgpt/training/model_transforms.py): fp32 LayerNorm as `composite_layer_norm` instead of
    MindSpore's kernel -- the same formula, rounded differently (~1e-7 relative)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.weight_names = ("gamma", "beta")
        self.composite = False

    def construct(self, x):
        gamma, beta = self.whole_weights()
        if x.dtype == ms.float32 and gamma.dtype == ms.float32:      # decided while compiling
            if self.composite:
                return composite_layer_norm(x, gamma, beta, self.epsilon)
            y, _, _ = self.layer_norm(x, gamma, beta)
            return y
        y, _, _ = self.layer_norm(x.astype(ms.float32), gamma.astype(ms.float32), beta.astype(ms.float32))
        return y.astype(x.dtype)


def mask_scores(scores, mask):
    """Megatron's `scores.masked_fill(mask, -10000.0)`. For fp32 scores it is written as
    `scores * keep + fill`, which gives the same values for finite scores and the same gradient
    (zero where hidden), and which graph kernel fusion fuses with the scaling before it; MindSpore's
    CPU MaskedFill is a kernel of its own, forward and backward (~4 ms per layer on the bench model).
    16-bit scores keep masked_fill: an fp16 product can overflow to inf, and inf * 0 is NaN."""
    if scores.dtype != ms.float32:
        return ops.masked_fill(scores, mask, -10000.0)
    hidden = mask.astype(ms.float32)
    return scores * (1.0 - hidden) + hidden * -10000.0


class CoreAttention(nn.Cell):
    """Softmax attention of q `[b, np, sq, hn]` over k, v `[b, np, sk, hn]`; mask True = hidden.
    Returns the context `[b, sq, np*hn]`. No parameters: selective recompute recomputes exactly this."""

    def __init__(self, config, head_dim):
        super().__init__()
        self.attention_dropout = Dropout(config.attention_dropout, partition_dim=1)   # heads are split
        self.scores = ops.BatchMatMul(transpose_b=True)
        self.scale = 1.0 / math.sqrt(head_dim)
        self.softmax_in_fp32 = config.attention_softmax_in_fp32

    def construct(self, q, k, v, mask):
        b, _, sq, _ = q.shape
        scores = mask_scores(self.scores(q, k) * self.scale, mask)                   # [b, np, sq, sk]
        if self.softmax_in_fp32:
            scores = scores.astype(ms.float32)
        probs = self.attention_dropout(ops.softmax(scores, axis=-1).astype(v.dtype))
        return ops.matmul(probs, v).transpose(0, 2, 1, 3).reshape(b, sq, -1)       # [b, sq, np*hn]


class ParallelAttention(nn.Cell):
    def __init__(self, config):
        super().__init__()
        tp = get_tensor_model_parallel_world_size()
        self.heads_per_rank = divide(config.num_attention_heads, tp, "number of attention heads")
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.query_key_value = ColumnParallelLinear(config.hidden_size, 3 * config.hidden_size,
                                                    init_std=config.init_method_std)
        self.dense = RowParallelLinear(config.hidden_size, config.hidden_size,
                                       init_std=config.output_init_std)
        self.core_attention = CoreAttention(config, self.head_dim)
        n = config.max_position_embeddings
        self.causal = config.causal
        self.causal_mask = Tensor(np.triu(np.ones((1, 1, n, n), bool), k=1))   # True = masked

    def heads(self, x):
        """q, k, v `[b, np, s, hn]` of this rank's heads."""
        b, s, _ = x.shape
        qkv = self.query_key_value(x).reshape(b, s, self.heads_per_rank, 3 * self.head_dim)
        # A split of the last axis, not qkv[..., i, :] slices: MindSpore's CPU StridedSlice kernel
        # copies element by element (~4x slower here, benchmarks/bench_pretrain.py's profile).
        q, k, v = ops.split(qkv, self.head_dim, axis=-1)                         # [b, s, np, hn]
        return q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)

    def construct(self, x, attention_mask=None):
        """`attention_mask`
        (True = hidden) is added to the causal mask, or is the whole mask when not causal
        (BERT's padding mask `[b, 1, 1, s]`: every query sees every real key)."""
        s = x.shape[1]
        if not self.causal:
            mask = attention_mask
        elif attention_mask is None:
            mask = self.causal_mask[:, :, :s, :s]
        else:
            mask = ops.logical_or(self.causal_mask[:, :, :s, :s], attention_mask)
        return self.dense(self.core_attention(*self.heads(x), mask))

    def decode(self, x, past=None):
        """Incremental attention for generation: x `[b, s_new, h]` after `past` = (k, v) of the
        earlier positions (None: none). Returns (output, (k, v) including the new positions)."""
        q, k, v = self.heads(x)
        if past is not None:
            k, v = ops.cat((past[0], k), axis=2), ops.cat((past[1], v), axis=2)
        total, new = k.shape[2], x.shape[1]
        mask = self.causal_mask[:, :, total - new:total, :total]
        return self.dense(self.core_attention(q, k, v, mask)), (k, v)


class ParallelMLP(nn.Cell):
    def __init__(self, config):
        super().__init__()
        self.dense_h_to_4h = ColumnParallelLinear(config.hidden_size, config.ffn_hidden_size,
                                                  init_std=config.init_method_std)
        self.dense_4h_to_h = RowParallelLinear(config.ffn_hidden_size, config.hidden_size,
                                               init_std=config.output_init_std)
        self.approximate = {"gelu_tanh": "tanh", "gelu": "none"}[config.activation]

    def construct(self, x):
        h = self.dense_h_to_4h(x)
        return self.dense_4h_to_h(ops.gelu(h, approximate=self.approximate))


class ParallelTransformerLayer(nn.Cell):
    """GPT's pre-LayerNorm decoder layer (see the module docstring)."""

    def __init__(self, config):
        super().__init__()
        eps = config.layernorm_epsilon
        self.input_layernorm = LayerNorm((config.hidden_size,), epsilon=eps)
        self.self_attention = ParallelAttention(config)
        self.post_attention_layernorm = LayerNorm((config.hidden_size,), epsilon=eps)
        self.mlp = ParallelMLP(config)
        # Two cells, so the two residual branches draw different masks.
        self.post_attention_dropout = Dropout(config.hidden_dropout)
        self.post_mlp_dropout = Dropout(config.hidden_dropout)

    def construct(self, x, attention_mask=None):
        x = x + self.post_attention_dropout(self.self_attention(self.input_layernorm(x), attention_mask))
        return x + self.post_mlp_dropout(self.mlp(self.post_attention_layernorm(x)))

    def decode(self, x, past=None):
        """The layer with cached keys/values (generation, eval mode); returns (x, present)."""
        attention, present = self.self_attention.decode(self.input_layernorm(x), past)
        x = x + attention
        return x + self.mlp(self.post_attention_layernorm(x)), present


class TransformerLayers(nn.SequentialCell):
    """A model's (or pipeline stage's) decoder layers, run in order:
    `(x [b, s, h], attention_mask) -> [b, s, h]`. Built from an OrderedDict keyed by each layer's
    global index, so `layers.5.mlp...` keeps its name at every pipeline size. One cell for all of
    them so that a pipeline stage compiles its layers as one graph, inside which MindSpore's
    activation recompute works as in the non-pipelined step (rapidgpt/training/model_transforms.py).
    """

    def construct(self, x, attention_mask=None):
        for layer in self.cell_list:
            x = layer(x, attention_mask)
        return x

