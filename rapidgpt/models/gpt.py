"""GPT (Megatron-core's GPTModel): token embeddings with learned positions or rotary ones
(--position-embedding-type), pre-norm decoder layers (rapidgpt/models/transformer.py: GPT-2 by
default, the Llama family by flags), a final norm, the output layer tied to the embeddings or not.

`GPTModel(tokens [b, s], position_ids=None, attention_mask=None, labels=None)` returns, as
Megatron's GPTModel does, the per-token cross-entropy `[b, s]` when labels are given, otherwise
the logits `[b, s, vocab]` over the TRUE vocabulary: rows added by vocabulary padding
(`--make-vocab-size-divisible-by`) are never part of the softmax, the loss or the returned logits.
With `--untie-embeddings-and-output-weights` the output layer has its own weights. With --use-mup
the embeddings' output and the logits are multiplied by muP's multipliers (rapidgpt/config/mup.py).
`position_ids` `[b, s]` default to 0..s-1 for every sequence (Megatron's data pipeline passes them,
with --reset-position-ids restarting them at document boundaries).

Pipeline stages (Megatron's pre_process/post_process, by default this rank's stage; with the
interleaved schedule one model per virtual stage `vp_stage`): the first stage holds the
embeddings, the last the final LayerNorm, the output layer and the loss, each its range of layers
under their global names (rapidgpt/config/pipeline_split.py). A stage that is not the
first takes its input `[b, s, h]` from Megatron's `set_input_tensor` (tokens are then unused); one
that is not the last returns its hidden states `[b, s, h]`. With tied embeddings the last stage holds
its own copy of the word embeddings, named and initialised as the first stage's; their gradients
are summed over the embedding group, so the two copies stay equal.
"""
from collections import OrderedDict

import mindspore as ms
from mindspore import nn, ops

from rapidgpt.config.pipeline_split import pipeline_split_of
from rapidgpt.config.transformer import TransformerConfig
from rapidgpt.emulated_bf16 import RoundsToBf16
from rapidgpt.models.norms import build_norm
from rapidgpt.models.rotary import RotaryEmbedding
from rapidgpt.models.transformer import ParallelTransformerLayer, TransformerLayers
from rapidgpt.parallel.cross_entropy import VocabParallelCrossEntropy, cross_entropy
from rapidgpt.parallel.layers import ColumnParallelLinear, ReplicatedEmbedding, VocabParallelEmbedding
from rapidgpt.parallel.mappings import (CopyToTensorParallelRegion, GatherFromSequenceParallelRegion,
                                       GatherFromTensorParallelRegion, ScatterToSequenceParallelRegion)
from rapidgpt.parallel.random import Dropout, graph_arange
from rapidgpt.parallel.state import (get_pipeline_model_parallel_rank, get_pipeline_model_parallel_world_size,
                                     get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size)
from rapidgpt.tokenizer import padded_vocab_size


def stage_word_embeddings(padded_vocab_size, vocab_size, hidden_size, init_std, pre_process, tied_to_output):
    """The word embeddings `[padded / tp, h]` of a stage that holds them. Tied to the output layer
    with pipeline stages, the first and the last stage each hold a copy: their gradients are summed
    over the embedding group, and the last stage's copy is not counted again in the gradient norm."""
    embeddings = VocabParallelEmbedding(padded_vocab_size, hidden_size, init_std, real_vocab_size=vocab_size)
    if tied_to_output and get_pipeline_model_parallel_world_size() > 1:
        embeddings.weight.pipeline_shared = True
        embeddings.weight.pipeline_shared_copy = not pre_process
    return embeddings


