"""Megatron's MMIDIDX v1 indexed dataset (`.bin` + `.idx`), read and written byte for byte.

A dataset is a list of *sequences* (token-id arrays) grouped into *documents*.
`.bin` holds every sequence's tokens back to back with no header; `.idx` describes them
(little-endian, no padding):

    offset      size  content
    0           9     magic b"MMIDIDX\\x00\\x00"
    9           8     uint64 version = 1
    17          1     uint8 dtype code (see DTYPE_CODES)
    18          8     uint64 N = number of sequences
    26          8     uint64 D = length of the document index (= documents + 1)
    34          4N    int32 sequence lengths (tokens)
    34+4N       8N    int64 byte offset of each sequence in .bin
    34+12N      8D    int64 document index: sequence number where each document starts, then N

Files written by Megatron-LM or MindFormers load unchanged and ours load in them. Reading goes
through `numpy.memmap`, so a corpus far larger than RAM costs only the pages a sample touches.
"""
import array
import os
import shutil
import struct

import numpy as np

from rapidgpt.errors import UserError

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER = struct.Struct("<9sQBQQ")     # magic, version, dtype code, N, D
DTYPE_CODES = {
    1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32,
    5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16,
}
CODE_OF_DTYPE = {np.dtype(t): code for code, t in DTYPE_CODES.items()}


class IndexedDatasetError(UserError, ValueError):
    """A `.bin`/`.idx` pair that cannot be read; the message names the file and the problem."""


def data_file_path(prefix):
    return prefix + ".bin"


def index_file_path(prefix):
    return prefix + ".idx"


def best_fitting_dtype(vocab_size):
    """Token dtype Megatron picks for a vocabulary: uint16 below 65500 ids, else int32."""
    return np.uint16 if vocab_size is not None and vocab_size < 65500 else np.int32


def _strip_suffix(path_prefix):
    # Users often pass `corpus_text_document.bin`; accept it as the prefix it names.
    for suffix in (".bin", ".idx"):
        if path_prefix.endswith(suffix):
            return path_prefix[: -len(suffix)]
    return path_prefix


class _Index:
    """The parsed `.idx`: header fields plus memory-mapped lengths, pointers and document index."""

    def __init__(self, idx_path):
        self.path = idx_path
        file_size = os.path.getsize(idx_path)
        if file_size < HEADER.size:
            raise IndexedDatasetError(
                f"{idx_path}: truncated index: {file_size} bytes, smaller than the {HEADER.size}-byte "
                f"MMIDIDX header. Re-run preprocessing to rewrite it.")
        with open(idx_path, "rb") as f:
            magic, version, code, n, d = HEADER.unpack(f.read(HEADER.size))
        if magic != MAGIC:
            raise IndexedDatasetError(
                f"{idx_path}: not a Megatron mmap index (magic {magic!r}, expected {MAGIC!r}). "
                f"Only the MMIDIDX format (--dataset-impl mmap) is supported; convert older "
                f"'lazy'/'cached' datasets with Megatron's preprocess_data.py.")
        if version != VERSION:
            raise IndexedDatasetError(
                f"{idx_path}: unknown MMIDIDX version {version}; this reader knows version {VERSION}.")
        if code not in DTYPE_CODES:
            raise IndexedDatasetError(
                f"{idx_path}: unknown dtype code {code}; valid codes are "
                f"{', '.join(f'{c}={np.dtype(t).name}' for c, t in DTYPE_CODES.items())}.")
        expected_size = HEADER.size + 12 * n + 8 * d
        if file_size < expected_size:
            raise IndexedDatasetError(
                f"{idx_path}: truncated index: header declares {n} sequences and {d} document "
                f"index entries ({expected_size} bytes) but the file has {file_size} bytes. "
                f"The write was probably interrupted; re-run preprocessing.")
        self.dtype = np.dtype(DTYPE_CODES[code])
        self.dtype_code = code
        buffer = np.memmap(idx_path, mode="r", dtype=np.uint8)
        self._buffer = buffer
        self.sequence_lengths = np.frombuffer(buffer, np.int32, n, HEADER.size)
        self.sequence_pointers = np.frombuffer(buffer, np.int64, n, HEADER.size + 4 * n)
        self.document_indices = np.frombuffer(buffer, np.int64, d, HEADER.size + 12 * n)


