"""Labelled text for sequence classification: .jsonl/.tsv files -> padded token samples.

Files (the format follows the extension):
  .jsonl  one JSON object per line, {"text": ..., "label": ...} or
          {"text_a": ..., "text_b": ..., "label": ...} (a text pair, e.g. premise and hypothesis)
  .tsv    a header row naming the columns (`text`, or `text_a` and `text_b`; and `label`; other
          columns are ignored), then one example per row, tab-separated, no quoting
Blank lines are skipped. A bad row stops the run with `file:line: what is wrong`.

Labels are strings or integers (`1` and `"1"` are the same label). The label map (class id =
index in `args.labels`) is the sorted set of training labels, in numeric order when every label
is an integer: the same files always give the same map. It is recorded in each checkpoint's model
config, so a resumed or evaluated run uses the map it was trained with; a validation or test label
outside the map is an error.

Encoding, for a GPT that classifies from its last token (causal attention: the last token is the
only one that has seen the whole input):

    text:       tokens(text)                          EOD
    text pair:  tokens(text_a)  EOD  tokens(text_b)  EOD

then right-padded with EOD to --seq-length. Too long inputs are cut at the end of the text (for a
pair, of the longer text first) so that the final EOD always stays.

A sample `ds[i]` is a dict of numpy arrays:
    tokens        [seq_length] int32   the encoded input, right-padded
    position_ids  [seq_length] int32   0 .. seq_length-1
    last_index    []           int32   position of the final EOD (the token a classifier reads)
    label         []           int32   class id

For BERT (BertClassificationDataset), as Hugging Face's BERT tokenizer encodes for
BertForSequenceClassification:

    text:       [CLS]  tokens(text)  [SEP]                          token types 0 ... 0
    text pair:  [CLS]  tokens(text_a)  [SEP]  tokens(text_b)  [SEP]  token types 0 ... 0  1 ... 1

right-padded with [PAD] (type 0), cut as above (the longer text first, from its end); samples hold
`tokens`, `types`, `padding_mask` (1 = token) `[seq_length]` int32 and `label`.
"""
import json
import os
import re
from typing import NamedTuple, Optional

import numpy as np

from rapidgpt.errors import UserError

FORMATS = (".jsonl", ".tsv")
_INTEGER = re.compile(r"-?\d+")


class ClassificationDataError(UserError, ValueError):
    """A classification data file that cannot be used; the message names the file (and line)."""


class Example(NamedTuple):
    text_a: str
    text_b: Optional[str]
    label: str
    where: str                # "file:line", for error messages


def _texts_and_label(fields, where):
    """(text_a, text_b or None, label) from one row's fields (a dict)."""
    if "text" in fields:
        text_a, text_b = fields["text"], None
    elif "text_a" in fields and "text_b" in fields:
        text_a, text_b = fields["text_a"], fields["text_b"]
    else:
        raise ClassificationDataError(f"{where}: no 'text' (or 'text_a' and 'text_b') field")
    for text in (text_a, text_b):
        if text is not None and not isinstance(text, str):
            raise ClassificationDataError(f"{where}: the text must be a string, got {text!r}")
    if "label" not in fields:
        raise ClassificationDataError(f"{where}: no 'label' field")
    label = fields["label"]
    if isinstance(label, bool) or not isinstance(label, (str, int)):
        raise ClassificationDataError(f"{where}: the label must be a string or an integer, got {label!r}")
    label = str(label).strip()
    if not label:
        raise ClassificationDataError(f"{where}: empty label")
    return text_a, text_b, label


