"""GPT's decoder layer from tensor-parallel layers: pre-LayerNorm attention and MLP blocks.

Layout: hidden states are `[b, s, h]` (batch, sequence, hidden). Each layer computes

    x = x + dropout(attention(layernorm(x)))
    x = x + dropout(mlp(layernorm(x)))

Attention: one ColumnParallelLinear makes q, k, v for this rank's heads, laid out per head as
`[np, 3, hn]` (Megatron's order, so a TP split of the output keeps each head's q, k and v
together); scores `q k^T / sqrt(hn)` get the causal mask (and, with --reset-attention-mask, the
batch's document mask) filled with -10000 as Megatron does, softmax in fp32, attention dropout,
then the RowParallelLinear output projection. MLP: ColumnParallelLinear h -> ffn, tanh-GELU
(GPT-2's `gelu_new`), RowParallelLinear ffn -> h. Output projections use Megatron's scaled init
std / sqrt(2 * num_layers).
"""
import math

import numpy as np
from mindspore import Tensor, nn, ops
import mindspore as ms

from rapidgpt.parallel.layers import ColumnParallelLinear, RowParallelLinear, divide
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

    @property
    def output_init_std(self):
        return self.init_method_std / math.sqrt(2.0 * self.num_layers)


class ParallelAttention(nn.Cell):
    def __init__(self, config):
        super().__init__()
        tp = get_tensor_model_parallel_world_size()
        self.heads = divide(config.num_attention_heads, tp, "number of attention heads")
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.query_key_value = ColumnParallelLinear(config.hidden_size, 3 * config.hidden_size,
                                                    init_std=config.init_method_std)
        self.dense = RowParallelLinear(config.hidden_size, config.hidden_size,
                                       init_std=config.output_init_std)
        self.attention_dropout = nn.Dropout(p=config.attention_dropout)
        self.scores = ops.BatchMatMul(transpose_b=True)
        self.scale = 1.0 / math.sqrt(self.head_dim)
        n = config.max_position_embeddings
        self.causal_mask = Tensor(np.triu(np.ones((1, 1, n, n), bool), k=1))   # True = masked

    def construct(self, x, attention_mask=None):
        b, s, _ = x.shape
        qkv = self.query_key_value(x).reshape(b, s, self.heads, 3, self.head_dim)
        q, k, v = qkv[:, :, :, 0], qkv[:, :, :, 1], qkv[:, :, :, 2]          # [b, s, np, hn]
        q, k, v = q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
        scores = self.scores(q, k) * self.scale                                # [b, np, s, s]
        mask = self.causal_mask[:, :, :s, :s]
        if attention_mask is not None:
            mask = ops.logical_or(mask, attention_mask)
        scores = ops.masked_fill(scores, mask, -10000.0)
        probs = self.attention_dropout(ops.softmax(scores.astype(ms.float32), axis=-1).astype(v.dtype))
        context = ops.matmul(probs, v).transpose(0, 2, 1, 3).reshape(b, s, -1)   # [b, s, np*hn]
        return self.dense(context)


class ParallelMLP(nn.Cell):
    def __init__(self, config):
        super().__init__()
        self.dense_h_to_4h = ColumnParallelLinear(config.hidden_size, config.ffn_hidden_size,
                                                  init_std=config.init_method_std)
        self.dense_4h_to_h = RowParallelLinear(config.ffn_hidden_size, config.hidden_size,
                                               init_std=config.output_init_std)

    def construct(self, x):
        return self.dense_4h_to_h(ops.gelu(self.dense_h_to_4h(x), approximate="tanh"))


class ParallelTransformerLayer(nn.Cell):
    def __init__(self, config):
        super().__init__()
        eps = config.layernorm_epsilon
        self.input_layernorm = nn.LayerNorm((config.hidden_size,), epsilon=eps)
        self.self_attention = ParallelAttention(config)
        self.post_attention_layernorm = nn.LayerNorm((config.hidden_size,), epsilon=eps)
        self.mlp = ParallelMLP(config)
        self.hidden_dropout = nn.Dropout(p=config.hidden_dropout)

    def construct(self, x, attention_mask=None):
        x = x + self.hidden_dropout(self.self_attention(self.input_layernorm(x), attention_mask))
        return x + self.hidden_dropout(self.mlp(self.post_attention_layernorm(x)))
