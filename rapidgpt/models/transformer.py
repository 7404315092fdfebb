"""The built-in decoder (and, with rapidgpt/models/bert.py, encoder) layer from tensor-parallel
layers, shaped by a TransformerConfig (rapidgpt/config/transformer.py): GPT-2 by default, the Llama
family (RoPE, RMSNorm, SwiGLU, grouped-query attention, no biases, q/k norms) by Megatron's flags.

Layout: hidden states are `[b, s, h]` (batch, sequence, hidden). Each decoder layer computes

    x = x + dropout(attention(norm(x)))
    x = x + dropout(mlp(norm(x)))

Attention (np query heads of hn = --kv-channels channels in ng = --num-query-groups groups, r =
np / ng query heads per group): one ColumnParallelLinear makes q, k, v, its rows laid out per group
as `[ng, r + 2, hn]` -- the group's r query heads, its key head, its value head (Megatron-core's
order; with ng = np that is `[np, 3, hn]`). A TP split of the rows keeps each group whole, so
--num-query-groups must be divisible by TP. Query head j of group g is head g * r + j, which uses
the group's key/value (transformers' `repeat_kv`). With --qk-layernorm each head's q and k are
normalised over hn, then rotated (RoPE, rapidgpt/models/rotary.py); the core attention (its own
cell, what selective recompute recomputes): scores `q k^T / sqrt(hn)` (--use-mup: its scale) get the causal mask (and,
with --reset-attention-mask, the batch's document mask) filled with -10000 as Megatron does,
softmax (in fp32 for fp32 models and with --attention-softmax-in-fp32, else in the model's 16-bit
dtype, as Megatron; --apply-query-key-layer-scaling: see CoreAttention), attention dropout, probabilities x values; then the RowParallelLinear output
projection np * hn -> h. Dropout is rapidgpt.parallel.random.Dropout: its masks survive a resume
and do not depend on the TP layout.

MLP: ColumnParallelLinear h -> ffn, tanh-GELU (GPT-2's `gelu_new`, Megatron's fused bias-GELU;
exact GELU for BERT, and as Megatron with --no-bias-gelu-fusion or --disable-bias-linear; relu(x)^2
with --squared-relu), RowParallelLinear ffn -> h; with --swiglu the up projection holds two stacked matrices `[2, ffn,
h]` (gate, then up; split together over TP) and the MLP is `down(silu(x W_gate) * (x W_up))`.
Output projections use Megatron's scaled init std / sqrt(2 * num_layers) (with --use-mup the
matrices' init is divided by sqrt(width multiplier) too, rapidgpt/config/mup.py). --disable-bias-linear
drops the linear layers' biases (--add-qkv-bias keeps the q/k/v one).

Sequence parallelism (--sequence-parallel, with TP): the norms, dropouts and residual additions
work on `[b, s / tp, h]`, this rank's part of the sequence; the q/k/v and up projections
all-gather it, the output and down projections reduce-scatter into it
(rapidgpt/parallel/mappings.py), and the weights used on a part (the norms', the output
projections' biases) get their gradients summed over the TP ranks. Dropout masks are the
sequence-parallel parts of the masks of the whole sequence, so the run is the one without it.

Mixed precision: in a 16-bit model every matrix product runs in 16-bit, while the norms compute
in fp32 (rapidgpt/models/norms.py) and the GPT's loss too (rapidgpt/models/gpt.py). Under emulated
bf16 (rapidgpt/emulated_bf16.py) each result below that a bf16 run holds in bf16 is rounded: the
scaled scores, the probabilities, the context, the rotated q and k, the activation, the residual sums.

ZeRO-3 (rapidgpt/parallel/fully_sharded.py): every layer here that owns parameters is a
ShardableLayer and gathers its own weights (`whole_weights()`); the composite cells hold no
ZeRO-3 code.
"""
from mindspore import nn, ops

from rapidgpt.emulated_bf16 import RoundsToBf16
from rapidgpt.models.attention import CoreAttention, SelfAttention
from rapidgpt.models.mla import MultiLatentAttention
from rapidgpt.models.norms import build_norm
from rapidgpt.models.rotary import apply_rotary
from rapidgpt.parallel.layers import ColumnParallelLinear, RowParallelLinear, divide
from rapidgpt.parallel.random import Dropout
from rapidgpt.parallel.state import get_tensor_model_parallel_world_size