class LanguageModelStage(RoundsToBf16, nn.Cell):
    """What the built-in models (GPTModel, BertModel) share: `vocab_size` real rows of
    `padded_vocab_size`, and the part of the model this rank's pipeline stage holds:
    `pre_process` (the first stage: embeddings), `post_process` (the last: the heads; None: as this
    rank's stage says), `stage_layers` (its layers' numbers); `vp_stage`: which of the rank's model
    chunks this is under the interleaved schedule (None without it)."""

    def __init__(self, config, vocab_size, padded_vocab_size, pre_process=None, post_process=None, vp_stage=None):
        super().__init__()
        if padded_vocab_size < vocab_size:
            raise ValueError(f"padded vocabulary {padded_vocab_size} smaller than vocabulary {vocab_size}")
        pp_rank, chunk = get_pipeline_model_parallel_rank(), vp_stage or 0
        split = pipeline_split_of(config, get_pipeline_model_parallel_world_size(), vp_stage)
        self.pre_process = split.holds_embedding(pp_rank, chunk) if pre_process is None else pre_process
        self.post_process = split.holds_loss(pp_rank, chunk) if post_process is None else post_process
        self.stage_layers = split.layer_range(pp_rank, chunk)
        self.config = config
        self.vocab_size, self.padded_vocab_size = vocab_size, padded_vocab_size
        self.input_tensor = None

    def set_input_tensor(self, input_tensor):
        """Megatron's contract: the input `[b, s, h]` of this (not first) stage's next forward (the
        pipeline schedule sets it before each forward, rapidgpt/training/pipeline_schedules.py)."""
        self.input_tensor = input_tensor


class GPTModel(LanguageModelStage):
    def __init__(self, config, vocab_size, padded_vocab_size, untie_embeddings_and_output_weights=False,
                 pre_process=None, post_process=None, vp_stage=None):
        super().__init__(config, vocab_size, padded_vocab_size, pre_process, post_process, vp_stage)
        h, std = config.hidden_size, config.embedding_init_std
        self.untied = untie_embeddings_and_output_weights
        if self.pre_process or (self.post_process and not self.untied):
            self.word_embeddings = stage_word_embeddings(padded_vocab_size, vocab_size, h, std, self.pre_process,
                                                         tied_to_output=not self.untied)
        self.learned_positions = config.position_embedding_type == "learned_absolute"
        self.embedding_mult = config.mup.embedding_mult
        sp = self.sequence_parallel = config.sequence_parallel and get_tensor_model_parallel_world_size() > 1
        if self.pre_process:
            if self.learned_positions:
                self.position_embeddings = ReplicatedEmbedding(config.max_position_embeddings, h, std)
            if sp:
                self.scatter_sequence = SubCell(ScatterToSequenceParallelRegion())
            self.embedding_dropout = Dropout(config.hidden_dropout, partition_dim=1 if sp else None)
        # Multi-latent attention has its own rotary channels, beside any --position-embedding-type
        self.rotary = RotaryEmbedding(config) if config.position_embedding_type == "rope" or config.mla.enabled \
            else None
        self.layers = TransformerLayers(OrderedDict((str(i), ParallelTransformerLayer(config, i + 1))
                                                   for i in self.stage_layers))
        if self.post_process:
            self.final_layernorm = build_norm(config, h, summed_over_tp=sp)
            if sp:       # the output layer's copy_to_region sums the gradient: the gather only splits it
                self.gather_sequence = SubCell(GatherFromSequenceParallelRegion(reduce_grad=False))
            self.output_layer = (ColumnParallelLinear(h, padded_vocab_size, bias=False,
                                                      init_std=config.output_layer_init_std, drawn_rows=vocab_size)
                                 if self.untied else None)
            self.head = LanguageModelHead(vocab_size, padded_vocab_size, config.mup.output_mult)

    def output_weight(self):
        layer = self.output_layer if self.untied else self.word_embeddings
        return layer.whole_weights()[0]

    def hidden_states(self, tokens, position_ids=None, attention_mask=None, keep=()):
        """This stage's output `[b, s, h]`: after the final norm on the last stage (for heads
        such as classification), the last layer's output on the others (with sequence
        parallelism `[b, s / tp, h]`, this rank's part, which the next stage continues from).
        With `keep` (layer positions, see TransformerLayers), `(output, the states entering them)`
        (under sequence parallelism this rank's parts, `[b, s / tp, h]`)."""
        if position_ids is None and (self.rotary is not None or (self.pre_process and self.learned_positions)):
            position_ids = graph_arange(0, tokens.shape[1])           # [s], same for each row (ops.arange
            # runs interpreted Python inside a graph, which MindSpore then warns about)
        if self.pre_process:
            x = self.embed(tokens, position_ids)
            if self.sequence_parallel:
                x = self.scatter_sequence(x)
            x = self.embedding_dropout(x)
        else:
            x = self.input_tensor
        x = self.layers(x, attention_mask, None if self.rotary is None else self.rotary(position_ids), keep)
        x, kept = x if keep else (x, ())
        if self.post_process:
            x = self.final_layernorm(x)
            x = self.gather_sequence(x) if self.sequence_parallel else x
        return (x, kept) if keep else x

    def embed(self, tokens, position_ids):
        """`[b, s]` -> `[b, s, h]`: the word embeddings, plus the learned positions' when there are
        (times --mup-embedding-mult with --use-mup)."""
        x = self.word_embeddings(tokens)
        if self.learned_positions:
            x = self.rounded(x + self.position_embeddings(position_ids))
        return self.rounded(x * self.embedding_mult) if self.embedding_mult != 1.0 else x

    def logits(self, x):
        """`[b, s, h]` final hidden states -> `[b*s, vocab]` logits over the true vocabulary."""
        return self.head.logits(x, self.output_weight())

    def decode(self, tokens, position_ids, past=None):
        """Generation step with a key/value cache: logits `[b, s_new, vocab]` of the new tokens and
        the cache to pass next time (one (k, v) per layer). Only the new tokens are computed."""
        x = self.embed(tokens, position_ids)
        rotary = None if self.rotary is None else self.rotary(position_ids)
        presents = []
        for i, layer in enumerate(self.layers):
            x, present = layer.decode(x, None if past is None else past[i], rotary)
            presents.append(present)
        x = self.final_layernorm(x)
        return self.logits(x).reshape(x.shape[0], x.shape[1], self.vocab_size), presents

    def construct(self, tokens, position_ids=None, attention_mask=None, labels=None):
        x = self.hidden_states(tokens, position_ids, attention_mask)
        if not self.post_process:
            return x
        if labels is None:
            b, s, _ = x.shape
            return self.logits(x).reshape(b, s, self.vocab_size)
        return self.head(x, self.output_weight(), labels)


