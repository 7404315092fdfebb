"""Raw text to Megatron mmap datasets, with the flags of Megatron's tools/preprocess_data.py.

    python data_tools/preprocess_data.py --input corpus.jsonl --json-keys text \\
        --output-prefix corpus --tokenizer-type GPT2BPETokenizer \\
        --vocab-file vocab.json --merge-file merges.txt --append-eod --workers 2

writes `corpus_text_document.bin/.idx`, each document one sequence. With --split-sentences
(BERT's data) each document is cut into sentences, one sequence each, written as
`corpus_text_sentence.bin/.idx` (Megatron's name): by NLTK's Punkt algorithm, its parameters
learned from this corpus itself (its first --punkt-train-bytes; see `train_sentence_splitter`).
Megatron instead loads NLTK's pretrained English Punkt model, which needs a download; learned from
the corpus, Punkt finds its abbreviations and sentence starters the same unsupervised way, so the
boundaries agree on ordinary prose and can differ around abbreviations the corpus rarely uses.
A JSON value that is already a list of strings is taken as the document's sentences.

The input is streamed line by line (a corpus larger than RAM is fine) and tokenized by a process pool that keeps input order, so the output is the same
whatever `--workers` is. Files are written under temporary names and renamed only when the
whole input succeeded: a bad line or a crash never leaves a half dataset under the final name.
"""
import argparse
import json
import multiprocessing
import os
import sys
import time

import numpy as np
from tqdm import tqdm

from rapidgpt.data.indexed_dataset import (IndexedDatasetBuilder, best_fitting_dtype,
                                           data_file_path, index_file_path)
from rapidgpt.tokenizer import TOKENIZER_MODEL_HELP, TOKENIZER_TYPES, build_tokenizer
from rapidgpt.tokenizer.null_tokenizer import EOD_HELP as NULL_EOD_HELP, NullTokenizerError
from rapidgpt.tokenizer.tiktoken_tokenizer import add_tiktoken_args, flag_problems as tiktoken_flag_problems
from rapidgpt.utils import bounded_imap


class PreprocessError(Exception):
    """A problem with the input or the flags; the message says where and what to do."""


def get_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_argument_group("input data")
    group.add_argument("--input", required=True, help="jsonl file (one JSON object per line), or "
                       "plain text with --input-format text (one document per line)")
    group.add_argument("--input-format", choices=["jsonl", "text"], default="jsonl")
    group.add_argument("--json-keys", nargs="+", default=["text"],
                       help="keys to extract from each JSON line; one dataset per key")
    group.add_argument("--split-sentences", action="store_true",
                       help="one sequence per sentence (BERT's data), written as {prefix}_{key}_sentence: "
                            "NLTK's Punkt, trained on the first --punkt-train-bytes of this corpus (nothing "
                            "is downloaded; Megatron's pretrained English model can split abbreviations "
                            "differently)")
    group.add_argument("--punkt-train-bytes", type=int, default=16 << 20,
                       help="--split-sentences: bytes of the input Punkt learns from (default 16 MiB)")
    group.add_argument("--keep-newlines", action="store_true",
                       help="accepted for compatibility; text is never stripped of newlines here (a "
                            "sentence keeps the newlines inside it)")
    group = parser.add_argument_group("tokenizer")
    group.add_argument("--tokenizer-type", required=True, choices=TOKENIZER_TYPES)
    group.add_argument("--tokenizer-model", default=None, metavar="PATH", help=TOKENIZER_MODEL_HELP)
    group.add_argument("--vocab-file", default=None)
    group.add_argument("--merge-file", default=None)
    group.add_argument("--vocab-size", type=int, default=None,
                       help="NullTokenizer: the token ids are below it; TikTokenizer: its vocabulary size "
                            "(default 131072)")
    group.add_argument("--null-tokenizer-eod-id", type=int, default=None, help=NULL_EOD_HELP)
    add_tiktoken_args(group)
    group.add_argument("--append-eod", action="store_true",
                       help="append the end-of-document token to every document")
    group = parser.add_argument_group("output data")
    group.add_argument("--output-prefix", required=True,
                       help="writes {prefix}_{key}_document.bin/.idx")
    group.add_argument("--dataset-impl", default="mmap", choices=["mmap"],
                       help="only Megatron's mmap format (the one every current tool reads)")
    group = parser.add_argument_group("runtime")
    group.add_argument("--workers", type=int, default=1, help="tokenizer processes")
    group.add_argument("--log-interval", type=int, default=10000,
                       help="print progress every this many documents")
    group.add_argument("--no-progress-bar", action="store_true")
    args = parser.parse_args(argv)
    if args.punkt_train_bytes < 1:
        parser.error(f"--punkt-train-bytes must be at least 1, got {args.punkt_train_bytes}")
    if args.workers < 1:
        parser.error(f"--workers must be at least 1, got {args.workers}")
    if args.input_format == "text" and args.json_keys != ["text"]:
        parser.error("--json-keys applies to jsonl input; plain text gives the single key 'text'")
    problems = tiktoken_flag_problems(args)
    if problems:
        parser.error(problems[0])
    return args


