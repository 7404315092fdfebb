"""MMIDIDX reader/writer against the fixtures written by Megatron-LM's own IndexedDatasetBuilder."""
import hashlib
import json
import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from rapidgpt.data.indexed_dataset import (IndexedDataset, IndexedDatasetBuilder, IndexedDatasetError,
                                           consistency_problems)

FIXTURES = Path(__file__).resolve().parents[1].parent / "shared" / "testdata" / "megatron_mmap"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())["datasets"]


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_reads_megatron_fixture_exactly(name):
    expected = EXPECTED[name]
    ds = IndexedDataset(str(FIXTURES / name))
    assert ds.dtype.name == expected["dtype"] and ds.dtype_code == expected["dtype_code"]
    assert len(ds) == expected["sequence_count"]
    assert len(ds.document_indices) == expected["document_count_field"]
    assert ds.sequence_lengths.tolist() == expected["sequence_lengths"]
    assert ds.sequence_pointers.tolist() == expected["sequence_pointers"]
    assert ds.document_indices.tolist() == expected["document_indices"]
    assert [ds[i].tolist() for i in range(len(ds))] == expected["sequences"]
    assert [s.tolist() for s in ds[0:len(ds)]] == expected["sequences"]
    docs = ds.document_indices
    assert [np.concatenate(ds[int(a):int(b)]).tolist() for a, b in zip(docs[:-1], docs[1:])] \
        == expected["documents"]
    for example in expected["get_examples"]:
        assert ds.get(example["idx"], example["offset"], example["length"]).tolist() == example["tokens"]
    assert consistency_problems(ds, vocab_size=100001) == []


def _rewrite(name, out_prefix, merge_parts=False):
    """Write fixture `name`'s content with our builder, the way its README says Megatron did."""
    src = IndexedDataset(str(FIXTURES / name))
    builder = IndexedDatasetBuilder(out_prefix + ".bin", src.dtype)
    docs = src.document_indices
    for a, b in zip(docs[:-1], docs[1:]):
        if name.startswith("int32"):
            builder.add_document(np.concatenate(src[int(a):int(b)]).tolist(),
                                 src.sequence_lengths[a:b].tolist())
        else:
            for i in range(a, b):
                builder.add_item(src[int(i)])
            builder.end_document()
    builder.finalize(out_prefix + ".idx")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_builder_bytes_equal_megatron(name, tmp_path):
    out = str(tmp_path / name)
    _rewrite(name, out)
    assert sha256(out + ".bin") == EXPECTED[name]["bin_sha256"]
    assert sha256(out + ".idx") == EXPECTED[name]["idx_sha256"]
    assert os.path.getsize(out + ".idx") == EXPECTED[name]["idx_bytes"]


def test_add_index_merges_documents_in_order(tmp_path):
    name = "int32_multi_sentence"
    halves = []
    src = IndexedDataset(str(FIXTURES / name))
    for part, (lo, hi) in enumerate([(0, 2), (2, 5)]):
        prefix = str(tmp_path / f"part{part}")
        b = IndexedDatasetBuilder(prefix + ".bin", np.int32)
        for d in range(lo, hi):
            a, z = src.document_indices[d], src.document_indices[d + 1]
            b.add_document(np.concatenate(src[int(a):int(z)]), src.sequence_lengths[a:z].tolist())
        b.finalize(prefix + ".idx")
        halves.append(prefix)
    merged = str(tmp_path / "merged")
    b = IndexedDatasetBuilder(merged + ".bin", np.int32)
    for prefix in halves:
        b.add_index(prefix)
    b.finalize(merged + ".idx")
    assert sha256(merged + ".bin") == EXPECTED[name]["bin_sha256"]
    assert sha256(merged + ".idx") == EXPECTED[name]["idx_sha256"]


def test_add_index_rejects_other_dtype(tmp_path):
    b = IndexedDatasetBuilder(str(tmp_path / "x.bin"), np.int32)
    with pytest.raises(IndexedDatasetError, match="dtype uint16 differs from the int32"):
        b.add_index(str(FIXTURES / "uint16_text_document"))


def test_accepts_prefix_with_suffix():
    ds = IndexedDataset(str(FIXTURES / "uint16_text_document.bin"))
    assert len(ds) == 7


