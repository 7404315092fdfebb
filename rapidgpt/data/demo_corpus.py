"""The embedded demo corpus: Python's own documentation, so a demo needs no download.

Every Python installation carries the text of the language reference's topics in
`pydoc_data.topics` (~80 documents, ~460 KB of English). `demo_corpus()` turns it into jsonl,
trains a byte-level BPE on it and preprocesses it into a Megatron mmap dataset, once; later
calls find the result in the user cache directory (`$RAPIDGPT_CACHE_DIR`, else
`$XDG_CACHE_HOME/rapidgpt`, else `~/.cache/rapidgpt`). The folder name carries a hash of the
text and settings, so another Python version or vocabulary size builds its own copy.
"""
import hashlib
import json
import os
import shutil
import tempfile

from rapidgpt.data.indexed_dataset import IndexedDataset
from rapidgpt.data.preprocess import get_args, output_prefix_for, preprocess
from rapidgpt.tokenizer import save_gpt2_format, train_byte_level_bpe

DEMO_VOCAB_SIZE = 4096


def cache_root():
    root = os.environ.get("RAPIDGPT_CACHE_DIR")
    if not root:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                            "rapidgpt")
    return root


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


def demo_corpus(vocab_size=DEMO_VOCAB_SIZE, cache_dir=None):
    """Paths of the demo dataset (`data_prefix`, `vocab_file`, `merge_file`, `jsonl`), built if missing."""
    documents = demo_documents()
    digest = hashlib.sha1(json.dumps([documents, vocab_size]).encode("utf-8")).hexdigest()[:12]
    root = cache_dir or cache_root()
    final = os.path.join(root, f"demo-{digest}")
    if IndexedDataset.exists(_paths(final)["data_prefix"]):
        return _paths(final)
    os.makedirs(root, exist_ok=True)
    # Build in a private folder and publish it with one rename: concurrent builders (several
    # ranks, two terminals) never see a half-built corpus, and a crash leaves nothing behind.
    work = tempfile.mkdtemp(prefix=".demo-build-", dir=root)
    try:
        paths = _paths(work)
        with open(paths["jsonl"], "w", encoding="utf-8") as f:
            for text in documents:
                f.write(json.dumps({"text": text}) + "\n")
        vocab, merges = train_byte_level_bpe(documents, vocab_size)
        save_gpt2_format(vocab, merges, work)
        preprocess(get_args(["--input", paths["jsonl"], "--output-prefix", os.path.join(work, "demo"),
                             "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", paths["vocab_file"],
                             "--merge-file", paths["merge_file"], "--append-eod", "--log-interval", str(10 ** 9),
                             "--no-progress-bar"]))
        try:
            os.rename(work, final)
        except OSError:
            if not IndexedDataset.exists(_paths(final)["data_prefix"]):
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _paths(final)
