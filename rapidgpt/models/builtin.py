"""The built-in models, chosen by --model-type (rapidgpt/config/bert.py): GPT or BERT."""
from rapidgpt.models.bert import build_bert_classifier, build_bert_model
from rapidgpt.models.classification import build_gpt_classifier
from rapidgpt.models.gpt import build_gpt_model


def build_model(args, vocab_size, pre_process=None, post_process=None):
    """The built-in language model (this rank's pipeline stage unless told otherwise)."""
    build = build_bert_model if args.model_type == "bert" else build_gpt_model
    return build(args, vocab_size, pre_process, post_process)


def build_classifier(args, vocab_size):
    """The built-in model with a classifier of `args.num_classes` classes."""
    build = build_bert_classifier if args.model_type == "bert" else build_gpt_classifier
    return build(args, vocab_size)
