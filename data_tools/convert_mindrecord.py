#!/usr/bin/env python
"""Convert a MindFormers MindRecord dataset to a Megatron .bin/.idx dataset, one document per row.

    python data_tools/convert_mindrecord.py --input wikitext.train.mindrecord \\
        --output-prefix wikitext_train_text_document

The input is what `mindspore.mindrecord.FileWriter` writes with MindFormers' "lm-schema"
(`input_ids`, `attention_mask`, see rapidgpt/data/mindrecord_dataset.py); a sharded set
(`NAME.mindrecord0`, `NAME.mindrecord1`, ...) is read whole from `NAME.mindrecord` or any shard.
Each row becomes one document of its real tokens: the padding (attention_mask 0) is dropped, and
a file without attention_mask keeps rows whole. Tokens are stored as uint16 when the ids fit a
vocabulary under 65500 (Megatron's rule, which gives GPT-2's uint16), else int32. The rows are held in memory
while converting (MindRecord sets from MindFormers are small enough).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rapidgpt.data.indexed_dataset import (IndexedDataset, IndexedDatasetBuilder,  # noqa: E402
                                           best_fitting_dtype, data_file_path, index_file_path)
from rapidgpt.data.mindrecord_dataset import MindRecordError, MindRecordRows  # noqa: E402


def unpadded_rows(path):
    """Every row's real tokens, in file order."""
    return [ids if mask is None else ids[mask != 0] for ids, mask in MindRecordRows(path)]


def write_dataset(documents, output_prefix):
    """Write `documents` (token arrays) as `output_prefix.bin/.idx`, replacing them only once done."""
    largest = max((int(d.max()) for d in documents if d.size), default=0)
    tmp = f".tmp{os.getpid()}"
    out_bin, out_idx = data_file_path(output_prefix), index_file_path(output_prefix)
    try:
        builder = IndexedDatasetBuilder(out_bin + tmp, best_fitting_dtype(largest + 1))
        for document in documents:
            builder.add_item(document)
            builder.end_document()
        builder.finalize(out_idx + tmp)
        os.replace(out_bin + tmp, out_bin)
        os.replace(out_idx + tmp, out_idx)
    finally:
        for path in (out_bin + tmp, out_idx + tmp):
            if os.path.exists(path):
                os.remove(path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True, help="a .mindrecord file (or one shard of a set)")
    parser.add_argument("--output-prefix", required=True, help="writes PREFIX.bin and PREFIX.idx")
    args = parser.parse_args(argv)
    try:
        documents = unpadded_rows(args.input)
        write_dataset(documents, args.output_prefix)
    except (MindRecordError, OSError) as e:
        print(f"convert_mindrecord: error: {e}", file=sys.stderr)
        return 1
    written = IndexedDataset(args.output_prefix)
    print(f"converted {args.input} into {args.output_prefix}: {len(written)} documents, "
          f"{written.num_tokens} tokens ({written.dtype.name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