def _lines(path):
    """(line number, decoded line without its newline) of the non-blank lines of `path`."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                raise ClassificationDataError(f"{path}:{number}: not UTF-8 ({e})") from None
            if line.strip():
                yield number, line


def _jsonl_rows(path):
    for number, line in _lines(path):
        try:
            row = json.loads(line)
        except ValueError as e:
            raise ClassificationDataError(f"{path}:{number}: not valid JSON ({e})") from None
        if not isinstance(row, dict):
            raise ClassificationDataError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")
        yield number, row


def _tsv_rows(path):
    lines = _lines(path)
    header_line, header = next(lines, (None, None))
    if header is None:
        return
    columns = [name.strip() for name in header.split("\t")]
    if "label" not in columns or not ("text" in columns or {"text_a", "text_b"} <= set(columns)):
        raise ClassificationDataError(
            f"{path}:{header_line}: the header must name a 'label' column and a 'text' column (or "
            f"'text_a' and 'text_b'); it has {columns}")
    for number, line in lines:
        values = line.split("\t")
        if len(values) != len(columns):
            raise ClassificationDataError(f"{path}:{number}: {len(values)} tab-separated fields, the "
                                          f"header has {len(columns)}")
        yield number, dict(zip(columns, values))


def read_examples(path, flag="--data-path"):
    """The examples of one .jsonl or .tsv file (`flag` names it in errors)."""
    extension = os.path.splitext(path)[1].lower()
    if extension not in FORMATS:
        raise ClassificationDataError(f"{flag} {path}: unknown format '{extension}'; give a .jsonl "
                                      f"or .tsv file")
    if not os.path.isfile(path):
        raise ClassificationDataError(f"{flag} {path}: no such file")
    rows = _jsonl_rows(path) if extension == ".jsonl" else _tsv_rows(path)
    examples = [Example(*_texts_and_label(row, f"{path}:{number}"), f"{path}:{number}")
                for number, row in rows]
    if not examples:
        raise ClassificationDataError(f"{flag} {path}: no examples in the file")
    return examples


def label_names(labels):
    """The stable label map: distinct labels sorted, numerically when all are integers."""
    distinct = set(labels)
    if all(_INTEGER.fullmatch(label) for label in distinct):
        return sorted(distinct, key=lambda label: (int(label), label))
    return sorted(distinct)


def _truncate_pair(text_a, text_b, budget):
    """Cut two token lists to at most `budget` tokens together, one token at a time from the end of
    the longer one (of text_b when they are equal), as Hugging Face's `longest_first` truncation."""
    text_a, text_b = list(text_a), list(text_b)
    while len(text_a) + len(text_b) > budget:
        (text_a if len(text_a) > len(text_b) else text_b).pop()
    return text_a, text_b


def encode(example, tokenizer, seq_length):
    """(token ids, whether the input was cut) of one example, laid out as the module docstring says."""
    eod = tokenizer.eod
    text_a = tokenizer.tokenize(example.text_a)
    if example.text_b is None:
        return text_a[:seq_length - 1] + [eod], len(text_a) > seq_length - 1
    text_b = tokenizer.tokenize(example.text_b)
    kept_a, kept_b = _truncate_pair(text_a, text_b, seq_length - 2)
    return kept_a + [eod] + kept_b + [eod], len(kept_a) + len(kept_b) < len(text_a) + len(text_b)


def encode_bert(example, tokenizer, seq_length):
    """(token ids, token types, whether the input was cut): BERT's layout (module docstring)."""
    cls, sep = tokenizer.cls, tokenizer.sep
    text_a = tokenizer.tokenize(example.text_a)
    if example.text_b is None:
        kept = text_a[:seq_length - 2]
        return [cls] + kept + [sep], [0] * (len(kept) + 2), len(kept) < len(text_a)
    text_b = tokenizer.tokenize(example.text_b)
    kept_a, kept_b = _truncate_pair(text_a, text_b, seq_length - 3)
    ids = [cls] + kept_a + [sep] + kept_b + [sep]
    return ids, [0] * (len(kept_a) + 2) + [1] * (len(kept_b) + 1), len(kept_a) + len(kept_b) < len(text_a) + len(text_b)


class ClassificationDataset:
    """Encoded examples (see the module docstring for the layout); `truncated` counts cut inputs.

    `labels` is the label map; `labels_from` says where it comes from, for the error raised when
    an example's label is not in it.
    """

    def __init__(self, examples, labels, tokenizer, seq_length, labels_from="the training data"):
        if seq_length < 3:
            raise ClassificationDataError(f"--seq-length {seq_length} is too short to classify text "
                                          f"(a text pair needs two EOD tokens and a token of each)")
        self.seq_length, self.tokenizer = seq_length, tokenizer
        class_ids = {label: i for i, label in enumerate(labels)}
        self.inputs, self.labels, self.truncated = [], [], 0
        for example in examples:
            if example.label not in class_ids:
                raise ClassificationDataError(f"{example.where}: label {example.label!r} does not occur "
                                              f"in {labels_from} ({', '.join(labels)})")
            *encoded, cut = self.encode(example)
            self.truncated += cut
            self.inputs.append(tuple(np.array(part, np.int32) for part in encoded))
            self.labels.append(class_ids[example.label])
        self.position_ids = np.arange(seq_length, dtype=np.int32)

    def encode(self, example):
        return encode(example, self.tokenizer, self.seq_length)

    def __len__(self):
        return len(self.inputs)

    def padded(self, ids, fill):
        row = np.full(self.seq_length, fill, np.int32)
        row[:len(ids)] = ids
        return row

    def __getitem__(self, i):
        ids, = self.inputs[i]
        return {"tokens": self.padded(ids, self.tokenizer.eod), "position_ids": self.position_ids,
                "last_index": np.int32(len(ids) - 1), "label": np.int32(self.labels[i])}


