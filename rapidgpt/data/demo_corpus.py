"""The embedded demo corpus: Python's own documentation, so a demo needs no download.

Every Python installation carries the text of the language reference's topics in
`pydoc_data.topics` (~80 documents, ~460 KB of English). `demo_corpus()` turns it into jsonl,
trains a byte-level BPE on it and preprocesses it into a Megatron mmap dataset, once; later
calls find the result in the user cache directory (`$RAPIDGPT_CACHE_DIR`, else
`$XDG_CACHE_HOME/rapidgpt`, else `~/.cache/rapidgpt`). The folder name carries a hash of the
text and settings, so another Python version or vocabulary size builds its own copy.
`demo_bert_corpus()` is the same documents as BERT data: a WordPiece vocabulary made from them and
sentence-level .bin/.idx (preprocess_data.py --split-sentences). `demo_hf_corpus()` is the demo's
vocabulary as a Hugging Face tokenizer folder (tokenizer.json, tokenizer_config.json) and the
documents preprocessed with it (--tokenizer-type HuggingFaceTokenizer), as Megatron's Llama
examples give their data.
"""
import hashlib
import json
import os
import shutil
import tempfile

from rapidgpt.data.indexed_dataset import IndexedDataset
from rapidgpt.data.preprocess import get_args, output_prefix_for, preprocess
from rapidgpt.tokenizer import save_gpt2_format, train_byte_level_bpe
from rapidgpt.tokenizer.wordpiece_trainer import save_wordpiece_vocab, wordpiece_vocabulary
from rapidgpt.utils import cache_root

DEMO_VOCAB_SIZE = 4096
DEMO_BERT_VOCAB_SIZE = 4096


def demo_documents():
    """The demo's documents: each `pydoc_data.topics` entry, in sorted topic order."""
    from pydoc_data.topics import topics
    return [topics[name] for name in sorted(topics)]


def _paths(folder):
    return {"data_prefix": output_prefix_for(os.path.join(folder, "demo"), "text"),
            "vocab_file": os.path.join(folder, "vocab.json"),
            "merge_file": os.path.join(folder, "merges.txt"),
            "jsonl": os.path.join(folder, "demo.jsonl"),
            "folder": folder}


def _bert_paths(folder):
    return {"data_prefix": output_prefix_for(os.path.join(folder, "demo"), "text", "sentence"),
            "vocab_file": os.path.join(folder, "vocab.txt"),
            "jsonl": os.path.join(folder, "demo.jsonl"),
            "folder": folder}


def _hf_paths(folder):
    return {"data_prefix": output_prefix_for(os.path.join(folder, "demo"), "text"),
            "tokenizer_model": os.path.join(folder, "tokenizer"),
            "jsonl": os.path.join(folder, "demo.jsonl"),
            "folder": folder}


def _built_once(name, settings, paths_of, build, cache_dir=None):
    """`paths_of(folder)` of a corpus built by `build(paths)` into a folder named after `name` and
    a hash of the documents and `settings`, once: later calls find it there."""
    documents = demo_documents()
    digest = hashlib.sha1(json.dumps([documents, settings]).encode("utf-8")).hexdigest()[:12]
    root = cache_dir or cache_root()
    final = os.path.join(root, f"{name}-{digest}")
    if IndexedDataset.exists(paths_of(final)["data_prefix"]):
        return paths_of(final)
    os.makedirs(root, exist_ok=True)
    # Build in a private folder and publish it with one rename: concurrent builders (several
    # ranks, two terminals) never see a half-built corpus, and a crash leaves nothing behind.
    work = tempfile.mkdtemp(prefix=f".{name}-build-", dir=root)
    try:
        paths = paths_of(work)
        with open(paths["jsonl"], "w", encoding="utf-8") as f:
            for text in documents:
                f.write(json.dumps({"text": text}) + "\n")
        build(documents, paths)
        try:
            os.rename(work, final)
        except OSError:
            if not IndexedDataset.exists(paths_of(final)["data_prefix"]):
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return paths_of(final)


def demo_corpus(vocab_size=DEMO_VOCAB_SIZE, cache_dir=None):
    """Paths of the demo dataset (`data_prefix`, `vocab_file`, `merge_file`, `jsonl`), built if missing."""
    def build(documents, paths):
        vocab, merges = train_byte_level_bpe(documents, vocab_size)
        save_gpt2_format(vocab, merges, paths["folder"])
        preprocess(get_args(["--input", paths["jsonl"], "--output-prefix", os.path.join(paths["folder"], "demo"),
                             "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", paths["vocab_file"],
                             "--merge-file", paths["merge_file"], "--append-eod", "--log-interval", str(10 ** 9),
                             "--no-progress-bar"]))
    return _built_once("demo", vocab_size, _paths, build, cache_dir)


def demo_bert_corpus(vocab_size=DEMO_BERT_VOCAB_SIZE, cache_dir=None):
    """Paths of the demo documents as BERT data (`data_prefix` ..._text_sentence, `vocab_file`
    vocab.txt for BertWordPieceLowerCase, `jsonl`): a WordPiece vocabulary of the corpus's frequent
    words (`wordpiece_vocabulary`) and `preprocess_data.py --split-sentences`, built once."""
    def build(documents, paths):
        save_wordpiece_vocab(wordpiece_vocabulary(documents, vocab_size), paths["folder"])
        preprocess(get_args(["--input", paths["jsonl"], "--output-prefix", os.path.join(paths["folder"], "demo"),
                             "--tokenizer-type", "BertWordPieceLowerCase", "--vocab-file", paths["vocab_file"],
                             "--split-sentences", "--log-interval", str(10 ** 9), "--no-progress-bar"]))
    return _built_once("demo-bert", vocab_size, _bert_paths, build, cache_dir)


def demo_hf_corpus(vocab_size=DEMO_VOCAB_SIZE, cache_dir=None):
    """Paths of the demo documents tokenized by a Hugging Face tokenizer folder (`data_prefix`,
    `tokenizer_model` the folder, `jsonl`): demo_corpus()'s byte-level BPE written by the
    `tokenizers` library as tokenizer.json, "<|endoftext|>" its EOS, built once."""
    def build(documents, paths):
        from tokenizers import ByteLevelBPETokenizer
        gpt2 = demo_corpus(vocab_size, cache_dir)
        folder = paths["tokenizer_model"]
        os.makedirs(folder)
        tokenizer = ByteLevelBPETokenizer(gpt2["vocab_file"], gpt2["merge_file"])
        tokenizer.add_special_tokens(["<|endoftext|>"])
        tokenizer.save(os.path.join(folder, "tokenizer.json"))
        with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump({"eos_token": "<|endoftext|>", "tokenizer_class": "PreTrainedTokenizerFast"}, f)
        preprocess(get_args(["--input", paths["jsonl"], "--output-prefix", os.path.join(paths["folder"], "demo"),
                             "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", folder,
                             "--append-eod", "--log-interval", str(10 ** 9), "--no-progress-bar"]))
    return _built_once("demo-hf", vocab_size, _hf_paths, build, cache_dir)
