"""GPT: learned token + position embeddings, pre-LayerNorm decoder layers, tied output layer.

`GPTModel(tokens [b, s], position_ids=None, attention_mask=None, labels=None)` returns, as
Megatron's GPTModel does, the per-token cross-entropy `[b, s]` when labels are given, otherwise
the logits `[b, s, vocab]` over the TRUE vocabulary: rows added by vocabulary padding
(`--make-vocab-size-divisible-by`) are never part of the softmax, the loss or the returned logits.
With `--untie-embeddings-and-output-weights` the output layer has its own weights.
`position_ids` `[b, s]` default to 0..s-1 for every sequence (Megatron's data pipeline passes them,
with --reset-position-ids restarting them at document boundaries).
"""
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops
import numpy as np

from rapidgpt.arguments import padded_vocab_size
from rapidgpt.models.transformer import LayerNorm, ParallelTransformerLayer, TransformerConfig
from rapidgpt.parallel.cross_entropy import VocabParallelCrossEntropy
from rapidgpt.parallel.layers import ColumnParallelLinear, VocabParallelEmbedding
from rapidgpt.parallel.mappings import CopyToTensorParallelRegion, GatherFromTensorParallelRegion
from rapidgpt.parallel.random import Dropout, ParamInit, graph_arange
from rapidgpt.parallel.state import get_tensor_model_parallel_world_size


class PositionEmbedding(nn.Cell):
    """Learned absolute positions `[max_positions, h]`, replicated on every TP rank."""

    def __init__(self, max_positions, hidden_size, init_std):
        super().__init__()
        self.weight = Parameter(Tensor(np.zeros((max_positions, hidden_size), np.float32)), name="weight")
        self.param_inits = {"weight": ParamInit(init_std, (max_positions, hidden_size))}

    def construct(self, position_ids):
        return ops.gather(self.weight, position_ids, 0)


class GPTModel(nn.Cell):
    def __init__(self, config, vocab_size, padded_vocab_size, untie_embeddings_and_output_weights=False):
        super().__init__()
        if padded_vocab_size < vocab_size:
            raise ValueError(f"padded vocabulary {padded_vocab_size} smaller than vocabulary {vocab_size}")
        self.config = config
        self.vocab_size = vocab_size
        self.padded_vocab_size = padded_vocab_size
        h, std = config.hidden_size, config.init_method_std
        self.word_embeddings = VocabParallelEmbedding(padded_vocab_size, h, std, real_vocab_size=vocab_size)
        self.position_embeddings = PositionEmbedding(config.max_position_embeddings, h, std)
        self.embedding_dropout = Dropout(config.hidden_dropout)
        self.layers = nn.CellList([ParallelTransformerLayer(config) for _ in range(config.num_layers)])
        self.final_layernorm = LayerNorm((h,), epsilon=config.layernorm_epsilon)
        self.untied = untie_embeddings_and_output_weights
        self.output_layer = (ColumnParallelLinear(h, padded_vocab_size, bias=False, init_std=std,
                                                  drawn_rows=vocab_size) if self.untied else None)
        self.logits_matmul = ops.MatMul(transpose_b=True)
        self.tp = get_tensor_model_parallel_world_size()
        if self.tp > 1:
            # Logits stay split over the vocabulary: the loss never needs them whole.
            self.copy_to_region = CopyToTensorParallelRegion()
            self.gather_from_region = GatherFromTensorParallelRegion()
            self.cross_entropy = VocabParallelCrossEntropy(self.word_embeddings.vocab_start,
                                                           padded_vocab_size // self.tp, vocab_size)

    def output_weight(self):
        return self.output_layer.weight if self.untied else self.word_embeddings.weight

    def hidden_states(self, tokens, position_ids=None, attention_mask=None):
        """Final-LayerNorm hidden states `[b, s, h]` (for heads such as classification)."""
        if position_ids is None:
            position_ids = graph_arange(0, tokens.shape[1])       # [s], same for each row (ops.arange
            # runs interpreted Python inside a graph, which MindSpore then warns about)
        x = self.word_embeddings(tokens) + self.position_embeddings(position_ids)   # [b, s, h]
        x = self.embedding_dropout(x)
        for layer in self.layers:
            x = layer(x, attention_mask)
        return self.final_layernorm(x)

    def parallel_logits(self, x):
        """`[b, s, h]` final hidden states -> `[b*s, padded / tp]` fp32: this rank's vocabulary slice
        (a 16-bit model's product cast to fp32: the softmax and the loss are computed in fp32)."""
        b, s, h = x.shape
        x = x.reshape(b * s, h)
        if self.tp > 1:
            x = self.copy_to_region(x)
        logits = self.logits_matmul(x, self.output_weight())
        return logits if logits.dtype == ms.float32 else logits.astype(ms.float32)

    def logits(self, x):
        """`[b, s, h]` final hidden states -> `[b*s, vocab]` logits over the true vocabulary."""
        logits = self.parallel_logits(x)
        if self.tp > 1:
            logits = self.gather_from_region(logits)                                # [b*s, padded]
        if self.padded_vocab_size > self.vocab_size:
            logits = logits[:, :self.vocab_size]
        return logits

    def decode(self, tokens, position_ids, past=None):
        """Generation step with a key/value cache: logits `[b, s_new, vocab]` of the new tokens and
        the cache to pass next time (one (k, v) per layer). Only the new tokens are computed."""
        x = self.word_embeddings(tokens) + self.position_embeddings(position_ids)
        presents = []
        for i, layer in enumerate(self.layers):
            x, present = layer.decode(x, None if past is None else past[i])
            presents.append(present)
        x = self.final_layernorm(x)
        return self.logits(x).reshape(x.shape[0], x.shape[1], self.vocab_size), presents

    def construct(self, tokens, position_ids=None, attention_mask=None, labels=None):
        x = self.hidden_states(tokens, position_ids, attention_mask)
        b, s, _ = x.shape
        if labels is None:
            return self.logits(x).reshape(b, s, self.vocab_size)
        if self.tp > 1:
            losses = self.cross_entropy(self.parallel_logits(x), labels.reshape(-1))
        else:
            losses = ops.cross_entropy(self.logits(x), labels.reshape(-1), reduction="none")
        return losses.reshape(b, s)


def lm_loss_func(loss_mask, output_tensor):
    """Megatron's loss_func: mean of the per-token losses where `loss_mask` is 1."""
    loss_mask = loss_mask.astype(output_tensor.dtype)
    return (output_tensor * loss_mask).sum() / loss_mask.sum()


def build_gpt_model(args, vocab_size):
    """The built-in GPT from the model flags (`vocab_size`: the tokenizer's or --vocab-size)."""
    padded = padded_vocab_size(vocab_size, args.make_vocab_size_divisible_by,
                               get_tensor_model_parallel_world_size())
    return GPTModel(TransformerConfig(args), vocab_size, padded, args.untie_embeddings_and_output_weights)