class BertClassificationDataset(ClassificationDataset):
    """Examples encoded in BERT's layout (module docstring)."""

    def encode(self, example):
        return encode_bert(example, self.tokenizer, self.seq_length)

    def __getitem__(self, i):
        ids, types = self.inputs[i]
        return {"tokens": self.padded(ids, self.tokenizer.pad), "types": self.padded(types, 0),
                "padding_mask": self.padded(np.ones(len(ids), np.int32), 0), "label": np.int32(self.labels[i])}


def _read_files(paths, flag):
    """The examples of the files `paths` (given as `flag`), one after the other; None without files."""
    return [example for path in paths for example in read_examples(path, flag)] if paths else None


def classification_datasets(args, tokenizer, logger=None):
    """(train, valid, test) ClassificationDatasets from the flags; None for those not given.

    Train: --data-path (or --train-data-path) FILE..., valid: --valid-data-path, test:
    --test-data-path (several files are concatenated). The label map is `args.labels` when the
    run starts from a checkpoint that records one, otherwise the training labels' map, which is
    stored in `args.labels` (checkpoints record it); `args.num_classes` is checked against it, or
    set from it. Without training data (evaluating a checkpoint: --skip-train --load) the
    checkpoint's map is the only one there is.
    """
    train_flag = "--train-data-path" if args.train_data_path else "--data-path"
    train_examples = _read_files(args.train_data_path or args.data_path, train_flag)
    labels_from = "the training data"
    if args.labels:
        labels_from = "the label map of the checkpoint this run starts from"
    elif train_examples is None:
        raise ClassificationDataError("no label map: give the training data (--data-path TRAIN.jsonl|.tsv), "
                                      "or --load a classifier's checkpoint, which records its labels")
    else:
        args.labels = label_names(example.label for example in train_examples)
    if args.num_classes is not None and args.num_classes != len(args.labels):
        raise ClassificationDataError(
            f"--num-classes {args.num_classes}, but {labels_from} has {len(args.labels)} labels "
            f"({', '.join(args.labels)}); drop --num-classes to use the data's")
    args.num_classes = len(args.labels)

    # (a namespace made by hand, without the model flags, is the GPT's layout)
    layout = BertClassificationDataset if getattr(args, "model_type", None) == "bert" else ClassificationDataset

    def dataset(examples):
        if examples is None:
            return None
        return layout(examples, args.labels, tokenizer, args.seq_length, labels_from)

    train = dataset(train_examples)
    valid = dataset(_read_files(args.valid_data_path, "--valid-data-path"))
    test = dataset(_read_files(args.test_data_path, "--test-data-path"))
    if logger is not None:
        sizes = ", ".join(f"{name} {len(ds)}" for name, ds in (("train", train), ("valid", valid), ("test", test))
                          if ds is not None)
        truncated = sum(ds.truncated for ds in (train, valid, test) if ds is not None)
        logger.info(f"> classification data: {sizes} examples; labels "
                    + ", ".join(f"{i}={label}" for i, label in enumerate(args.labels))
                    + f"; {truncated} inputs truncated to --seq-length {args.seq_length}")
    return train, valid, test


def write_predictions(path, predictions, labels):
    """Write `predictions` (rapidgpt.training.metrics.Predictions, in dataset order) to `path`, one
    JSON line per example of the evaluated files, in their order:

        {"index": 0, "prediction": "positive", "label": "negative",
         "probabilities": {"negative": 0.312, "positive": 0.688}}

    `index` counts the examples from 0 (over the files, one after the other, blank lines
    skipped); `prediction` is the likeliest label, `label` the file's; `probabilities` is the
    softmax of the logits (6 decimals) by label, in the label map's order (`labels`). Written to
    a temporary file, then renamed: a reader never sees a partial file.
    """
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for index, (predicted, label, probabilities) in enumerate(
                zip(predictions.classes, predictions.labels, predictions.probabilities)):
            f.write(json.dumps({"index": index, "prediction": labels[predicted], "label": labels[label],
                                "probabilities": {name: round(float(p), 6) for name, p in zip(labels, probabilities)}},
                               ensure_ascii=False) + "\n")
    os.replace(tmp, path)
