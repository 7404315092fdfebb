"""MindFormers MindRecord data: GPT samples from its rows, split and blended, and the .bin/.idx converter."""
import os
import sys

import numpy as np
import pytest
from mindspore.mindrecord import FileWriter

from rapidgpt.data.blended_dataset import BlendedDataset
from rapidgpt.data.dataset_builder import build_train_valid_test_datasets
from rapidgpt.data.gpt_dataset import GPTDatasetConfig, split_boundaries
from rapidgpt.data.indexed_dataset import IndexedDataset
from rapidgpt.data.mindrecord_dataset import MindRecordError, MindRecordGPTDataset, is_mindrecord
from test_gpt_dataset import write_corpus

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data_tools"))
import convert_mindrecord  # noqa: E402

SEQ = 8
EOS = 100
SCHEMA = {"input_ids": {"type": "int32", "shape": [-1]}, "attention_mask": {"type": "int32", "shape": [-1]}}


def mindformers_rows(num_rows, row_length=SEQ + 1, seed=0):
    """Rows as MindFormers writes them: real tokens then EOS padding, attention_mask 0 on the padding.
    Plain np.array rows (FileWriter silently drops rows that are np.memmap slices)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(num_rows):
        real = row_length if i % 3 else int(rng.integers(1, row_length))      # every third row padded
        ids = np.full(row_length, EOS, np.int32)
        ids[:real] = rng.integers(0, EOS, size=real)
        mask = np.zeros(row_length, np.int32)
        mask[:real] = 1
        rows.append({"input_ids": ids, "attention_mask": mask})
    return rows


def write_mindrecord(path, rows, shard_num=1, schema=SCHEMA):
    writer = FileWriter(str(path), shard_num=shard_num, overwrite=True)
    writer.add_schema(schema, "lm-schema")
    writer.write_raw_data(rows)
    writer.commit()
    return str(path)


@pytest.fixture(scope="module")
def mindrecord(tmp_path_factory):
    rows = mindformers_rows(20)
    return write_mindrecord(tmp_path_factory.mktemp("mr") / "wiki.train.mindrecord", rows), rows


def config(tmp_path, **kw):
    return GPTDatasetConfig(seq_length=SEQ, seed=5, data_cache_path=str(tmp_path / "cache"), **kw)


def test_train_samples_are_the_rows_of_the_split(mindrecord, tmp_path):
    path, rows = mindrecord
    train, valid, test = build_train_valid_test_datasets(config(tmp_path), [40, 3, 0], data_path=[path],
                                                         split="8,2,0")
    assert isinstance(train, MindRecordGPTDataset) and test is None
    assert split_boundaries("8,2,0", 20) == [0, 16, 20, 20]
    assert len(train) == 48 and len(valid) == 4                          # whole epochs of 16 and 4 rows
    for epoch in range(3):                                               # each epoch: every row once
        assert sorted(train.order[16 * epoch: 16 * (epoch + 1)].tolist()) == list(range(16))
    assert train.order[:16].tolist() != list(range(16))                 # shuffled with --seed
    assert sorted(valid.order.tolist()) == [16, 17, 18, 19]
    for i in range(len(train)):
        row = rows[int(train.order[i])]
        item = train[i]
        assert item["tokens"].tolist() == row["input_ids"][:-1].tolist()
        assert item["labels"].tolist() == row["input_ids"][1:].tolist()
        assert item["tokens"].dtype == np.int32 and item["position_ids"].tolist() == list(range(SEQ))
        assert "attention_mask" not in item


def test_loss_masked_where_the_label_is_padding(mindrecord, tmp_path):
    path, rows = mindrecord
    train, _, _ = build_train_valid_test_datasets(config(tmp_path), [16, 0, 0], data_path=[path], split="1")
    padded = 0
    for i in range(len(train)):
        mask = rows[int(train.order[i])]["attention_mask"]
        np.testing.assert_array_equal(train[i]["loss_mask"], mask[1:].astype(np.float32))
        padded += int(mask.min() == 0)
    assert padded == 7                                                   # rows 0, 3, ..., 18


def test_eod_mask_loss_combines_with_the_padding_mask(mindrecord, tmp_path):
    path, rows = mindrecord
    train, _, _ = build_train_valid_test_datasets(config(tmp_path, eod=EOS, eod_mask_loss=True), [20, 0, 0],
                                                  data_path=[path], split="1")
    row = rows[int(train.order[0])]
    expected = row["attention_mask"][1:] * (row["input_ids"][:-1] != EOS)
    np.testing.assert_array_equal(train[0]["loss_mask"], expected.astype(np.float32))


def test_rows_of_another_length_are_refused(tmp_path):
    path = write_mindrecord(tmp_path / "long.mindrecord", mindformers_rows(3, row_length=17))
    with pytest.raises(MindRecordError, match=r"long\.mindrecord: row 0 has 17 input_ids but --seq-length 8 "
                                              r"needs 9 \(seq_length \+ 1\) in every row; was the file made "
                                              r"for --seq-length 16\?"):
        build_train_valid_test_datasets(config(tmp_path), [4, 0, 0], data_path=[path], split="1")


def test_sharded_set_read_whole_from_its_name(tmp_path):
    rows = mindformers_rows(12, seed=1)
    path = write_mindrecord(tmp_path / "sharded.mindrecord", rows, shard_num=2)
    assert sorted(os.listdir(tmp_path)) == ["sharded.mindrecord0", "sharded.mindrecord0.db",
                                            "sharded.mindrecord1", "sharded.mindrecord1.db"]
    for name in (path, path + "1"):
        train, _, _ = build_train_valid_test_datasets(config(tmp_path), [None, 0, 0], data_path=[name], split="1")
        assert sorted(tuple(train.corpus.input_ids[r].tolist()) for r in range(12)) == \
            sorted(tuple(r["input_ids"].tolist()) for r in rows)


def test_labels_column_ignored_and_no_mask_means_no_padding(tmp_path):
    """`labels` is not read (labels are input_ids shifted); without attention_mask nothing is masked."""
    rows = [{"input_ids": r["input_ids"], "labels": np.full(SEQ + 1, -100, np.int32)} for r in mindformers_rows(4)]
    schema = {"input_ids": SCHEMA["input_ids"], "labels": {"type": "int32", "shape": [-1]}}
    path = write_mindrecord(tmp_path / "nomask.mindrecord", rows, schema=schema)
    train, _, _ = build_train_valid_test_datasets(config(tmp_path), [4, 0, 0], data_path=[path], split="1")
    item = train[0]
    assert item["labels"].tolist() == rows[int(train.order[0])]["input_ids"][1:].tolist()
    assert item["loss_mask"].tolist() == [1.0] * SEQ


def test_missing_files_named(tmp_path, mindrecord):
    with pytest.raises(MindRecordError, match=r"nothing\.mindrecord: no such MindRecord file \(nor the first "
                                              r"shard .*nothing\.mindrecord0 of a sharded set\)"):
        build_train_valid_test_datasets(config(tmp_path), [4, 0, 0], data_path=[str(tmp_path / "nothing.mindrecord")])
    lone = tmp_path / "lone.mindrecord"
    lone.write_bytes(open(mindrecord[0], "rb").read())
    with pytest.raises(MindRecordError, match=r"lone\.mindrecord: its index file .*lone\.mindrecord\.db is missing"):
        build_train_valid_test_datasets(config(tmp_path), [4, 0, 0], data_path=[str(lone)])


def test_is_mindrecord():
    assert is_mindrecord("a/wiki.train.mindrecord") and is_mindrecord("x.mindrecord07")
    assert not is_mindrecord("corpus_text_document") and not is_mindrecord("x.mindrecord.db")


def test_blend_with_a_megatron_corpus(mindrecord, tmp_path):
    path, rows = mindrecord
    corpus = str(tmp_path / "mega")
    write_corpus(corpus, [np.arange(200, 230) for _ in range(20)])
    data_path = ["0.5", path, "0.5", corpus]
    train, _, _ = build_train_valid_test_datasets(config(tmp_path), [20, 0, 0], data_path=data_path, split="1")
    assert isinstance(train, BlendedDataset) and len(train) == 20
    assert isinstance(train.datasets[0], MindRecordGPTDataset) and train.datasets[0].num_samples == 11
    from_mindrecord = sum(int(train[i]["tokens"][0]) < 200 for i in range(20))
    assert from_mindrecord == 10
    again, _, _ = build_train_valid_test_datasets(config(tmp_path), [20, 0, 0], data_path=data_path, split="1")
    assert not again.built_cache and again.cache_key == train.cache_key


def test_converter_round_trip(mindrecord, tmp_path, capsys):
    path, rows = mindrecord
    prefix = str(tmp_path / "wiki_text_document")
    assert convert_mindrecord.main(["--input", path, "--output-prefix", prefix]) == 0
    assert "20 documents" in capsys.readouterr().out
    converted = IndexedDataset(prefix)
    assert converted.dtype == np.uint16 and len(converted.document_indices) == 21     # one document a row
    for i, row in enumerate(rows):
        real = row["input_ids"][row["attention_mask"] == 1]
        assert converted[i].tolist() == real.tolist()


def test_converter_errors_name_the_file(tmp_path, capsys):
    assert convert_mindrecord.main(["--input", str(tmp_path / "no.mindrecord"),
                                    "--output-prefix", str(tmp_path / "out")]) == 1
    assert "convert_mindrecord: error: " in capsys.readouterr().err
    assert not os.listdir(tmp_path)
