"""BERT from RapidGPT's parallel layers: the original BERT (Hugging Face's BertForPreTraining computes
the same function), called as Megatron's BertModel.

    model(input_ids [b, s], attention_mask [b, s] (1 = token, 0 = padding), tokentype_ids [b, s] = None,
          lm_labels [b, s] = None)
      -> (lm_logits [b, s, vocab], binary_logits [b, 2] fp32)     without lm_labels
      -> (lm_loss [b, s] fp32 per token, binary_logits)           with lm_labels (-1 = not
                                                                  predicted, as Megatron's data)
    binary_logits is None without the binary head (Megatron's --bert-no-binary-head).

    x = dropout(LN(word(ids) + position(0..s-1) + tokentype(types)))     embeddings   [b, s, h]
    x = LN(x + dropout(attention(x)))    per layer: post-LayerNorm, as the original BERT (not
    x = LN(x + dropout(mlp(x)))          Megatron's pre-LayerNorm BertModel); bidirectional attention
                                         whose keys at padding positions are hidden; exact (erf) GELU
    pooled = tanh(pooler(x[:, 0]))                                   [b, h]  ([CLS])
    lm_logits = LN(gelu(dense(x))) @ word_embeddings^T + bias        [b, s, vocab] (output tied to the
                                         word embeddings; the bias split over TP as their rows)
    binary_logits = binary_head(pooled)                              [b, 2] (next sentence / order)

Padding positions' keys are hidden from every query (Hugging Face's mask): real positions compute
exactly as without the padding. Logits and the loss cover the true vocabulary (padded rows never
appear), as in the GPT. Pipeline stages as the GPT's (rapidgpt/models/gpt.py): the first stage
holds the embeddings, the last the heads and a copy of the word embeddings (tied); every stage
takes the padding mask. Every weighted cell here is a RapidGPT layer that declares its ZeRO-3
slots (encoder layers, embeddings, LayerNorms, linears, the LM head's bias); ZeRO-3 itself is
refused for BERT in this build (rapidgpt/config/bert.py says why).
Initialisation: normal(0, --init-method-std) (the embeddings: --embedding-init-method-std, by
default the same), output projections of each layer scaled by
1/sqrt(2 * layers) as Megatron's, LayerNorms 1/0, biases 0; seeded by name, so the same for
every layout.
"""
import dataclasses
from collections import OrderedDict

import mindspore as ms
from mindspore import nn, ops

from rapidgpt.models.gpt import LanguageModelHead, LanguageModelStage, padded_vocab_size_of, stage_word_embeddings
from rapidgpt.config.transformer import TransformerConfig
from rapidgpt.emulated_bf16 import RoundsToBf16
from rapidgpt.models.norms import LayerNorm
from rapidgpt.models.transformer import ParallelAttention, ParallelMLP, TransformerLayers
from rapidgpt.parallel.fully_sharded import ShardableLayer
from rapidgpt.parallel.layers import ReplicatedEmbedding, ReplicatedLinear, _zeros, divide
from rapidgpt.parallel.random import Dropout, ParamInit, graph_arange
from rapidgpt.parallel.state import get_tensor_model_parallel_world_size

NUM_TOKENTYPES = 2


def bert_config(config):
    """A copy of a TransformerConfig made BERT's: bidirectional attention, exact GELU."""
    return dataclasses.replace(config, causal=False, activation="gelu")


class BertLayer(RoundsToBf16, nn.Cell):
    """One post-LayerNorm encoder layer: `(x [b, s, h], padding mask [b, 1, 1, s] True = hidden) -> [b, s, h]`;
    `layer_number`: its place in the model, from 1."""

    def __init__(self, config, layer_number=1):
        super().__init__()
        eps = config.layernorm_epsilon
        self.self_attention = ParallelAttention(config, layer_number)
        self.post_attention_layernorm = LayerNorm((config.hidden_size,), epsilon=eps)
        self.mlp = ParallelMLP(config)
        self.post_mlp_layernorm = LayerNorm((config.hidden_size,), epsilon=eps)
        self.post_attention_dropout = Dropout(config.hidden_dropout)
        self.post_mlp_dropout = Dropout(config.hidden_dropout)

    def construct(self, x, attention_mask=None, rotary=None):
        attention = self.post_attention_dropout(self.self_attention(x, attention_mask, rotary))
        x = self.post_attention_layernorm(self.rounded(x + attention))
        return self.post_mlp_layernorm(self.rounded(x + self.post_mlp_dropout(self.mlp(x))))