class ParallelAttention(SelfAttention):
    """Multi-head (grouped-query) self-attention over `x` `[b, s, h]` -> `[b, s, h]` (module
    docstring: layout, GQA, RoPE) of layer `layer_number` (1-based, global: what
    --apply-query-key-layer-scaling reads)."""

    def __init__(self, config, layer_number=1):
        super().__init__(config)
        tp = get_tensor_model_parallel_world_size()
        self.heads_per_rank = divide(config.num_attention_heads, tp, "number of attention heads")
        self.groups_per_rank = divide(config.num_query_groups, tp, "number of query groups")
        self.heads_per_group = config.num_attention_heads // config.num_query_groups
        self.head_dim = hn = config.kv_channels
        qkv_rows = config.num_query_groups * (self.heads_per_group + 2) * hn
        sp = config.sequence_parallel
        self.query_key_value = ColumnParallelLinear(config.hidden_size, qkv_rows, bias=config.qkv_bias,
                                                    init_std=config.hidden_init_std, sequence_parallel=sp)
        self.dense = RowParallelLinear(config.num_attention_heads * hn, config.hidden_size,
                                       bias=config.add_bias_linear, init_std=config.output_init_std,
                                       sequence_parallel=sp)
        self.qk_layernorm = config.qk_layernorm
        if config.qk_layernorm:          # this rank's heads only: gradients summed over TP
            self.q_layernorm = build_norm(config, hn, summed_over_tp=True)
            self.k_layernorm = build_norm(config, hn, summed_over_tp=True)
        self.rotary_interleaved = config.rotary_interleaved
        self.core_attention = CoreAttention(config, hn, layer_number)

    def heads(self, x, rotary=None):
        """q `[b, np, s, hn]` of this rank's heads, k and v `[b, ng, s, hn]` of its groups;
        normalised (--qk-layernorm) and rotated (`rotary`: cos and sin stacked, or None)."""
        r, hn = self.heads_per_group, self.head_dim
        qkv = self.query_key_value(x)                         # [b, s, ...]: the whole sequence
        b, s, _ = qkv.shape
        qkv = qkv.reshape(b, s, self.groups_per_rank, (r + 2) * hn)
        # A split of the last axis, not qkv[..., i, :] slices: MindSpore's CPU StridedSlice kernel
        # copies element by element (~4x slower here, benchmarks/bench_pretrain.py's profile).
        q, k, v = ops.split(qkv, hn if r == 1 else [r * hn, hn, hn], axis=-1)
        if r > 1:
            q = q.reshape(b, s, self.heads_per_rank, hn)
        q = q.transpose(0, 2, 1, 3)                                             # [b, np, s, hn]
        k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)                # [b, ng, s, hn]
        if self.qk_layernorm:
            q, k = self.q_layernorm(q), self.k_layernorm(k)
        if rotary is not None:
            rotary = self.rounded(rotary)               # a bf16 run's cos and sin are in bf16 too
            q = self.rounded(apply_rotary(q, rotary, self.rotary_interleaved))
            k = self.rounded(apply_rotary(k, rotary, self.rotary_interleaved))
        return q, k, v

    def attend(self, q, k, v, mask):
        """The core attention over the groups' k, v `[b, ng, sk, hn]` shared by their query heads."""
        if self.heads_per_group > 1:
            b, ng, sk, hn = k.shape
            shape = (b, ng, self.heads_per_group, sk, hn)
            k = ops.broadcast_to(ops.expand_dims(k, 2), shape).reshape(b, -1, sk, hn)
            v = ops.broadcast_to(ops.expand_dims(v, 2), shape).reshape(b, -1, sk, hn)
        return self.dense(self.core_attention(q, k, v, mask))