class SubCell(nn.Cell):
    """`cell` called from a cell of its own: a region boundary the model calls (it has a custom
    backward) must not sit in the model's own construct, which a pipeline stage runs op by op
    (rapidgpt/training/model_transforms.py compiles sub-cells that hold one)."""

    def __init__(self, cell):
        super().__init__()
        self.cell = cell

    def construct(self, x):
        return self.cell(x)


class LanguageModelHead(RoundsToBf16, nn.Cell):
    """The output layer and the loss, without parameters of their own: the output weight
    `[padded / tp, h]` (the word embeddings, or the untied output layer's) is an input.

    `(x [b, s, h] final hidden states, weight, labels [b, s], bias=None) -> per-token loss [b, s]` (fp32).
    At tensor-parallel size > 1 the logits stay split over the vocabulary: the loss never needs
    them whole. A cell of its own so that a pipeline stage can compile it as one graph: its
    tensor-parallel boundaries have custom backwards, which MindSpore 2.10 runs only inside a
    graph, and the loss runs several times faster compiled than in PyNative
    (rapidgpt/training/model_transforms.py, compile_pipeline_stage).
    """

    def __init__(self, vocab_size, padded_vocab_size, output_mult=1.0):
        super().__init__()
        self.vocab_size, self.padded_vocab_size = vocab_size, padded_vocab_size
        self.output_mult = output_mult              # muP's logit multiplier (rapidgpt/config/mup.py)
        self.logits_matmul = ops.MatMul(transpose_b=True)
        self.tp = get_tensor_model_parallel_world_size()
        if self.tp > 1:
            self.copy_to_region = CopyToTensorParallelRegion()
            self.gather_from_region = GatherFromTensorParallelRegion()
            rows = padded_vocab_size // self.tp          # this rank's vocabulary rows
            self.cross_entropy = VocabParallelCrossEntropy(get_tensor_model_parallel_rank() * rows, rows, vocab_size)

    def parallel_logits(self, x, weight, bias=None):
        """`[b, s, h]` -> `[b*s, padded / tp]` fp32: this rank's vocabulary slice, times `output_mult`
        (a 16-bit model's product cast to fp32: the softmax and the loss are computed in fp32). `bias`: this rank's
        slice `[padded / tp]` of an output bias (BERT's), or None."""
        b, s, h = x.shape
        x = x.reshape(b * s, h)
        if self.tp > 1:
            x = self.copy_to_region(x)
        logits = self.rounded(self.logits_matmul(x, weight))    # emulated bf16: bf16 logits, as a bf16 run's
        if self.output_mult != 1.0:                              # in the model's dtype, as Megatron's _scale_logits
            logits = self.rounded(logits * self.output_mult)
        if bias is not None:
            logits = self.rounded(logits + bias)
        return logits if logits.dtype == ms.float32 else logits.astype(ms.float32)

    def logits(self, x, weight, bias=None):
        """`[b, s, h]` -> `[b*s, vocab]` logits over the true vocabulary."""
        logits = self.parallel_logits(x, weight, bias)
        if self.tp > 1:
            logits = self.gather_from_region(logits)                                # [b*s, padded]
        if self.padded_vocab_size > self.vocab_size:
            logits = logits[:, :self.vocab_size]
        return logits

    def construct(self, x, weight, labels, bias=None):
        return self.loss(self.parallel_logits(x, weight, bias), labels)

    def loss(self, logits, labels):
        """`parallel_logits`' `[b*s, padded / tp]` and labels `[b, s]` -> per-token loss `[b, s]` (fp32)."""
        if self.tp > 1:
            losses = self.cross_entropy(logits, labels.reshape(-1))
        else:
            losses = cross_entropy(logits[:, :self.vocab_size] if self.padded_vocab_size > self.vocab_size
                                   else logits, labels.reshape(-1))
        return losses.reshape(labels.shape)