class IndexedDataset:
    """Read-only view of a Megatron mmap dataset `{path_prefix}.bin/.idx`.

    `ds[i]` is sequence i as a numpy array (a slice `ds[a:b]` gives a list of them);
    `ds.get(i, offset, length)` reads part of a sequence without touching the rest.
    """

    def __init__(self, path_prefix):
        self.path_prefix = _strip_suffix(str(path_prefix))
        idx_path = index_file_path(self.path_prefix)
        bin_path = data_file_path(self.path_prefix)
        for path, what in ((idx_path, "index"), (bin_path, "data")):
            if not os.path.isfile(path):
                raise IndexedDatasetError(
                    f"{path}: {what} file not found. A dataset prefix names two files, "
                    f"{self.path_prefix}.bin and {self.path_prefix}.idx; check --data-path "
                    f"(give the prefix without .bin/.idx).")
        self._index = _Index(idx_path)
        lengths, pointers = self._index.sequence_lengths, self._index.sequence_pointers
        itemsize = self._index.dtype.itemsize
        expected_bin = int(pointers[-1]) + int(lengths[-1]) * itemsize if len(lengths) else 0
        actual_bin = os.path.getsize(bin_path)
        if actual_bin != expected_bin:
            raise IndexedDatasetError(
                f"{bin_path}: size {actual_bin} bytes does not match its index {idx_path}, which "
                f"describes {expected_bin} bytes of {self._index.dtype.name} tokens. The .bin and "
                f".idx come from different runs or a write was interrupted; re-run preprocessing.")
        # A zero-byte file cannot be memory-mapped; an empty dataset simply has no tokens.
        self._bin = (np.memmap(bin_path, mode="r", dtype=np.uint8) if actual_bin
                     else np.zeros(0, np.uint8))

    def __len__(self):
        return len(self._index.sequence_lengths)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return [self[i] for i in range(*idx.indices(len(self)))]
        return self.get(idx)

    def get(self, idx, offset=0, length=None):
        """Tokens `[offset, offset + length)` of sequence `idx` (to its end when length is None)."""
        idx = int(idx)
        if idx < 0:
            idx += len(self)
        if not 0 <= idx < len(self):
            raise IndexError(f"sequence {idx} out of range for {self.path_prefix} "
                             f"({len(self)} sequences)")
        size = int(self._index.sequence_lengths[idx])
        if length is None:
            length = size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise IndexError(f"tokens [{offset}, {offset + length}) out of range for sequence "
                             f"{idx} of {self.path_prefix} (length {size})")
        start = int(self._index.sequence_pointers[idx]) + offset * self.dtype.itemsize
        return np.frombuffer(self._bin, self.dtype, length, start)

    @property
    def dtype(self):
        return self._index.dtype

    @property
    def dtype_code(self):
        return self._index.dtype_code

    @property
    def sequence_lengths(self):
        return self._index.sequence_lengths

    @property
    def sequence_pointers(self):
        return self._index.sequence_pointers

    @property
    def document_indices(self):
        return self._index.document_indices

    # Megatron's legacy names, used by existing user code.
    sizes = sequence_lengths
    doc_idx = document_indices

    @property
    def num_tokens(self):
        return int(self._index.sequence_lengths.sum(dtype=np.int64))

    @staticmethod
    def exists(path_prefix):
        prefix = _strip_suffix(str(path_prefix))
        return os.path.isfile(index_file_path(prefix)) and os.path.isfile(data_file_path(prefix))