class Encoder:
    """Turns one input line into token ids per key; a process pool holds one tokenizer per worker."""

    tokenizer = None
    dtype = None
    splitter = None

    def __init__(self, args, punkt_params=None):
        self.args = args
        self.punkt_params = punkt_params          # --split-sentences: learned once, shared by the workers

    def initializer(self):
        Encoder.tokenizer = build_tokenizer(self.args)
        Encoder.dtype = best_fitting_dtype(Encoder.tokenizer.vocab_size)
        Encoder.splitter = None
        if self.punkt_params is not None:
            from nltk.tokenize.punkt import PunktSentenceTokenizer
            Encoder.splitter = PunktSentenceTokenizer(self.punkt_params)

    def encode_batch(self, numbered_lines):
        return [self.encode(item) for item in numbered_lines]

    def encode(self, numbered_line):
        """`(line_no, raw bytes)` -> `(line_no, {key: (ids, sequence_lengths)}, n_bytes, error)`."""
        line_no, raw = numbered_line
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            return line_no, None, len(raw), f"not valid UTF-8 ({e.reason} at byte {e.start})"
        text = text.rstrip("\r\n")
        if self.args.input_format == "text":
            record = {"text": text}
        else:
            if not text.strip():
                return line_no, None, len(raw), "empty line where a JSON object was expected"
            try:
                record = json.loads(text)
            except json.JSONDecodeError as e:
                return line_no, None, len(raw), f"invalid JSON ({e.msg}: column {e.colno})"
            if not isinstance(record, dict):
                return line_no, None, len(raw), f"expected a JSON object, got {type(record).__name__}"
        docs = {}
        for key in self.args.json_keys:
            if key not in record:
                return line_no, None, len(raw), (f"no key {key!r} (keys: {', '.join(map(str, record)) or 'none'}); "
                                                 f"set --json-keys")
            value = record[key]
            if isinstance(value, list):
                sentences = value
            elif Encoder.splitter is not None and isinstance(value, str):
                sentences = Encoder.splitter.tokenize(value)
            else:
                sentences = [value]
            if not all(isinstance(s, str) for s in sentences):
                return line_no, None, len(raw), f"key {key!r} must be a string or a list of strings"
            ids, lengths = [], []
            for sentence in sentences:
                try:
                    sentence_ids = Encoder.tokenizer.tokenize(sentence)
                except NullTokenizerError as e:          # the text is not token ids: this line's problem
                    return line_no, None, len(raw), str(e)
                if sentence_ids:
                    ids.extend(sentence_ids)
                    lengths.append(len(sentence_ids))
            if ids and self.args.append_eod:
                ids.append(Encoder.tokenizer.eod)
                lengths[-1] += 1
            # A compact array pickles ~10x faster than a list of ints on its way to the writer.
            docs[key] = (np.array(ids, dtype=Encoder.dtype), lengths)
        return line_no, docs, len(raw), None


def output_prefix_for(output_prefix, key, level="document"):
    """Megatron's output name: `{prefix}_{key}_document`, or `_sentence` with --split-sentences."""
    return f"{output_prefix}_{key}_{level}"


def _record_texts(args, numbered_lines):
    """The text of each input line's --json-keys (what Punkt learns from); bad lines are skipped
    here and reported by the encoder."""
    for _, raw in numbered_lines:
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        if args.input_format == "text":
            yield line
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            yield from (record[key] for key in args.json_keys if isinstance(record.get(key), str))


def train_sentence_splitter(args):
    """NLTK Punkt parameters learned from the input's first --punkt-train-bytes (whole lines):
    Punkt is unsupervised (Kiss & Strunk 2006): it finds the corpus's abbreviations, collocations
    and frequent sentence starters from their statistics, so no pretrained model is needed.
    Deterministic: the same input gives the same parameters."""
    try:
        from nltk.tokenize.punkt import PunktTrainer
    except ImportError:
        raise PreprocessError("--split-sentences needs NLTK (pip install nltk; it is a RapidGPT "
                              "dependency, so reinstall RapidGPT)") from None
    trainer, seen = PunktTrainer(), 0
    for text in _record_texts(args, _numbered_lines(args.input)):
        trainer.train(text, finalize=False)
        seen += len(text)
        if seen >= args.punkt_train_bytes:
            break
    trainer.finalize_training()
    return trainer.get_params()


