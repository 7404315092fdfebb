#!/usr/bin/env python
"""Concatenate Megatron mmap datasets into one, documents in the order given.

    python data_tools/merge_datasets.py --input shard_00_text_document shard_01_text_document \\
        --output-prefix merged_text_document
    python data_tools/merge_datasets.py --input shards_dir/ --output-prefix merged_text_document

A directory stands for every `.bin/.idx` pair in it, in sorted name order (as Megatron's
merge_datasets.py). All inputs must share a dtype (same tokenizer).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rapidgpt.data.indexed_dataset import (IndexedDataset, IndexedDatasetBuilder,  # noqa: E402
                                           IndexedDatasetError, data_file_path, index_file_path)


def input_prefixes(inputs):
    prefixes = []
    for item in inputs:
        if os.path.isdir(item):
            found = sorted(os.path.join(item, f[:-4]) for f in os.listdir(item) if f.endswith(".idx"))
            if not found:
                raise IndexedDatasetError(f"{item}: directory holds no .idx files")
            prefixes += found
        else:
            prefixes.append(item[:-4] if item.endswith((".bin", ".idx")) else item)
    return prefixes


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", nargs="+", required=True, help="dataset prefixes or directories")
    parser.add_argument("--output-prefix", required=True)
    args = parser.parse_args(argv)
    tmp = f".tmp{os.getpid()}"
    out_bin, out_idx = data_file_path(args.output_prefix), index_file_path(args.output_prefix)
    try:
        prefixes = input_prefixes(args.input)
        builder = IndexedDatasetBuilder(out_bin + tmp, IndexedDataset(prefixes[0]).dtype)
        for prefix in prefixes:
            builder.add_index(prefix)
        builder.finalize(out_idx + tmp)
        os.replace(out_bin + tmp, out_bin)
        os.replace(out_idx + tmp, out_idx)
    except (IndexedDatasetError, OSError) as e:
        print(f"merge_datasets: error: {e}", file=sys.stderr)
        return 1
    finally:
        for path in (out_bin + tmp, out_idx + tmp):
            if os.path.exists(path):
                os.remove(path)
    merged = IndexedDataset(args.output_prefix)
    print(f"merged {len(prefixes)} datasets into {args.output_prefix}: {len(merged)} sequences, "
          f"{len(merged.document_indices) - 1} documents, {merged.num_tokens} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