class IndexedDatasetBuilder:
    """Writes a Megatron mmap dataset: tokens go to `bin_path` as they arrive, the index at the end.

    Per document either `add_item(seq)` for each sequence then `end_document()`, or
    `add_document(tokens, lengths)` with all its sequences at once. `add_index(prefix)` appends a
    whole existing dataset (merging). `finalize(idx_path)` writes the `.idx`.
    Lengths and document boundaries are kept in compact C arrays, so a corpus of hundreds of
    millions of sequences does not need tens of GB of Python ints.
    """

    def __init__(self, bin_path, dtype=np.int32):
        self.dtype = np.dtype(dtype)
        if self.dtype not in CODE_OF_DTYPE:
            raise ValueError(f"unsupported token dtype {self.dtype}; choose one of "
                             f"{sorted(t.name for t in CODE_OF_DTYPE)}")
        self.bin_path = str(bin_path)
        self._data_file = open(self.bin_path, "wb")
        self.sequence_lengths = array.array("i")
        self.document_indices = array.array("q", [0])

    def _write(self, tokens):
        data = np.asarray(tokens)
        if data.dtype != self.dtype:
            data = data.astype(self.dtype)
        self._data_file.write(np.ascontiguousarray(data).tobytes(order="C"))
        return data.size

    def add_item(self, tokens):
        """Append one sequence to the current document."""
        self.sequence_lengths.append(self._write(tokens))

    def end_document(self):
        """Close the current document (its sequences are those added since the last close)."""
        self.document_indices.append(len(self.sequence_lengths))

    def add_document(self, tokens, lengths):
        """Append a whole document: `tokens` concatenated, split into sequences of `lengths`."""
        written = self._write(tokens)
        if written != sum(lengths):
            raise ValueError(f"add_document: {written} tokens but lengths sum to {sum(lengths)}")
        self.sequence_lengths.extend(int(n) for n in lengths)
        self.end_document()

    def add_index(self, path_prefix):
        """Append every document of the dataset `path_prefix` (must have the same dtype)."""
        other = IndexedDataset(path_prefix)
        if other.dtype != self.dtype:
            raise IndexedDatasetError(
                f"{index_file_path(other.path_prefix)}: dtype {other.dtype.name} differs from the "
                f"{self.dtype.name} being written; merge only datasets made with the same tokenizer.")
        offset = len(self.sequence_lengths)
        self.sequence_lengths.extend(other.sequence_lengths.tolist())
        self.document_indices.extend((other.document_indices[1:] + offset).tolist())
        with open(data_file_path(other.path_prefix), "rb") as f:
            shutil.copyfileobj(f, self._data_file, length=16 << 20)

    def finalize(self, idx_path):
        """Close `.bin` and write the `.idx` that describes it."""
        self._data_file.close()
        lengths = np.frombuffer(self.sequence_lengths, np.int32)
        pointers = np.zeros(len(lengths), np.int64)
        np.cumsum(lengths[:-1].astype(np.int64) * self.dtype.itemsize, out=pointers[1:])
        documents = np.frombuffer(self.document_indices, np.int64)
        with open(idx_path, "wb") as f:
            f.write(HEADER.pack(MAGIC, VERSION, CODE_OF_DTYPE[self.dtype], len(lengths), len(documents)))
            f.write(lengths.tobytes(order="C"))
            f.write(pointers.tobytes(order="C"))
            f.write(documents.tobytes(order="C"))


def consistency_problems(dataset, vocab_size=None):
    """Every way the index disagrees with itself or with the `.bin` (empty list: consistent).

    Checks what a reader silently trusts: pointers follow from the lengths, the document index
    runs from 0 to N without going backwards, lengths are non-negative, and (given a vocabulary)
    every token id is in range. Reads the whole `.bin` in chunks, so it is O(corpus).
    """
    problems = []
    lengths = dataset.sequence_lengths.astype(np.int64)
    pointers = dataset.sequence_pointers
    documents = dataset.document_indices
    if (lengths < 0).any():
        problems.append(f"{int((lengths < 0).sum())} sequences have a negative length")
    expected = np.zeros(len(lengths), np.int64)
    np.cumsum(lengths[:-1] * dataset.dtype.itemsize, out=expected[1:])
    bad = np.flatnonzero(pointers != expected)
    if len(bad):
        problems.append(f"{len(bad)} sequence pointers do not follow from the lengths "
                        f"(first: sequence {bad[0]}, pointer {pointers[bad[0]]}, expected {expected[bad[0]]})")
    if len(documents) == 0 or documents[0] != 0 or documents[-1] != len(lengths):
        problems.append(f"document index must start at 0 and end at {len(lengths)} "
                        f"(starts at {documents[0] if len(documents) else '-'}, "
                        f"ends at {documents[-1] if len(documents) else '-'})")
    if (np.diff(documents) < 0).any():
        problems.append("document index goes backwards")
    if vocab_size is not None and len(lengths):
        tokens = np.frombuffer(dataset._bin, dataset.dtype)
        chunk = 1 << 24
        for start in range(0, len(tokens), chunk):
            piece = tokens[start:start + chunk]
            if piece.min() < 0 or piece.max() >= vocab_size:
                problems.append(f"token ids outside the vocabulary [0, {vocab_size}) "
                                f"near token {start} (min {piece.min()}, max {piece.max()})")
                break
    return problems
