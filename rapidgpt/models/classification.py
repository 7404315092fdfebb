"""GPT for sequence classification: a GPT backbone and a linear head on the last real token.

As Hugging Face's GPT2ForSequenceClassification: with causal attention the last real token is the
only one whose hidden state has seen the whole input (and no padding, which comes after it), so
right-padded batches need no attention mask.

    model(tokens [b, s] int32, position_ids [b, s] int32, last_index [b] int32) -> logits [b, classes]

    hidden = backbone.hidden_states(tokens, position_ids)     [b, s, h]  final LayerNorm applied
    last   = hidden[i, last_index[i]] for each sample i       [b, h]
    logits = last W^T + bias,  W [classes, h], bias [classes]

Parameter names: the backbone's under `backbone.` (`backbone.word_embeddings.weight`, ...), so a
pretraining checkpoint's tensors load into them (see --pretrained-checkpoint), and `head.weight`,
`head.bias`, which a pretraining checkpoint does not have: they start from the seeded
initialisation (normal(0, --init-method-std), zero bias). The backbone's language-model output
layer (only with --untie-embeddings-and-output-weights) takes no part and is frozen.
"""
import mindspore as ms
from mindspore import nn, ops

from rapidgpt.models.gpt import build_gpt_model
from rapidgpt.parallel.layers import ReplicatedLinear


class GPTSequenceClassifier(nn.Cell):
    def __init__(self, backbone, num_classes, init_std=0.02):
        super().__init__()
        self.backbone = backbone
        self.head = ReplicatedLinear(backbone.config.hidden_size, num_classes, init_std=init_std)
        if backbone.output_layer is not None:
            backbone.output_layer.weight.requires_grad = False

    def construct(self, tokens, position_ids, last_index):
        hidden = self.backbone.hidden_states(tokens, position_ids)        # [b, s, h]
        last = ops.gather(hidden, last_index, 1, batch_dims=1)            # [b, h]
        return self.head(last).astype(ms.float32)                         # [b, classes], fp32 in 16-bit runs


def build_gpt_classifier(args, vocab_size):
    """The built-in GPT from the model flags with a head of `args.num_classes` classes."""
    return GPTSequenceClassifier(build_gpt_model(args, vocab_size), args.num_classes, args.init_method_std)
