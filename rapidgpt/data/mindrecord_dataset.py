"""GPT samples from MindFormers' MindRecord datasets (`--data-path wikitext.train.mindrecord`).

The files are those `mindspore.mindrecord.FileWriter` writes: a data file and its `.db` index,
or with `shard_num=n` the set `NAME0 .. NAME(n-1)` (numbers zero-padded to the width of n-1, each
with its `.db`), all of schema "lm-schema":

    input_ids       int32 [-1]   one block of seq_length + 1 token ids, padded with EOS at the end
    attention_mask  int32 [-1]   1 on real tokens, 0 on the padding (optional)
    labels          int32 [-1]   optional; not read (labels are input_ids shifted by one)

A row is one GPT sample: `tokens = row[:-1]`, `labels = row[1:]`, and the loss is masked where the
label is padding (`attention_mask[1:] == 0`), as MindFormers' GPT2LMHeadModel masks its loss.

Rows are read with MindSpore's own reader (`mindspore.dataset.MindDataset`, unshuffled) into one
numpy array `[rows, seq_length + 1]` when the dataset is built. MindDataset yields ~20k rows/s, so
this takes seconds for the sizes MindFormers datasets have (wikitext-103 at 1024 tokens is ~120k
rows, ~0.5 GB of int32) and every rank holds its own copy; for corpora far larger, convert the file
to Megatron's memory-mapped .bin/.idx with data_tools/convert_mindrecord.py.
"""
import os
import re

import numpy as np

from rapidgpt.data.gpt_dataset import ltor_masks_and_position_ids
from rapidgpt.data.index_cache import description_hash
from rapidgpt.data.indexed_dataset import IndexedDatasetError

MAX_SHARD_DIGITS = 3          # FileWriter allows at most 1000 shards: NAME000 .. NAME999


class MindRecordError(IndexedDatasetError):
    """A MindRecord file that cannot serve as GPT data; the message names the file and the problem
    (a data-file error like those of .bin/.idx files, and reported the same way)."""


def is_mindrecord(path):
    """Whether a --data-path entry names a MindRecord file (`*.mindrecord`, or one shard `*.mindrecordN`)."""
    return re.search(r"\.mindrecord\d*$", str(path)) is not None


def mindrecord_file(path):
    """The file to give MindDataset for `path`: the file itself, or the first shard of a set
    written with shard_num > 1 (MindDataset then finds the other shards on its own)."""
    candidates = [path] + [path + "0" * width for width in range(1, MAX_SHARD_DIGITS + 1)]
    for candidate in candidates:
        if os.path.isfile(candidate):
            if not os.path.isfile(candidate + ".db"):
                raise MindRecordError(f"{candidate}: its index file {candidate}.db is missing "
                                      f"(FileWriter writes it beside every MindRecord file)")
            return candidate
    raise MindRecordError(f"{path}: no such MindRecord file (nor the first shard {path}0 of a "
                          f"sharded set)")


class MindRecordRows:
    """The rows of a MindRecord set in file order, read by MindSpore's MindDataset (unshuffled):
    iterating yields `(input_ids, attention_mask or None)` numpy arrays, one pair per row."""

    def __init__(self, path):
        import mindspore.dataset as mds    # here: MindSpore takes ~2 s to import; .bin/.idx users skip it
        self.file = mindrecord_file(path)
        columns = mds.MindDataset(self.file, shuffle=False).get_col_names()
        if "input_ids" not in columns:
            raise MindRecordError(f"{self.file}: no input_ids column (columns: {', '.join(columns)}); "
                                  f"expected MindFormers' lm-schema")
        self.has_mask = "attention_mask" in columns
        self._dataset = mds.MindDataset(
            self.file, columns_list=["input_ids"] + (["attention_mask"] if self.has_mask else []),
            shuffle=False)
        self.num_rows = self._dataset.get_dataset_size()

    def __iter__(self):
        for row in self._dataset.create_tuple_iterator(output_numpy=True, num_epochs=1):
            yield row[0], (row[1] if self.has_mask else None)


