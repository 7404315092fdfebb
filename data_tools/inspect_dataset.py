#!/usr/bin/env python
"""Describe a Megatron mmap dataset and check that its index and data agree.

    python data_tools/inspect_dataset.py corpus_text_document \\
        [--tokenizer-type GPT2BPETokenizer --vocab-file vocab.json --merge-file merges.txt]
    python data_tools/inspect_dataset.py --demo       # the embedded demo corpus

Prints counts, dtype, document length statistics, the first tokens of the first documents
(decoded when a tokenizer is given; a document of several sequences, as a --split-sentences
corpus's sentences, sequence by sequence, separated by ' | '), then a full consistency check of the
index against the .bin (with a tokenizer, also that every id is inside its vocabulary). Exits 1 on
any problem.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rapidgpt.data.demo_corpus import demo_corpus  # noqa: E402
from rapidgpt.data.indexed_dataset import (IndexedDataset, IndexedDatasetError,  # noqa: E402
                                           consistency_problems)
from rapidgpt.tokenizer import build_tokenizer  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prefix", nargs="?", help="dataset prefix (the path without .bin/.idx)")
    parser.add_argument("--demo", action="store_true",
                        help="inspect the embedded demo corpus (built first if missing)")
    parser.add_argument("--tokenizer-type", default=None)
    parser.add_argument("--vocab-file", default=None)
    parser.add_argument("--merge-file", default=None)
    parser.add_argument("--show-documents", type=int, default=3)
    parser.add_argument("--show-tokens", type=int, default=32)
    args = parser.parse_args(argv)
    if args.demo:
        paths = demo_corpus()
        args.prefix, args.vocab_file, args.merge_file = (paths["data_prefix"], paths["vocab_file"],
                                                         paths["merge_file"])
        args.tokenizer_type = "GPT2BPETokenizer"
    elif not args.prefix:
        parser.error("give a dataset prefix, or --demo")
    try:
        ds = IndexedDataset(args.prefix)
        tokenizer = build_tokenizer(args) if args.tokenizer_type else None
    except (IndexedDatasetError, ValueError, OSError) as e:
        print(f"inspect_dataset: error: {e}", file=sys.stderr)
        return 1
    documents = ds.document_indices
    doc_tokens = np.add.reduceat(ds.sequence_lengths.astype(np.int64), documents[:-1]) \
        if len(ds) else np.zeros(0, np.int64)
    doc_tokens[np.diff(documents) == 0] = 0      # reduceat reads one element for empty documents
    print(f"dataset      {ds.path_prefix}")
    print(f"dtype        {ds.dtype.name} (code {ds.dtype_code})")
    print(f"sequences    {len(ds)}")
    print(f"documents    {len(documents) - 1}")
    print(f"tokens       {ds.num_tokens}")
    if len(doc_tokens):
        print(f"doc tokens   min {doc_tokens.min()}  mean {doc_tokens.mean():.1f}  "
              f"median {np.median(doc_tokens):.0f}  p99 {np.percentile(doc_tokens, 99):.0f}  "
              f"max {doc_tokens.max()}")
    for d in range(min(args.show_documents, len(documents) - 1)):
        first, end = int(documents[d]), int(documents[d + 1])
        pieces, left = [], args.show_tokens
        for i in range(first, end):     # every sequence (a sentence under --split-sentences), up to the limit
            ids = ds[i][:left].tolist()
            pieces.append(repr(tokenizer.detokenize(ids)) if tokenizer else str(ids))
            left -= len(ids)
            if left <= 0:
                break
        if not pieces:                  # an empty document
            pieces = [repr(tokenizer.detokenize([])) if tokenizer else "[]"]
        count = f" ({end - first} sequences)" if end - first > 1 else ""
        print(f"document {d}{count}: {' | '.join(pieces)}")
    problems = consistency_problems(ds, tokenizer.vocab_size if tokenizer else None)
    for problem in problems:
        print(f"PROBLEM: {problem}")
    print("consistency check: " + ("FAILED" if problems else "ok"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
