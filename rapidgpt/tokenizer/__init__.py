"""Tokenizers with Megatron's interface, `build_tokenizer` to pick one from the flags
(TOKENIZER_TYPES: the --tokenizer-type choices of training and preprocessing), and the embedding
rows a vocabulary is padded to."""
import math
import os

from rapidgpt.tokenizer.bert_wordpiece import BertWordPieceTokenizer
from rapidgpt.tokenizer.bpe_trainer import save_gpt2_format, train_byte_level_bpe
from rapidgpt.tokenizer.gpt2_bpe import GPT2BPETokenizer
from rapidgpt.tokenizer.hf_tokenizer import FOLDER_FILES, HuggingFaceTokenizer, folder_problem
from rapidgpt.tokenizer.null_tokenizer import NullTokenizer
from rapidgpt.tokenizer.sentencepiece_tokenizer import SENTENCEPIECE_TYPES, SentencePieceTokenizer, model_file_problem
from rapidgpt.tokenizer.tiktoken_tokenizer import TikTokenizer, vocabulary_problem

__all__ = ["BertWordPieceTokenizer", "GPT2BPETokenizer", "HuggingFaceTokenizer", "NullTokenizer",
           "SentencePieceTokenizer", "TikTokenizer",
           "TOKENIZER_TYPES", "build_tokenizer", "padded_vocab_size", "save_gpt2_format", "train_byte_level_bpe"]

TOKENIZER_TYPES = ("GPT2BPETokenizer", "BertWordPieceLowerCase", "BertWordPieceCase", "HuggingFaceTokenizer",
                   *SENTENCEPIECE_TYPES, "TikTokenizer", "NullTokenizer")
# The types read from --tokenizer-model rather than --vocab-file -> what their --tokenizer-model is.
TOKENIZER_MODELS = {"HuggingFaceTokenizer": "folder holding tokenizer.json",
                    **{kind: "SentencePiece model file" for kind in SENTENCEPIECE_TYPES},
                    "TikTokenizer": "tiktoken vocabulary .json"}
MODEL_TOKENIZER_TYPES = tuple(TOKENIZER_MODELS)
# Tokenizer flags naming files (a Hugging Face tokenizer: a folder, of which its FOLDER_FILES are kept).
TOKENIZER_FILE_ARGS = ("vocab_file", "merge_file", "tokenizer_model")
TOKENIZER_MODEL_HELP = ("--tokenizer-type HuggingFaceTokenizer: a Hugging Face tokenizer folder (tokenizer.json, "
                        "tokenizer_config.json), as saved by save_pretrained, read with the `tokenizers` library; "
                        "GPTSentencePieceTokenizer / Llama2Tokenizer: a SentencePiece model file (tokenizer.model), "
                        "read with the optional `sentencepiece` library; TikTokenizer: a tiktoken vocabulary "
                        ".json (a list of rank, token_bytes, token_str), read with the optional `tiktoken` library")


def tokenizer_files(path):
    """The files a tokenizer flag's value stands for: the file, or a tokenizer folder's files."""
    if not path:
        return []
    if os.path.isdir(path):
        return [os.path.join(path, name) for name in FOLDER_FILES if os.path.isfile(os.path.join(path, name))]
    return [path]


def run_tokenizer_files(args):
    """Every file the run's tokenizer flags (TOKENIZER_FILE_ARGS) name."""
    return [path for key in TOKENIZER_FILE_ARGS for path in tokenizer_files(getattr(args, key, None))]


def inferred_tokenizer_type(vocab_file, merge_file):
    """The --tokenizer-type an old Megatron command line means when it gives vocabulary files but no
    type (Megatron's pretrain_gpt.py and pretrain_bert.py defaulted it): merges -> GPT2BPETokenizer;
    a vocab.txt alone (WordPiece, one token per line) -> BertWordPieceLowerCase. None for a GPT-2
    vocab.json without its merges."""
    if merge_file:
        return "GPT2BPETokenizer"
    if vocab_file and not vocab_file.endswith(".json"):
        return "BertWordPieceLowerCase"
    return None


def check_tokenizer_model(kind, path, check):
    """The flag check of --tokenizer-model for --tokenizer-type `kind` (one of
    MODEL_TOKENIZER_TYPES), into the flag checker `check`."""
    if check.require(path, f"--tokenizer-model: required for --tokenizer-type {kind}; give the "
                           f"{TOKENIZER_MODELS[kind]}"):
        if kind == "HuggingFaceTokenizer":
            problem = folder_problem(path)
        elif kind == "TikTokenizer":
            problem = vocabulary_problem(path)
        else:
            problem = model_file_problem(kind, path)
        check.require(problem is None, f"--tokenizer-model: {problem}")


def build_tokenizer(args):
    """Build the tokenizer named by --tokenizer-type from --vocab-file (and --merge-file), or from
    --tokenizer-model (a Hugging Face tokenizer folder, a SentencePiece model file, a tiktoken
    vocabulary)."""
    kind = getattr(args, "tokenizer_type", None)
    if kind in MODEL_TOKENIZER_TYPES:
        model = getattr(args, "tokenizer_model", None)
        if not model:
            raise ValueError(f"--tokenizer-model is required for --tokenizer-type {kind}: pass the "
                             f"{TOKENIZER_MODELS[kind]}")
        if kind == "HuggingFaceTokenizer":
            return HuggingFaceTokenizer(model)
        if kind == "TikTokenizer":
            return TikTokenizer.from_args(model, args)
        return SentencePieceTokenizer(model, add_bos=(kind == "Llama2Tokenizer"))
    if kind == "NullTokenizer":
        if not getattr(args, "vocab_size", None):
            raise ValueError("--vocab-size is required for --tokenizer-type NullTokenizer: the data's token ids "
                             "are below it")
        return NullTokenizer(args.vocab_size, getattr(args, "null_tokenizer_eod_id", None))
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