class MindRecordCorpus:
    """Every row of a MindRecord set, checked to be `row_length` tokens long.

    `input_ids` int32 `[rows, row_length]`; `attention_mask` bool `[rows, row_length]` (True on
    real tokens), or None when the file has no such column.
    """

    def __init__(self, path, row_length):
        self.path = path
        rows = MindRecordRows(path)
        self.file = rows.file
        if rows.num_rows == 0:
            raise MindRecordError(f"{self.file}: the MindRecord set has no rows")
        self.input_ids = np.empty((rows.num_rows, row_length), np.int32)
        self.attention_mask = np.empty((rows.num_rows, row_length), bool) if rows.has_mask else None
        for i, (ids, mask) in enumerate(rows):
            for name, array in (("input_ids", ids), ("attention_mask", mask)):
                if array is not None and array.shape != (row_length,):
                    raise MindRecordError(
                        f"{self.file}: row {i} has {array.size} {name} but --seq-length "
                        f"{row_length - 1} needs {row_length} (seq_length + 1) in every row; was "
                        f"the file made for --seq-length {array.size - 1}?")
            self.input_ids[i] = ids
            if mask is not None:
                self.attention_mask[i] = mask != 0
        stat = os.stat(self.file)
        # What identifies the data in the cache keys of blends built on it.
        self.identity = [os.path.abspath(self.file), stat.st_size, stat.st_mtime_ns, rows.num_rows]

    def __len__(self):
        return len(self.input_ids)


class MindRecordGPTDataset:
    """GPT samples from the rows `rows` of a MindRecordCorpus: the same sample dict as GPTDataset.

    Sample order: epochs of the split's rows, each a fresh permutation drawn from
    `numpy.random.RandomState(seed)`, as many epochs as `num_samples` needs (one if None), so
    `len(self) >= num_samples`, whole epochs. `ds[i]`: `tokens`, `labels` int32 `[s]`,
    `loss_mask` float32 `[s]` (0 where the label is padding, and on EOD inputs with
    eod_mask_loss), `position_ids` int32 `[s]`, and `attention_mask` bool `[1, s, s]` only with
    reset_attention_mask.
    """

    def __init__(self, corpus, split, rows, num_samples, config):
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) == 0:
            raise ValueError(f"the {split} split of {corpus.path} has no rows; change --split or "
                             f"give a larger dataset")
        self.corpus, self.split, self.config, self.num_samples = corpus, split, config, num_samples
        epochs = 1 if not num_samples else -(-num_samples // len(rows))
        rng = np.random.RandomState(config.seed)
        self.order = np.concatenate([rows[rng.permutation(len(rows))] for _ in range(epochs)])
        self.cache_key, _ = description_hash({
            "class": "MindRecordGPTDataset", "data": corpus.identity, "split": split,
            "rows": [int(rows[0]), int(rows[-1]) + 1, len(rows)], "num_samples": num_samples,
            "seq_length": config.seq_length, "seed": config.seed})

    def __len__(self):
        return len(self.order)

    def __getitem__(self, idx):
        n = len(self)
        if not -n <= idx < n:
            raise IndexError(f"sample {idx} out of range ({n} samples)")
        row = int(self.order[idx])
        sample = self.corpus.input_ids[row].copy()     # the caller may change it; the corpus must not
        tokens, labels = sample[:-1], sample[1:]
        c = self.config
        loss_mask, position_ids, attention_mask = ltor_masks_and_position_ids(
            tokens, c.eod, c.eod_mask_loss, c.reset_position_ids, c.reset_attention_mask)
        if self.corpus.attention_mask is not None:
            loss_mask *= self.corpus.attention_mask[row, 1:]
        item = {"tokens": tokens, "labels": labels, "loss_mask": loss_mask, "position_ids": position_ids}
        if attention_mask is not None:
            item["attention_mask"] = attention_mask
        return item