def lm_loss_func(loss_mask, output_tensor, per_token=False):
    """Megatron's loss_func: mean of the per-token losses where `loss_mask` is 1; with `per_token`
    (--calculate-per-token-loss) their sum and count, (sum, tokens), which the schedule divides by
    all the step's tokens (rapidgpt/training/schedules.py)."""
    loss_mask = loss_mask.astype(output_tensor.dtype)
    if per_token:
        return (output_tensor * loss_mask).sum(), loss_mask.sum()
    return (output_tensor * loss_mask).sum() / loss_mask.sum()


def padded_vocab_size_of(args, vocab_size):
    """The vocabulary rows a built-in model holds: `vocab_size` padded as
    --make-vocab-size-divisible-by and the tensor-parallel size say."""
    return padded_vocab_size(vocab_size, args.make_vocab_size_divisible_by, get_tensor_model_parallel_world_size())


def build_gpt_model(args, vocab_size, pre_process=None, post_process=None, vp_stage=None):
    """The built-in GPT from the model flags (`vocab_size`: the tokenizer's or --vocab-size); this
    rank's pipeline stage (its model chunk `vp_stage`) unless `pre_process`/`post_process` say
    otherwise."""
    return GPTModel(TransformerConfig.from_args(args), vocab_size, padded_vocab_size_of(args, vocab_size),
                    args.untie_embeddings_and_output_weights, pre_process, post_process, vp_stage)
