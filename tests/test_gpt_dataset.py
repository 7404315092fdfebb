"""GPTDataset indexing against Megatron's algorithm, hand-computed samples, and the index cache."""
import numpy as np
import pytest

import megatron_reference as ref
from rapidgpt.data.gpt_dataset import (GPTDataset, GPTDatasetConfig, build_gpt_indices,
                                       build_sample_index, ltor_masks_and_position_ids,
                                       num_epochs_needed, split_boundaries)
from rapidgpt.data.dataset_builder import build_train_valid_test_datasets
from rapidgpt.data.index_cache import cached_arrays
from rapidgpt.data.mock_dataset import MockCorpus
from rapidgpt.data.indexed_dataset import IndexedDataset, IndexedDatasetBuilder


def write_corpus(prefix, documents, dtype=np.uint16):
    b = IndexedDatasetBuilder(prefix + ".bin", dtype)
    for doc in documents:
        b.add_item(np.asarray(doc))
        b.end_document()
    b.finalize(prefix + ".idx")
    return IndexedDataset(prefix)


@pytest.fixture
def hand_corpus(tmp_path):
    """Three documents: lengths 3, 5, 2, token values that say where they come from."""
    docs = [[10, 11, 12], [20, 21, 22, 23, 24], [30, 31]]
    return write_corpus(str(tmp_path / "hand"), docs), docs


def test_split_boundaries_megatron_rounding():
    # Current Megatron-core: split i is [round(c_i * N), round(c_(i+1) * N)), c cumulative weights.
    assert split_boundaries("969,30,1", 81) == [0, 78, 81, 81]     # legacy rounding gave [0, 79, 81, 81]
    assert split_boundaries("969,30,1", 1000) == [0, 969, 999, 1000]
    assert split_boundaries("969, 30, 1", 10) == [0, 10, 10, 10]
    assert split_boundaries("8,1,1", 7) == [0, 6, 6, 7]            # round(5.6)=6, round(6.3)=6
    assert split_boundaries("98/2", 100) == [0, 98, 100, 100]
    assert split_boundaries("1", 5) == [0, 5, 5, 5]
    assert split_boundaries("2,1,1", 2) == [0, 1, 2, 2]             # round(0.5)=0, round(1.5)=2: half to even


SPLITS = ["969,30,1", "969, 30, 1", "98,2,0", "99,1", "100,0,0", "8,1,1", "1,1,1", "3,3,4",
          "0.7,0.2,0.1", "1", "949,50,1", "90,5,5", "1,0,1", "0,1,0", "333,333,334", "7/2/1"]


@pytest.mark.parametrize("split", SPLITS)
def test_split_boundaries_equal_megatron_core(split):
    """Against the line-by-line port of Megatron-core's split rule, for every N up to 2000 and a
    spread of larger ones: equal ranges, and empty exactly where Megatron builds nothing or an
    empty split."""
    sizes = list(range(0, 2001)) + [10**k + d for k in range(4, 10) for d in (-1, 0, 1, 7)]
    for n in sizes:
        bounds = split_boundaries(split, n)
        for i, megatron in enumerate(ref.split_ranges(split, n)):
            ours = (bounds[i], bounds[i + 1])
            if megatron is None:
                assert ours[0] == ours[1], (split, n, i)
            else:
                assert ours == megatron, (split, n, i)
        assert bounds[0] == 0 and bounds[-1] == n


def test_split_keeps_megatron_launch_scripts_quotes():
    """`--split '99,1,0'` in a variable the shell word-splits arrives with its quotes."""
    assert split_boundaries("'99,1,0'", 100) == split_boundaries("99,1,0", 100)
    assert split_boundaries('"949,50,1"', 1000) == split_boundaries("949,50,1", 1000)


@pytest.mark.parametrize("bad", ["a,b", "1,2,3,4", "-1,2", "0,0,0", ""])
def test_split_rejects_bad_string(bad):
    with pytest.raises(ValueError, match=r"--split .*expected up to three non-negative weights"):
        split_boundaries(bad, 10)


