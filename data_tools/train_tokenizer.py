"""Train a tokenizer on your corpus: GPT-2's byte-level BPE (vocab.json and merges.txt), or a
BERT WordPiece vocabulary (vocab.txt).

    python data_tools/train_tokenizer.py --input corpus.jsonl --vocab-size 32000 \
        --output-dir my_tokenizer --workers 4
    python data_tools/train_tokenizer.py --input corpus.jsonl --vocab-size 32000 \
        --output-dir my_bert_tokenizer --tokenizer-type BertWordPieceLowerCase

--tokenizer-type names the tokenizer the files are for, as preprocess_data.py and rapidgpt
take it (Megatron's names). Input is streamed line by line: jsonl (one JSON object per line;
the --json-keys fields are the text) or plain text. The training itself lives in
rapidgpt.tokenizer.bpe_trainer and rapidgpt.tokenizer.wordpiece_trainer; this script only
reads files and reports.
"""
import argparse
import json
import os
import sys
import time

try:
    import rapidgpt  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tqdm import tqdm

from rapidgpt.tokenizer.bpe_trainer import save_gpt2_format, train_byte_level_bpe
from rapidgpt.tokenizer.wordpiece_trainer import save_wordpiece_vocab, wordpiece_vocabulary

TOKENIZER_TYPES = ("GPT2BPETokenizer", "BertWordPieceLowerCase", "BertWordPieceCase")

# Plain text is handed to the trainer in blocks of whole lines of about this size, so that
# whitespace runs spanning lines ("\n\n") are learned as they appear in documents.
_TEXT_BLOCK_BYTES = 1 << 20


def _jsonl_texts(path, f, json_keys, progress):
    for lineno, line in enumerate(f, 1):
        progress.update(len(line))
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:  # JSONDecodeError, or UnicodeDecodeError on bad UTF-8
            raise ValueError(f"{path}:{lineno}: invalid JSON line: {e}") from None
        for key in json_keys:
            text = record.get(key) if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise ValueError(f"{path}:{lineno}: expected a JSON object with a string "
                                 f"field {key!r} (see --json-keys)")
            yield text


def _plain_texts(path, f, progress):
    block, size = [], 0
    for lineno, line in enumerate(f, 1):
        progress.update(len(line))
        try:
            block.append(line.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}:{lineno}: not valid UTF-8: {e}") from None
        size += len(line)
        if size >= _TEXT_BLOCK_BYTES:
            yield "".join(block)
            block, size = [], 0
    if block:
        yield "".join(block)


def iter_texts(paths, input_format, json_keys):
    """Yield the texts of all input files, with a byte-count progress bar over all of them."""
    with tqdm(total=sum(os.path.getsize(p) for p in paths), desc="reading", unit="B",
              unit_scale=True) as progress:
        for path in paths:
            fmt = input_format
            if fmt == "auto":
                fmt = "jsonl" if path.endswith((".jsonl", ".json")) else "text"
            with open(path, "rb") as f:  # bytes: progress in bytes, and we decode ourselves
                if fmt == "jsonl":
                    yield from _jsonl_texts(path, f, json_keys, progress)
                else:
                    yield from _plain_texts(path, f, progress)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--input", nargs="+", required=True, metavar="FILE",
                        help="input files (jsonl or plain text)")
    parser.add_argument("--input-format", choices=("auto", "jsonl", "text"), default="auto",
                        help="auto: .jsonl/.json files are jsonl, others plain text")
    parser.add_argument("--json-keys", nargs="+", default=["text"],
                        help="jsonl fields that hold text (default: text)")
    parser.add_argument("--tokenizer-type", choices=TOKENIZER_TYPES, default="GPT2BPETokenizer",
                        help="GPT2BPETokenizer: byte-level BPE, vocab.json + merges.txt (default); "
                             "BertWordPieceLowerCase / BertWordPieceCase: a WordPiece vocab.txt of "
                             "the corpus's characters and most frequent words, lower-cased (and "
                             "accents stripped) or as written")
    parser.add_argument("--vocab-size", type=int, required=True,
                        help="total vocab size. BPE: 256 byte tokens + merges + <|endoftext|>; "
                             "WordPiece: 5 special tokens + every character alone and with ## + "
                             "the most frequent words")
    parser.add_argument("--output-dir", required=True,
                        help="directory for vocab.json and merges.txt (BPE) or vocab.txt (WordPiece)")
    parser.add_argument("--workers", type=int, default=1,
                        help="BPE: processes for counting words (the result does not depend on it)")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    bpe = args.tokenizer_type == "GPT2BPETokenizer"
    try:
        for path in args.input:
            if not os.path.isfile(path):
                raise ValueError(f"input file not found: {path}")
        texts = iter_texts(args.input, args.input_format, args.json_keys)
        if bpe:
            vocab, merges = train_byte_level_bpe(texts, args.vocab_size, show_progress=True,
                                                 workers=args.workers)
        else:
            lines = wordpiece_vocabulary(texts, args.vocab_size,
                                         lower_case=args.tokenizer_type == "BertWordPieceLowerCase")
    except ValueError as e:
        raise SystemExit(f"train_tokenizer.py: error: {e}") from None
    seconds = time.perf_counter() - start
    if bpe:
        vocab_path, merges_path = save_gpt2_format(vocab, merges, args.output_dir)
        print(f"learned {len(merges)} merges (vocab size {len(vocab)}) in {seconds:.1f}s")
        print(f"wrote {vocab_path} and {merges_path}")
    else:
        vocab_path = save_wordpiece_vocab(lines, args.output_dir)
        print(f"made a WordPiece vocabulary of {len(lines)} tokens for {args.tokenizer_type} "
              f"in {seconds:.1f}s")
        print(f"wrote {vocab_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