class VocabParallelBias(ShardableLayer, nn.Cell):
    """An output bias over the vocabulary, `[padded / tp]` on each TP rank (the rows its word
    embeddings hold); zero-initialised."""

    def __init__(self, padded_vocab_size, vocab_size):
        super().__init__()
        rows = divide(padded_vocab_size, get_tensor_model_parallel_world_size(), "padded vocabulary")
        self.bias = _zeros((rows,), "bias", True)
        self.param_inits = {"bias": ParamInit(0.0, (padded_vocab_size,), 0, vocab_size)}
        self.weight_names = ("bias",)


class BertLMHead(RoundsToBf16, nn.Cell):
    """The masked-LM head: `(x [b, s, h], word embeddings [padded / tp, h]) -> [b, s, h]` transformed,
    whose product with the embeddings (plus `output_bias`) gives the logits (LanguageModelHead)."""

    def __init__(self, config, padded_vocab_size, vocab_size):
        super().__init__()
        self.dense = ReplicatedLinear(config.hidden_size, config.hidden_size, init_std=config.init_method_std)
        self.layernorm = LayerNorm((config.hidden_size,), epsilon=config.layernorm_epsilon)
        self.output_bias = VocabParallelBias(padded_vocab_size, vocab_size)

    def construct(self, x):
        return self.layernorm(self.rounded(ops.gelu(self.dense(x), approximate="none")))


class BertModel(LanguageModelStage):
    def __init__(self, config, vocab_size, padded_vocab_size, add_binary_head=True, add_lm_head=True,
                 pre_process=None, post_process=None, vp_stage=None):
        config = bert_config(config)
        super().__init__(config, vocab_size, padded_vocab_size, pre_process, post_process, vp_stage)
        self.add_binary_head, self.add_lm_head = add_binary_head, add_lm_head
        h, std = config.hidden_size, config.init_method_std
        embedding_std = config.embedding_init_std
        if self.pre_process or (self.post_process and add_lm_head):
            self.word_embeddings = stage_word_embeddings(padded_vocab_size, vocab_size, h, embedding_std,
                                                         self.pre_process, tied_to_output=add_lm_head)
        if self.pre_process:
            self.position_embeddings = ReplicatedEmbedding(config.max_position_embeddings, h, embedding_std)
            self.tokentype_embeddings = ReplicatedEmbedding(NUM_TOKENTYPES, h, embedding_std)
            self.embedding_layernorm = LayerNorm((h,), epsilon=config.layernorm_epsilon)
            self.embedding_dropout = Dropout(config.hidden_dropout)
        self.layers = TransformerLayers(OrderedDict((str(i), BertLayer(config, i + 1)) for i in self.stage_layers))
        if self.post_process:
            self.pooler = ReplicatedLinear(h, h, init_std=std)
            if add_lm_head:
                self.lm_head = BertLMHead(config, padded_vocab_size, vocab_size)
                self.lm_output = LanguageModelHead(vocab_size, padded_vocab_size)
            if add_binary_head:
                self.binary_head = ReplicatedLinear(h, 2, init_std=std)

    def encode(self, input_ids, attention_mask, tokentype_ids=None):
        """This stage's output `[b, s, h]` (the last layer's, post-LayerNorm)."""
        b, s = attention_mask.shape
        hidden = (attention_mask < 0.5).reshape(b, 1, 1, s)              # True = padding key
        if self.pre_process:
            x = self.rounded(self.word_embeddings(input_ids) + self.position_embeddings(graph_arange(0, s)))
            if tokentype_ids is not None:
                x = x + self.tokentype_embeddings(tokentype_ids)
            else:                                                         # all type 0
                x = x + self.tokentype_embeddings.whole_weights()[0][0]
            x = self.rounded(x)
            x = self.embedding_dropout(self.embedding_layernorm(x))
        else:
            x = self.input_tensor
        return self.layers(x, hidden)

    def pool(self, x):
        """`[b, s, h]` -> `[b, h]`: tanh(pooler(x[:, 0])), the [CLS] position."""
        return self.rounded(ops.tanh(self.pooler(x[:, 0])))

    def construct(self, input_ids, attention_mask, tokentype_ids=None, lm_labels=None):
        x = self.encode(input_ids, attention_mask, tokentype_ids)
        if not self.post_process:
            return x
        binary_logits = self.binary_head(self.pool(x)).astype(ms.float32) if self.add_binary_head else None
        if not self.add_lm_head:
            return x, binary_logits
        transformed = self.lm_head(x)
        weight, bias = self.word_embeddings.whole_weights()[0], self.lm_head.output_bias.whole_weights()[0]
        if lm_labels is None:
            b, s, _ = x.shape
            return self.lm_output.logits(transformed, weight, bias).reshape(b, s, self.vocab_size), binary_logits
        # Megatron's BERT labels are -1 where nothing is predicted: any valid id will do there (the
        # loss mask drops those positions).
        return self.lm_output(transformed, weight, ops.maximum(lm_labels, 0), bias), binary_logits