class ParallelMLP(RoundsToBf16, nn.Cell):
    """`[b, s, h]` -> `[b, s, h]`: GELU MLP, squared-ReLU with --squared-relu, or SwiGLU with --swiglu
    (module docstring)."""

    def __init__(self, config):
        super().__init__()
        self.swiglu = config.swiglu
        stacked = 2 if config.swiglu else 1
        self.dense_h_to_4h = ColumnParallelLinear(config.hidden_size, stacked * config.ffn_hidden_size,
                                                  bias=config.add_bias_linear, init_std=config.hidden_init_std,
                                                  stacked=stacked, sequence_parallel=config.sequence_parallel)
        self.dense_4h_to_h = RowParallelLinear(config.ffn_hidden_size, config.hidden_size,
                                               bias=config.add_bias_linear, init_std=config.output_init_std,
                                               sequence_parallel=config.sequence_parallel)
        self.squared_relu = config.activation == "squared_relu"
        self.approximate = {"gelu_tanh": "tanh", "gelu": "none", "squared_relu": None}[config.activation]

    def construct(self, x):
        h = self.dense_h_to_4h(x)
        if self.swiglu:
            gate, up = ops.split(h, h.shape[-1] // 2, axis=-1)
            return self.dense_4h_to_h(self.rounded(ops.silu(gate) * up))
        if self.squared_relu:
            r = ops.relu(h)
            return self.dense_4h_to_h(self.rounded(r * r))
        return self.dense_4h_to_h(self.rounded(ops.gelu(h, approximate=self.approximate)))


class ParallelTransformerLayer(RoundsToBf16, nn.Cell):
    """The pre-norm decoder layer (see the module docstring): `(x [b, s, h], attention_mask,
    rotary) -> [b, s, h]`; `layer_number`: its place in the model, from 1."""

    def __init__(self, config, layer_number=1):
        super().__init__()
        sp = config.sequence_parallel          # the norms see this rank's part of the sequence
        self.input_layernorm = build_norm(config, config.hidden_size, summed_over_tp=sp)
        attention = MultiLatentAttention if config.mla.enabled else ParallelAttention
        self.self_attention = attention(config, layer_number)
        self.post_attention_layernorm = build_norm(config, config.hidden_size, summed_over_tp=sp)
        self.mlp = ParallelMLP(config)
        # Two cells, so the two residual branches draw different masks (the sequence-parallel
        # parts of the masks of the whole sequence).
        self.post_attention_dropout = Dropout(config.hidden_dropout, partition_dim=1 if sp else None)
        self.post_mlp_dropout = Dropout(config.hidden_dropout, partition_dim=1 if sp else None)

    def construct(self, x, attention_mask=None, rotary=None):
        x = self.rounded(x + self.post_attention_dropout(self.self_attention(self.input_layernorm(x), attention_mask,
                                                                            rotary)))
        return self.rounded(x + self.post_mlp_dropout(self.mlp(self.post_attention_layernorm(x))))

    def decode(self, x, past=None, rotary=None):
        """The layer with cached keys/values (generation, eval mode); returns (x, present)."""
        attention, present = self.self_attention.decode(self.input_layernorm(x), past, rotary)
        x = self.rounded(x + attention)
        return self.rounded(x + self.mlp(self.post_attention_layernorm(x))), present


class TransformerLayers(nn.SequentialCell):
    """A model's (or pipeline stage's) decoder layers, run in order:
    `(x [b, s, h], attention_mask, rotary (cos and sin stacked) or None) -> [b, s, h]`. Built from an OrderedDict keyed by each layer's
    global index, so `layers.5.mlp...` keeps its name at every pipeline size. One cell for all of
    them so that a pipeline stage compiles its layers as one graph, inside which MindSpore's
    activation recompute works as in the non-pipelined step (rapidgpt/training/model_transforms.py).
    """

    def construct(self, x, attention_mask=None, rotary=None, keep=()):
        """With `keep` (positions among these layers, a constant), also the hidden states entering
        the layers at those positions (position len(layers): the last one's output), in `keep`'s
        order: `(x, (state, ...))`."""
        kept = ()
        for i, layer in enumerate(self.cell_list):
            if i in keep:
                kept = kept + (x,)
            x = layer(x, attention_mask, rotary)
        if keep:
            return x, kept + ((x,) if len(self.cell_list) in keep else ())
        return x

