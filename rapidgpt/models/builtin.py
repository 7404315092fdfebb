"""The built-in models, chosen by --model-type (rapidgpt/config/bert.py): GPT or BERT."""
import re

from rapidgpt.models.bert import build_bert_classifier, build_bert_model
from rapidgpt.models.classification import build_gpt_classifier
from rapidgpt.models.gpt import build_gpt_model


def build_model(args, vocab_size, pre_process=None, post_process=None, vp_stage=None):
    """The built-in language model (this rank's pipeline stage, or its model chunk `vp_stage`,
    unless told otherwise)."""
    build = build_bert_model if args.model_type == "bert" else build_gpt_model
    return build(args, vocab_size, pre_process, post_process, vp_stage=vp_stage)


def build_classifier(args, vocab_size):
    """The built-in model with a classifier of `args.num_classes` classes."""
    build = build_bert_classifier if args.model_type == "bert" else build_gpt_classifier
    return build(args, vocab_size)


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_FIRST_STAGE = ("position_embeddings.", "tokentype_embeddings.", "embedding_layernorm.")
_LAST_STAGE = ("final_layernorm.", "output_layer.", "pooler.", "lm_head.", "binary_head.")


def stages_of(name, num_layers, pp_size, tied):
    """The pipeline stages whose checkpoint holds tensor `name` (a GPTModel or BertModel parameter,
    or optimizer state named after one) at `pp_size` stages: a layer's on the stage of its global
    index, the embeddings on the first (and, `tied`, the word embeddings on the last too), the
    final LayerNorm, output layer and BERT's pooler and heads on the last; a tensor of none of them
    (step count, learning rate, loss scaler) on every stage."""
    layer = _LAYER.search(name)
    if layer:
        return [int(layer.group(1)) // (num_layers // pp_size)]
    if "word_embeddings." in name:
        return sorted({0, pp_size - 1}) if tied else [0]
    if any(part in name for part in _FIRST_STAGE):
        return [0]
    if any(part in name for part in _LAST_STAGE):
        return [pp_size - 1]
    return list(range(pp_size))