def test_get_out_of_range_names_sequence():
    ds = IndexedDataset(str(FIXTURES / "uint16_text_document"))
    with pytest.raises(IndexError, match="sequence 7 out of range"):
        ds.get(7)
    with pytest.raises(IndexError, match=r"tokens \[0, 2\) out of range for sequence 0"):
        ds.get(0, 0, 2)


# ---- bad files: one clear message naming the file and the problem -------------------------------

@pytest.fixture
def copy_fixture(tmp_path):
    def make(name="uint16_text_document"):
        for ext in (".bin", ".idx"):
            shutil.copy(FIXTURES / (name + ext), tmp_path / (name + ext))
        prefix = str(tmp_path / name)
        for ext in (".bin", ".idx"):
            os.chmod(prefix + ext, 0o644)
        return prefix
    return make


def _patch(path, offset, data):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_missing_bin(copy_fixture):
    prefix = copy_fixture()
    os.remove(prefix + ".bin")
    with pytest.raises(IndexedDatasetError, match=r"uint16_text_document\.bin: data file not found"):
        IndexedDataset(prefix)


def test_missing_idx(copy_fixture):
    prefix = copy_fixture()
    os.remove(prefix + ".idx")
    with pytest.raises(IndexedDatasetError, match=r"uint16_text_document\.idx: index file not found"):
        IndexedDataset(prefix)


def test_wrong_magic(copy_fixture):
    prefix = copy_fixture()
    _patch(prefix + ".idx", 0, b"TNTIDX\x00\x00\x00")
    with pytest.raises(IndexedDatasetError, match=r"\.idx: not a Megatron mmap index \(magic"):
        IndexedDataset(prefix)


def test_unknown_version(copy_fixture):
    prefix = copy_fixture()
    _patch(prefix + ".idx", 9, struct.pack("<Q", 2))
    with pytest.raises(IndexedDatasetError, match=r"\.idx: unknown MMIDIDX version 2"):
        IndexedDataset(prefix)


def test_unknown_dtype_code(copy_fixture):
    prefix = copy_fixture()
    _patch(prefix + ".idx", 17, bytes([9]))
    with pytest.raises(IndexedDatasetError, match=r"\.idx: unknown dtype code 9; valid codes are 1=uint8"):
        IndexedDataset(prefix)


@pytest.mark.parametrize("keep", [10, 100, 181])
def test_truncated_index(copy_fixture, keep):
    prefix = copy_fixture()
    os.truncate(prefix + ".idx", keep)
    with pytest.raises(IndexedDatasetError, match=r"\.idx: truncated index"):
        IndexedDataset(prefix)


@pytest.mark.parametrize("delta", [-2, 2])
def test_bin_size_mismatch(copy_fixture, delta):
    prefix = copy_fixture()
    os.truncate(prefix + ".bin", os.path.getsize(prefix + ".bin") + delta)
    with pytest.raises(IndexedDatasetError,
                       match=r"\.bin: size \d+ bytes does not match its index .*1534 bytes of uint16"):
        IndexedDataset(prefix)


def test_consistency_check_finds_bad_pointer_and_token(copy_fixture):
    prefix = copy_fixture()
    _patch(prefix + ".idx", 34 + 4 * 7 + 8 * 2, struct.pack("<q", 604))   # pointer of sequence 2
    problems = consistency_problems(IndexedDataset(prefix), vocab_size=60000)
    assert any("sequence pointers do not follow" in p and "sequence 2" in p for p in problems)
    assert any("token ids outside the vocabulary [0, 60000)" in p for p in problems)


def test_offsets_beyond_two_gib(tmp_path):
    """Pointers and reads past 2^31 and 2^32 bytes (a sparse 6 GiB .bin, no real disk use)."""
    prefix = str(tmp_path / "big")
    lengths = np.array([2**30, 2**30, 2**30], np.int32)                     # uint16: 2 GiB each
    pointers = np.array([0, 2**31, 2**32], np.int64)
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, 3, 2))
        f.write(lengths.tobytes() + pointers.tobytes() + np.array([0, 3], np.int64).tobytes())
    with open(prefix + ".bin", "wb") as f:
        f.truncate(3 * 2**31)
        f.seek(2**32 + 2 * (2**30 - 2))
        f.write(np.array([7, 65535], np.uint16).tobytes())
    ds = IndexedDataset(prefix)
    assert ds.num_tokens == 3 * 2**30
    assert ds.get(2, 2**30 - 2).tolist() == [7, 65535]
    assert consistency_problems(ds) == []
