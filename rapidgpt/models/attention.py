"""What every self-attention of the built-in models shares: the core attention (scores, mask,
softmax, dropout, context), the causal mask, and `SelfAttention`, the full forward and the cached
decode over the heads a subclass makes: rapidgpt/models/transformer.py's ParallelAttention (multi-head
and grouped-query) and rapidgpt/models/mla.py's MultiLatentAttention. Layout: `[b, s, h]`; heads
`[b, n, s, d]`.
"""
import math

import numpy as np
from mindspore import Tensor, nn, ops
import mindspore as ms

from rapidgpt.emulated_bf16 import RoundsToBf16
from rapidgpt.parallel.random import Dropout, graph_arange


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


class CoreAttention(RoundsToBf16, nn.Cell):
    """Softmax attention of q `[b, np, sq, hn]` over k `[b, np, sk, hn]` and v `[b, np, sk, hv]`;
    mask True = hidden. Returns the context `[b, sq, np*hv]`. No parameters: selective recompute recomputes exactly this.

    With --apply-query-key-layer-scaling (Megatron's, for fp16) layer `layer_number` (1-based)
    computes the scores divided by layer_number more, then multiplies them back in fp32 before the
    mask and the softmax, as Megatron's FusedScaleMaskSoftmax with `scale=coeff`: the same
    probabilities, with products that overflow fp16 only layer_number times later."""

    def __init__(self, config, head_dim, layer_number=1, scale=None):
        super().__init__()
        self.attention_dropout = Dropout(config.attention_dropout, partition_dim=1)   # heads are split
        self.scores = ops.BatchMatMul(transpose_b=True)
        self.coeff = layer_number if config.apply_query_key_layer_scaling else None
        # `scale` (multi-latent attention's), muP's (rapidgpt/config/mup.py), or 1 / sqrt(hn)
        self.scale = (scale or config.mup.softmax_scale or 1.0 / math.sqrt(head_dim)) / (self.coeff or 1)
        self.softmax_in_fp32 = config.attention_softmax_in_fp32

    def construct(self, q, k, v, mask):
        b, _, sq, _ = q.shape
        if self.coeff is None:
            scores = mask_scores(self.rounded(self.scores(q, k) * self.scale), mask)   # [b, np, sq, sk]
        else:       # q scaled before the 16-bit product: Megatron's GEMM applies the factor as it accumulates
            scores = self.rounded(self.scores(self.rounded(q * self.scale), k))
            scores = mask_scores(scores.astype(ms.float32) * self.coeff, mask)
        if self.softmax_in_fp32:
            scores = scores.astype(ms.float32)
        probs = self.attention_dropout(self.rounded(ops.softmax(scores, axis=-1).astype(v.dtype)))
        context = self.rounded(ops.matmul(probs, v))
        return context.transpose(0, 2, 1, 3).reshape(b, sq, -1)                    # [b, sq, np*hn]


# Up to this many positions the causal mask is one constant shared by the layers (16 MB at 4096);
# beyond, where a constant would take positions^2 bytes (Llama 3.1's 131072: 17 GB), each forward
# computes the rows it needs.
CONSTANT_CAUSAL_MASK_POSITIONS = 4096
_CAUSAL_MASKS = {}


def constant_causal_mask(positions):
    """The causal mask `[1, 1, positions, positions]` (True = hidden) as one Tensor per size, or None
    above CONSTANT_CAUSAL_MASK_POSITIONS."""
    if positions > CONSTANT_CAUSAL_MASK_POSITIONS:
        return None
    if positions not in _CAUSAL_MASKS:
        _CAUSAL_MASKS[positions] = Tensor(np.triu(np.ones((1, 1, positions, positions), bool), k=1))
    return _CAUSAL_MASKS[positions]


class SelfAttention(RoundsToBf16, nn.Cell):
    """Causal (or, for BERT, padding-masked) self-attention over `x` `[b, s, h]` -> `[b, s, h]`: a
    subclass gives `heads(x, rotary) -> (q, k, v)` (`[b, n, s, d]`, this rank's heads; k and v may
    have fewer heads, which `attend` shares out) and `attend(q, k, v, mask) -> [b, s, h]`."""

    def __init__(self, config):
        super().__init__()
        self.causal = config.causal
        self.causal_mask = constant_causal_mask(config.max_position_embeddings)

    def construct(self, x, attention_mask=None, rotary=None):
        """`attention_mask` (True = hidden) is added to the causal mask, or is the whole mask when
        not causal (BERT's padding mask `[b, 1, 1, s]`: every query sees every real key). With
        sequence parallelism x is `[b, s / tp, h]`; the q/k/v projection gathers the sequence."""
        q, k, v = self.heads(x, rotary)
        s = q.shape[2]
        if not self.causal:
            mask = attention_mask
        elif attention_mask is None:
            mask = self.causal_rows(0, s, s)
        else:
            mask = ops.logical_or(self.causal_rows(0, s, s), attention_mask)
        return self.attend(q, k, v, mask)

    def causal_rows(self, first, queries, keys):
        """The causal mask `[1, 1, queries, keys]` (True = hidden) of query positions first ..
        first + queries - 1 over key positions 0 .. keys - 1."""
        if self.causal_mask is not None:
            return self.causal_mask[:, :, first:first + queries, :keys]
        key_positions = graph_arange(0, keys).reshape(1, keys)
        query_positions = graph_arange(first, first + queries).reshape(queries, 1)
        return (key_positions > query_positions).reshape(1, 1, queries, keys)

    def decode(self, x, past=None, rotary=None):
        """Incremental attention for generation: x `[b, s_new, h]` after `past` = (k, v) of the
        earlier positions, `[b, ng, s_past, hn]` each (None: none). Returns (output, (k, v)
        including the new positions)."""
        q, k, v = self.heads(x, rotary)
        if past is not None:
            k, v = ops.cat((past[0], k), axis=2), ops.cat((past[1], v), axis=2)
        total, new = k.shape[2], x.shape[1]
        mask = self.causal_rows(total - new, new, total)
        return self.attend(q, k, v, mask), (k, v)
