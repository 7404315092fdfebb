"""Tokenizers with Megatron's interface, `build_tokenizer` to pick one from the flags, and the
embedding rows a vocabulary is padded to."""
import math

from rapidgpt.tokenizer.bert_wordpiece import BertWordPieceTokenizer
from rapidgpt.tokenizer.bpe_trainer import save_gpt2_format, train_byte_level_bpe
from rapidgpt.tokenizer.gpt2_bpe import GPT2BPETokenizer
from rapidgpt.tokenizer.hf_tokenizer import HuggingFaceTokenizer

__all__ = ["BertWordPieceTokenizer", "GPT2BPETokenizer", "HuggingFaceTokenizer", "build_tokenizer",
           "padded_vocab_size", "save_gpt2_format", "train_byte_level_bpe"]

TOKENIZER_TYPES = ("GPT2BPETokenizer", "BertWordPieceLowerCase", "BertWordPieceCase", "HuggingFaceTokenizer")


def build_tokenizer(args):
    """Build the tokenizer named by --tokenizer-type from --vocab-file (and --merge-file), or from
    --tokenizer-model (a Hugging Face tokenizer folder)."""
    kind = getattr(args, "tokenizer_type", None)
    if kind == "HuggingFaceTokenizer":
        if not getattr(args, "tokenizer_model", None):
            raise ValueError("--tokenizer-model is required for --tokenizer-type HuggingFaceTokenizer: pass the "
                             "folder holding tokenizer.json")
        return HuggingFaceTokenizer(args.tokenizer_model)
    vocab_file = getattr(args, "vocab_file", None)
    merge_file = getattr(args, "merge_file", None)
    if kind not in TOKENIZER_TYPES:
        raise ValueError(f"unknown --tokenizer-type {kind!r}: choose one of "
                         f"{', '.join(TOKENIZER_TYPES)}")
    if vocab_file is None:
        what = "vocab.json" if kind == "GPT2BPETokenizer" else "vocab.txt"
        raise ValueError(f"--vocab-file is required for --tokenizer-type {kind}: pass the "
                         f"tokenizer's {what}")
    if kind == "GPT2BPETokenizer":
        if merge_file is None:
            raise ValueError(f"--merge-file is required for --tokenizer-type {kind}: pass "
                             f"the merges.txt that goes with --vocab-file")
        return GPT2BPETokenizer(vocab_file, merge_file)
    return BertWordPieceTokenizer(vocab_file, lower_case=(kind == "BertWordPieceLowerCase"))


def padded_vocab_size(vocab_size, divisible_by, tensor_parallel_size=1):
    """Megatron's padding of the embedding rows (--make-vocab-size-divisible-by): round up to a
    multiple of divisible_by x TP (fast, evenly split GEMMs)."""
    multiple = divisible_by * tensor_parallel_size
    return int(math.ceil(vocab_size / multiple) * multiple)
