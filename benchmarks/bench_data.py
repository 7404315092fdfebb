#!/usr/bin/env python
"""Data pipeline throughput, each figure beside its baseline measured in the same run.

1. Preprocessing (data_tools/preprocess_data.py's code path): tokens/s and MB/s with 1 and 2
   workers on a synthetic jsonl made of shuffled paragraphs of the demo corpus.
2. GPTDataset: samples/s of `ds[i]` (shuffled sample index -> document pieces -> tokens, labels,
   loss mask, position ids) against the floor it is built on: a raw `numpy.memmap` loop that
   slices `seq_length + 1` tokens at random offsets of the same `.bin`.

    python benchmarks/bench_data.py [--mb 8] [--seq-length 1024] [--samples 20000]
"""
import argparse
import json
import os
import sys
import tempfile
import time
from argparse import Namespace

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rapidgpt.data.demo_corpus import demo_corpus, demo_documents  # noqa: E402
from rapidgpt.data.gpt_dataset import GPTDataset, GPTDatasetConfig  # noqa: E402
from rapidgpt.data.indexed_dataset import IndexedDataset  # noqa: E402
from rapidgpt.data.preprocess import preprocess  # noqa: E402


def make_jsonl(path, megabytes, seed=0, new_word_share=0.1):
    """Documents of 1-20 random demo paragraphs until the file holds `megabytes` MB.

    The demo corpus has only ~10k distinct words, so every word would hit the tokenizer's word
    cache; real corpora keep meeting new words. `new_word_share` of the words get a random
    suffix, which keeps the BPE merge loop busy about as much as web text does.
    """
    rng = np.random.default_rng(seed)
    paragraphs = [p for doc in demo_documents() for p in doc.split("\n\n") if p.strip()]
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    target, written = megabytes * 1024 ** 2, 0
    with open(path, "w", encoding="utf-8") as f:
        while written < target:
            picks = rng.integers(0, len(paragraphs), size=int(rng.integers(1, 21)))
            words = "\n\n".join(paragraphs[i] for i in picks).split(" ")
            for w in np.flatnonzero(rng.random(len(words)) < new_word_share):
                words[w] += "".join(rng.choice(letters, size=int(rng.integers(2, 6))))
            line = json.dumps({"text": " ".join(words)}) + "\n"
            f.write(line)
            written += len(line.encode("utf-8"))
    return written


def bench_preprocess(workdir, corpus, megabytes):
    src = os.path.join(workdir, "bench.jsonl")
    size = make_jsonl(src, megabytes)
    results = {}
    for workers in (1, 2):
        prefix = os.path.join(workdir, f"w{workers}")
        start = time.perf_counter()
        preprocess(Namespace(input=src, input_format="jsonl", json_keys=["text"], output_prefix=prefix,
                             tokenizer_type="GPT2BPETokenizer", vocab_file=corpus["vocab_file"],
                             merge_file=corpus["merge_file"], append_eod=True, workers=workers,
                             log_interval=10 ** 9, no_progress_bar=True))
        elapsed = time.perf_counter() - start
        tokens = IndexedDataset(prefix + "_text_document").num_tokens
        results[workers] = (tokens / elapsed, size / elapsed / 1024 ** 2)
        print(f"preprocess  workers={workers}: {tokens / elapsed:12,.0f} tokens/s  "
              f"{size / elapsed / 1024 ** 2:6.2f} MB/s  ({size / 1024 ** 2:.1f} MB, {tokens:,} tokens, "
              f"{elapsed:.1f} s)")
    print(f"preprocess  2 workers / 1 worker: {results[2][0] / results[1][0]:.2f}x")
    return os.path.join(workdir, "w1_text_document")


def bench_samples(prefix, seq_length, num_samples, workdir):
    indexed = IndexedDataset(prefix)
    config = GPTDatasetConfig(seq_length=seq_length, seed=1234, data_cache_path=os.path.join(workdir, "cache"))
    start = time.perf_counter()
    dataset = GPTDataset(indexed, "train", np.arange(len(indexed)), num_samples, config)
    print(f"GPTDataset index build ({num_samples:,} samples): {time.perf_counter() - start:.2f} s")
    order = np.random.default_rng(0).permutation(len(dataset))[:num_samples]

    tokens = np.memmap(prefix + ".bin", dtype=indexed.dtype, mode="r")
    offsets = np.random.default_rng(0).integers(0, len(tokens) - seq_length - 1, size=num_samples)
    start = time.perf_counter()
    for off in offsets:
        window = tokens[off: off + seq_length + 1].astype(np.int64)
        _ = window[:-1], window[1:]
    raw = num_samples / (time.perf_counter() - start)

    start = time.perf_counter()
    for i in order:
        _ = dataset[int(i)]
    ours = num_samples / (time.perf_counter() - start)
    print(f"raw numpy.memmap slicing loop: {raw:12,.0f} samples/s  (seq_length {seq_length})")
    print(f"GPTDataset[i]:                 {ours:12,.0f} samples/s  "
          f"= {ours * seq_length:,.0f} tokens/s")
    print(f"GPTDataset / raw memmap: {ours / raw:.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=8.0, help="size of the synthetic jsonl")
    parser.add_argument("--seq-length", type=int, default=1024)
    parser.add_argument("--samples", type=int, default=20000)
    args = parser.parse_args()
    corpus = demo_corpus()
    with tempfile.TemporaryDirectory() as workdir:
        prefix = bench_preprocess(workdir, corpus, args.mb)
        bench_samples(prefix, args.seq_length, args.samples, workdir)


if __name__ == "__main__":
    main()