class BertSequenceClassifier(BertModel):
    """Hugging Face's BertForSequenceClassification: the encoder and pooler of BertModel (no LM or
    binary head) and a linear classifier on the pooled `[CLS]`:

        model(input_ids [b, s], attention_mask [b, s], tokentype_ids [b, s]) -> logits [b, classes] fp32
        logits = head(dropout(tanh(pooler(x[:, 0]))))

    Parameter names are BertModel's (so a BERT pretraining checkpoint or a Hugging Face BERT folder
    loads into them; their LM and binary heads go unused) plus `head.weight`, `head.bias`: from the
    folder's classifier (BertForSequenceClassification; of another number of classes it is an
    error naming the shapes), else from the seeded initialisation."""

    def __init__(self, config, vocab_size, padded_vocab_size, num_classes):
        super().__init__(config, vocab_size, padded_vocab_size, add_binary_head=False, add_lm_head=False,
                         pre_process=True, post_process=True)
        self.classifier_dropout = Dropout(config.hidden_dropout)
        self.head = ReplicatedLinear(config.hidden_size, num_classes, init_std=config.init_method_std)

    def construct(self, input_ids, attention_mask, tokentype_ids=None):
        pooled = self.pool(self.encode(input_ids, attention_mask, tokentype_ids))
        return self.head(self.classifier_dropout(pooled)).astype(ms.float32)


def bert_loss_func(loss_mask, sentence_order, output_tensor):
    """Megatron's pretrain_bert loss: the masked-LM loss (mean over the positions where `loss_mask`
    is 1) plus, with the binary head, the sentence-order loss (mean cross-entropy of the `[b, 2]`
    logits against `sentence_order` [b]). Returns `(loss, {"lm loss": ..., "sop loss": ...})`."""
    lm_loss_, binary_logits = output_tensor
    loss_mask = loss_mask.astype(ms.float32)
    lm_loss = (lm_loss_.astype(ms.float32) * loss_mask).sum() / loss_mask.sum()
    if binary_logits is None:
        return lm_loss, {"lm loss": lm_loss}
    sop_loss = ops.cross_entropy(binary_logits, sentence_order.reshape(-1).astype(ms.int32))
    return lm_loss + sop_loss, {"lm loss": lm_loss, "sop loss": sop_loss}


def build_bert_model(args, vocab_size, pre_process=None, post_process=None, add_lm_head=True, vp_stage=None):
    """The built-in BERT from the model flags (binary head unless --bert-no-binary-head)."""
    return BertModel(TransformerConfig.from_args(args), vocab_size, padded_vocab_size_of(args, vocab_size),
                     add_binary_head=args.bert_binary_head, add_lm_head=add_lm_head,
                     pre_process=pre_process, post_process=post_process, vp_stage=vp_stage)


def build_bert_classifier(args, vocab_size):
    """The built-in BERT from the model flags with a classifier of `args.num_classes` classes."""
    return BertSequenceClassifier(TransformerConfig.from_args(args), vocab_size, padded_vocab_size_of(args, vocab_size), args.num_classes)