@pytest.mark.parametrize("tokens,seq,n", [(10, 4, 1), (10, 4, 2), (10, 4, 3), (10, 4, 7),
                                          (1000, 128, 50), (7, 3, 100), (5, 5, 0)])
def test_num_epochs_matches_loop(tokens, seq, n):
    assert num_epochs_needed(tokens, seq, n) == ref.num_epochs(tokens, seq, n)


def test_sample_boundaries_hand_computed(hand_corpus):
    """Stream 10 11 12 20 21 22 23 24 30 31, seq_length 3: samples of 4 tokens, overlap 1."""
    ds, docs = hand_corpus
    document_index = np.array([0, 1, 2])                 # unshuffled, one epoch
    sample_index = build_sample_index(ds.sequence_lengths, document_index, 3, 1, 10)
    # (10 - 1) // 3 = 3 samples: [10 11 12 20] [20 21 22 23] [23 24 30 31]
    assert sample_index.tolist() == [[0, 0], [1, 0], [1, 3], [2, 1]]


def test_samples_hand_computed(hand_corpus, tmp_path):
    ds, _ = hand_corpus
    config = GPTDatasetConfig(seq_length=3, seed=1, data_cache_path=str(tmp_path / "cache"))
    gpt = GPTDataset(ds, "train", np.arange(3), 3, config)
    # Megatron's shuffling: document order and sample order from RandomState(1).
    doc_order, _, shuffle = ref.index_mappings(ds.sequence_lengths, np.arange(3), 3, 3, 1)
    stream = np.concatenate([ds[int(d)] for d in doc_order])
    expected = [stream[3 * j: 3 * j + 4] for j in range(3)]
    for i in range(3):
        item = gpt[i]
        want = expected[int(shuffle[i])]
        assert item["tokens"].tolist() == want[:-1].tolist()
        assert item["labels"].tolist() == want[1:].tolist()
        assert item["position_ids"].tolist() == [0, 1, 2]
        assert item["loss_mask"].tolist() == [1, 1, 1]
        assert "attention_mask" not in item
    assert len(gpt) == 3


def _random_sizes(rng, n, zero_share=0.1):
    sizes = rng.integers(1, 60, size=n).astype(np.int32)
    sizes[rng.random(n) < zero_share] = 0
    sizes[0] = max(sizes[0], 1)
    return sizes


@pytest.mark.parametrize("case", range(12))
def test_indices_equal_megatron_reference(case):
    rng = np.random.default_rng(case)
    sizes = _random_sizes(rng, int(rng.integers(5, 80)))
    lo = int(rng.integers(0, 3))
    documents = np.arange(lo, len(sizes), dtype=np.int32)
    if sizes[documents].sum() < 2:
        sizes[documents[0]] = 5
    seq = int(rng.integers(1, 40))
    # Sample counts from a fraction of one epoch to several epochs, hitting both final-epoch rules.
    tokens = int(sizes[documents].sum())
    num_samples = max(1, int(tokens / seq * rng.choice([0.3, 1.0, 1.5, 2.1, 3.9])))
    seed = int(rng.integers(0, 10000))
    ours = build_gpt_indices(sizes, documents, num_samples, seq, seed)
    doc_idx, sample_idx, shuffle_idx = ref.index_mappings(sizes, documents, num_samples, seq, seed)
    np.testing.assert_array_equal(ours["document_index"], doc_idx)
    np.testing.assert_array_equal(ours["sample_index"], sample_idx)
    np.testing.assert_array_equal(ours["shuffle_index"], shuffle_idx)
    assert ours["shuffle_index"].dtype == np.uint32


def test_separate_final_epoch_rule_exercised():
    """A count needing just past one epoch shuffles the final epoch apart (Megatron's 80% rule)."""
    sizes = np.full(50, 10, np.int32)
    documents = np.arange(50)
    per_epoch = (500 - 1) // 10
    ours = build_gpt_indices(sizes, documents, per_epoch + 5, 10, 3)
    _, _, shuffle_idx = ref.index_mappings(sizes, documents, per_epoch + 5, 10, 3)
    np.testing.assert_array_equal(ours["shuffle_index"], shuffle_idx)
    # The first ((2*500 - 1) // 10 - ...) samples are a permutation of the first epoch's samples.
    before_final = (500 - 1) // 10
    assert sorted(ours["shuffle_index"][:before_final].tolist()) == list(range(before_final))
    assert set(ours["document_index"][:50].tolist()) == set(range(50))   # epochs shuffled apart