def _numbered_lines(path):
    with open(path, "rb") as f:
        yield from enumerate(f, start=1)


def _line_batches(numbered_lines, max_bytes=1 << 18):
    """Groups of lines of about `max_bytes`: few enough messages to amortise pickling."""
    batch, size = [], 0
    for item in numbered_lines:
        batch.append(item)
        size += len(item[1])
        if size >= max_bytes:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def preprocess(args):
    """Tokenize `args.input` into one mmap dataset per JSON key; returns the output prefixes."""
    if not os.path.isfile(args.input):
        raise PreprocessError(f"--input {args.input}: no such file")
    build_tokenizer(args)        # validates the tokenizer flags before anything else is done
    encoder = Encoder(args, train_sentence_splitter(args) if args.split_sentences else None)
    encoder.initializer()
    out_dir = os.path.dirname(os.path.abspath(args.output_prefix))
    os.makedirs(out_dir, exist_ok=True)
    level = "sentence" if args.split_sentences else "document"
    prefixes = {key: output_prefix_for(args.output_prefix, key, level) for key in args.json_keys}
    tmp = f".tmp{os.getpid()}"
    builders = {key: IndexedDatasetBuilder(data_file_path(p) + tmp, Encoder.dtype) for key, p in prefixes.items()}
    pool = None
    try:
        lines = _numbered_lines(args.input)
        if args.workers > 1:
            pool = multiprocessing.Pool(args.workers, initializer=encoder.initializer)
            batches = bounded_imap(pool, encoder.encode_batch, _line_batches(lines), 2 * args.workers)
            encoded = (result for batch in batches for result in batch)
        else:
            encoded = map(encoder.encode, lines)
        _write_documents(args, encoded, builders)
        for key, p in prefixes.items():
            builders[key].finalize(index_file_path(p) + tmp)
            os.replace(data_file_path(p) + tmp, data_file_path(p))
            os.replace(index_file_path(p) + tmp, index_file_path(p))
    finally:
        if pool is not None:
            pool.terminate()
        for p in prefixes.values():
            for path in (data_file_path(p) + tmp, index_file_path(p) + tmp):
                if os.path.exists(path):
                    os.remove(path)
    return list(prefixes.values())


def _write_documents(args, encoded, builders):
    total_bytes = os.path.getsize(args.input)
    start = shown = time.time()
    docs_done = bytes_done = 0
    with tqdm(total=total_bytes, unit="B", unit_scale=True, unit_divisor=1024, desc="preprocess",
              disable=args.no_progress_bar, file=sys.stderr) as bar:
        for line_no, docs, n_bytes, error in encoded:
            if error:
                raise PreprocessError(f"{args.input}:{line_no}: {error}")
            for key, (ids, lengths) in docs.items():
                builders[key].add_document(ids, lengths)
            docs_done += 1
            bytes_done += n_bytes
            bar.update(n_bytes)
            now = time.time()
            if now - shown >= 0.5:
                bar.set_postfix_str(f"{docs_done / max(now - start, 1e-9):.0f} docs/s", refresh=False)
                shown = now
            if docs_done % args.log_interval == 0:
                elapsed = max(now - start, 1e-9)
                tqdm.write(f"Processed {docs_done} documents ({docs_done / elapsed:.1f} docs/s, "
                           f"{bytes_done / elapsed / 1024 ** 2:.2f} MB/s).", file=sys.stderr)
    elapsed = max(time.time() - start, 1e-9)
    print(f"Done: {docs_done} documents, {bytes_done / 1024 ** 2:.2f} MB in {elapsed:.1f} s "
          f"({docs_done / elapsed:.1f} docs/s, {bytes_done / elapsed / 1024 ** 2:.2f} MB/s).",
          file=sys.stderr)


def main(argv=None):
    args = get_args(argv)
    try:
        prefixes = preprocess(args)
    except (PreprocessError, ValueError, OSError) as e:
        print(f"preprocess_data: error: {e}", file=sys.stderr)
        return 1
    for p in prefixes:
        print(f"wrote {data_file_path(p)} and {index_file_path(p)}")
    return 0