def test_sample_index_with_token_counts_past_int32():
    sizes = np.array([2**30, 2**30, 2**30, 3], np.int32)
    ours = build_sample_index(sizes, np.array([0, 1, 2, 3]), 2**28, 1, 3 * 2**30 + 3)
    expected = ref.sample_index(sizes, np.array([0, 1, 2, 3]), 2**28, 1, 3 * 2**30 + 3)
    np.testing.assert_array_equal(ours, expected)


@pytest.mark.parametrize("reset_pos,reset_att,mask_eod", [(False, False, True), (True, False, False),
                                                          (False, True, False), (True, True, True)])
def test_masks_and_positions_match_megatron(reset_pos, reset_att, mask_eod):
    tokens = np.array([5, 0, 7, 8, 0, 0, 9, 4], np.int32)        # eod = 0, also back to back
    loss, pos, att = ltor_masks_and_position_ids(tokens, 0, mask_eod, reset_pos, reset_att)
    ref_att, ref_loss, ref_pos = ref.ltor_masks(tokens, 0, reset_pos, reset_att, mask_eod)
    np.testing.assert_array_equal(loss, ref_loss)
    np.testing.assert_array_equal(pos, ref_pos)
    if reset_att:
        np.testing.assert_array_equal(att, ref_att)
    else:
        assert att is None


def test_getitem_applies_eod_settings(tmp_path):
    ds = write_corpus(str(tmp_path / "eod"), [[1, 2, 0], [3, 4, 5, 0], [6, 0]])
    config = GPTDatasetConfig(seq_length=8, seed=0, eod=0, eod_mask_loss=True, reset_position_ids=True,
                              reset_attention_mask=True, data_cache_path=str(tmp_path / "c"))
    item = GPTDataset(ds, "train", np.arange(3), None, config)[0]
    tokens = item["tokens"]
    ref_att, ref_loss, ref_pos = ref.ltor_masks(tokens, 0, True, True, True)
    np.testing.assert_array_equal(item["loss_mask"], ref_loss)
    np.testing.assert_array_equal(item["position_ids"], ref_pos)
    np.testing.assert_array_equal(item["attention_mask"], ref_att)
    assert item["tokens"].dtype == np.int32 and item["attention_mask"].shape == (1, 8, 8)


# ---- cache --------------------------------------------------------------------------------------

class CountingBarrier:
    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1


def test_cache_reused_then_rebuilt_on_setting_change(hand_corpus, tmp_path):
    ds, _ = hand_corpus
    cache = str(tmp_path / "cache")
    config = GPTDatasetConfig(seq_length=3, seed=5, data_cache_path=cache)
    first = GPTDataset(ds, "train", np.arange(3), 6, config)
    assert first.built_cache
    second = GPTDataset(ds, "train", np.arange(3), 6, config)
    assert not second.built_cache and second.cache_key == first.cache_key
    assert not second.sample_index.flags.owndata and not second.sample_index.flags.writeable  # mapped
    np.testing.assert_array_equal(second.shuffle_index, first.shuffle_index)
    for change in (dict(seed=6), dict(seq_length=2)):
        other = GPTDataset(ds, "train", np.arange(3), 6,
                           GPTDatasetConfig(**{**dict(seq_length=3, seed=5, data_cache_path=cache), **change}))
        assert other.built_cache and other.cache_key != first.cache_key
    assert GPTDataset(ds, "train", np.arange(3), 7, config).built_cache     # num_samples
    assert GPTDataset(ds, "valid", np.arange(3), 6, config).built_cache     # split
    assert GPTDataset(ds, "train", np.arange(2), 6, config).built_cache     # documents


def test_cache_defaults_beside_the_data(hand_corpus, tmp_path):
    ds, _ = hand_corpus
    gpt = GPTDataset(ds, "train", np.arange(3), 2, GPTDatasetConfig(seq_length=3))
    assert gpt.cache_dir == str(tmp_path / "cache" / "GPTDataset_indices")


def test_one_rank_builds_others_wait(hand_corpus, tmp_path):
    ds, _ = hand_corpus
    config = GPTDatasetConfig(seq_length=3, data_cache_path=str(tmp_path / "c"))
    barrier = CountingBarrier()
    with pytest.raises(FileNotFoundError, match="was not built: the building rank failed, or does not share"):
        GPTDataset(ds, "train", np.arange(3), 2, config, build_on_this_rank=False, barrier=barrier)
    assert barrier.calls == 1
    builder = GPTDataset(ds, "train", np.arange(3), 2, config, build_on_this_rank=True, barrier=barrier)
    follower = GPTDataset(ds, "train", np.arange(3), 2, config, build_on_this_rank=False, barrier=barrier)
    assert builder.built_cache and not follower.built_cache and barrier.calls == 3
    np.testing.assert_array_equal(follower.sample_index, builder.sample_index)


def test_failed_build_still_releases_the_waiting_ranks(tmp_path):
    """The building rank meets the barrier even when building raises, so the others stop with an
    error of their own instead of waiting for it forever."""
    barrier = CountingBarrier()

    def broken():
        raise MemoryError("no room for the index")

    with pytest.raises(MemoryError):
        cached_arrays(str(tmp_path), "Test", {"a": 1}, ("x",), broken, True, barrier)
    assert barrier.calls == 1
    with pytest.raises(FileNotFoundError, match="was not built"):
        cached_arrays(str(tmp_path), "Test", {"a": 1}, ("x",), broken, False, barrier)
    assert barrier.calls == 2


def test_empty_split_is_a_clear_error(hand_corpus, tmp_path):
    ds, _ = hand_corpus
    with pytest.raises(ValueError, match="the valid split of .* has no documents; change --split"):
        GPTDataset(ds, "valid", np.arange(0), 2, GPTDatasetConfig(seq_length=3))


def test_mock_data_is_megatrons_mock_corpus_cut_1_1_1_whatever_the_split(tmp_path):
    """--mock-data: the documents of Megatron's MockGPTLowLevelDataset (vocabulary 300 < most
    documents' length, so the modulo shows), cut "1,1,1" as Megatron's config cuts a run without a
    blend (--split is ignored), each split indexed as any corpus (the indices against Megatron's:
    test_indices_equal_megatron_reference); its caches under --data-cache-path."""
    vocab, eod = 300, 299
    corpus, reference = MockCorpus(vocab, eod), ref.MockGPTLowLevelDataset(vocab, eod)
    np.testing.assert_array_equal(corpus.sequence_lengths, reference.sequence_lengths)
    for idx in (0, 1, 4711, 99999):
        np.testing.assert_array_equal(corpus.get(idx), reference[idx])
        np.testing.assert_array_equal(corpus.get(idx, 1, 3), reference.get(idx, 1, 3))
        np.testing.assert_array_equal(corpus.get(idx, 2), reference.get(idx, 2))
    config = GPTDatasetConfig(seq_length=32, seed=7, eod=eod, data_cache_path=str(tmp_path))
    sizes = [40, 8, 8]
    datasets = build_train_valid_test_datasets(config, sizes, split="969,30,1", mock=corpus)
    for dataset, (beg, end), n in zip(datasets, ref.split_ranges("1,1,1", 100000), sizes):
        np.testing.assert_array_equal(np.sort(dataset.document_index), np.arange(beg, end))    # one epoch
        for i in (0, n - 1):                   # samples, from the reference documents
            j = int(dataset.shuffle_index[i])
            (first, offset), (last, _) = dataset.sample_index[j], dataset.sample_index[j + 1]
            stream = np.concatenate([reference[dataset.document_index[d]] for d in range(first, last + 1)])
            np.testing.assert_array_equal(dataset.sample_tokens(i), stream[offset:offset + 33])
    assert list(tmp_path.glob("*GPTDataset-train-document_index.npy"))
    with pytest.raises(ValueError, match="--mock-data: give one data source"):
        build_train_valid_test_datasets(config, sizes, data_path=["x"], mock=corpus)
