"""Blending (--data-path with weights) and the flags-to-datasets builder."""
import threading

import numpy as np
import pytest

import megatron_reference as ref
from rapidgpt.data import blended_dataset, gpt_dataset
from rapidgpt.data.blended_dataset import BlendedDataset, blending_indices
from rapidgpt.data.dataset_builder import blend_sizes, build_train_valid_test_datasets, parse_data_path
from rapidgpt.data.gpt_dataset import GPTDataset, GPTDatasetConfig
from test_gpt_dataset import write_corpus


@pytest.mark.parametrize("weights,size", [([0.3, 0.7], 1000), ([0.5, 0.25, 0.25], 333),
                                          ([0.1, 0.2, 0.3, 0.4], 50), ([1.0], 10)])
def test_blending_indices_equal_megatron(weights, size):
    ours = blending_indices(weights, size)
    dataset_index, sample_index = ref.blending_indices(weights, size)
    np.testing.assert_array_equal(ours["dataset_index"], dataset_index)
    np.testing.assert_array_equal(ours["dataset_sample_index"], sample_index)
    counts = np.bincount(ours["dataset_index"], minlength=len(weights))
    assert np.all(np.abs(counts - np.array(weights) * size) <= 1)


def test_parse_data_path():
    assert parse_data_path(["corpus"]) == (["corpus"], None)
    assert parse_data_path(["1", "corpus"]) == (["corpus"], [1.0])
    assert parse_data_path("0.3 a 0.7 b") == (["a", "b"], [0.3, 0.7])
    assert parse_data_path(["2", "a", "6", "b"]) == (["a", "b"], [0.25, 0.75])


@pytest.mark.parametrize("bad", [["a", "b"], ["0.3", "a", "0.7"], ["x", "a", "0.7", "b"], []])
def test_parse_data_path_errors(bad):
    with pytest.raises(ValueError, match="--data-path: expected one dataset prefix, or weight/prefix pairs"):
        parse_data_path(bad)


@pytest.fixture
def corpora(tmp_path):
    rng = np.random.default_rng(0)
    prefixes = []
    for name, base in (("a", 100), ("b", 200)):
        docs = [base + rng.integers(0, 50, size=int(rng.integers(5, 40))) for _ in range(60)]
        write_corpus(str(tmp_path / name), docs)
        prefixes.append(str(tmp_path / name))
    return prefixes


def config(tmp_path, **kw):
    return GPTDatasetConfig(seq_length=16, seed=7, data_cache_path=str(tmp_path / "cache"), **kw)


def test_single_corpus_split(corpora, tmp_path):
    train, valid, test = build_train_valid_test_datasets(config(tmp_path), [40, 8, 0],
                                                         data_path=[corpora[0]], split="80,20,0")
    assert isinstance(train, GPTDataset) and isinstance(valid, GPTDataset) and test is None
    assert train.document_index.max() < 48 <= valid.document_index.min()
    assert len(train) >= 40 and len(valid) >= 8


def test_blend_follows_weights_and_sources(corpora, tmp_path):
    train, valid, _ = build_train_valid_test_datasets(
        config(tmp_path), [200, 20, 0], data_path=["0.25", corpora[0], "0.75", corpora[1]], split="9,1,0")
    assert isinstance(train, BlendedDataset) and len(train) == 200
    from_b = sum(int(train[i]["tokens"][0]) >= 200 for i in range(len(train)))
    assert from_b == 150
    # Parts get Megatron's 0.5% headroom.
    assert [d.num_samples for d in train.datasets] == [51, 151]         # ceil(1.005 * ceil(w * 200))
    again, _, _ = build_train_valid_test_datasets(
        config(tmp_path), [200, 20, 0], data_path=["0.25", corpora[0], "0.75", corpora[1]], split="9,1,0")
    assert not again.built_cache and again.cache_key == train.cache_key


def test_blend_length_is_sum_of_rounded_up_shares(corpora, tmp_path):
    train, _, _ = build_train_valid_test_datasets(
        config(tmp_path), [201, 0, 0], data_path=["0.3", corpora[0], "0.7", corpora[1]], split="1")
    assert len(train) == 61 + 141                                        # ceil(60.3) + ceil(140.7)
    assert [d.num_samples for d in train.datasets] == [62, 142]         # ceil(1.005 * 61), ceil(1.005 * 141)


WEIGHTS = [[0.3, 0.7], [1, 1], [2, 6], [0.25, 0.25, 0.5], [1, 2, 3, 4], [0.1] * 9 + [0.7],
           [3, 1, 4, 1, 5, 9, 2, 6, 5], [1e-3, 1 - 1e-3], [1.0]]


@pytest.mark.parametrize("weights", WEIGHTS)
def test_blend_sizes_equal_megatron_core(weights):
    """Against the line-by-line port of Megatron-core's sizing, for many sample counts."""
    ours_weights = parse_data_path([x for w, i in zip(weights, range(len(weights)))
                                    for x in (str(w), f"p{i}")])[1]
    counts = list(range(0, 3000)) + [10**k + d for k in range(4, 11) for d in (-1, 0, 1, 3)]
    for n in counts:
        top, buffers, megatron_weights = ref.weighted_blend_sizes(weights, [n, 0, 0])
        assert ours_weights == megatron_weights
        assert blend_sizes(n, ours_weights) == (top[0], buffers[0]), n


@pytest.mark.parametrize("weights,n,split", [([0.3, 0.7], 201, "969,30,1"), ([1, 2, 3], 97, "8,1,1"),
                                             ([0.5, 0.5], 64, "2,1,1"), ([1.0], 50, "98,2,0")])
def test_builder_equals_megatron_core(corpora, tmp_path, weights, n, split):
    """Documents, part sizes, blend length and the blend's index all as Megatron-core builds them."""
    paths = [corpora[i % 2] for i in range(len(weights))]
    data_path = [x for w, p in zip(weights, paths) for x in (str(w), p)]
    sizes = [n, n // 10, 3]
    datasets = build_train_valid_test_datasets(config(tmp_path), sizes, data_path=data_path, split=split)
    top, buffers, megatron_weights = ref.weighted_blend_sizes(weights, sizes)
    for i, blend in enumerate(datasets):
        ranges = ref.split_ranges(split, 60)                            # both corpora have 60 documents
        if ranges[i] is None or ranges[i][0] == ranges[i][1]:
            assert blend is None
            continue
        assert isinstance(blend, BlendedDataset) and len(blend) == top[i]
        assert [d.num_samples for d in blend.datasets] == buffers[i]
        for part in blend.datasets:
            assert sorted(set(part.document_index.tolist())) == list(range(*ranges[i]))
        dataset_index, sample_index = ref.blended_dataset_indices(megatron_weights, top[i])
        np.testing.assert_array_equal(blend.dataset_index, dataset_index)
        np.testing.assert_array_equal(blend.dataset_sample_index, sample_index)


class Part:
    """Stands in for a GPTDataset inside a BlendedDataset: a length, a cache key, samples."""

    def __init__(self, name, size):
        self.cache_key, self.size = name, size

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        return (self.cache_key, i)


def test_blend_renormalises_weights_as_megatron(tmp_path):
    """Megatron normalises the --data-path weights, and its BlendedDataset normalises them again;
    for 1:6:2 the second pass moves a last bit, which changes where a tie falls in 100 samples."""
    weights = parse_data_path(["1", "a", "6", "b", "2", "c"])[1]
    once, _ = ref.blending_indices(weights, 100)
    twice, twice_samples = ref.blended_dataset_indices(weights, 100)
    assert not np.array_equal(once, twice)                  # the case really tells them apart
    blend = BlendedDataset([Part(n, 100) for n in "abc"], weights, 100, str(tmp_path))
    np.testing.assert_array_equal(blend.dataset_index, twice)
    np.testing.assert_array_equal(blend.dataset_sample_index, twice_samples)
    assert blend[5] == ("abc"[twice[5]], twice_samples[5])


def test_weighted_single_corpus_is_a_blend_of_one(corpora, tmp_path):
    """`--data-path 1 PREFIX` goes through Megatron's blend (part built with the surplus), a bare
    prefix does not; a single --train-data-path corpus is never blended, weighted or not."""
    blend, _, _ = build_train_valid_test_datasets(config(tmp_path), [100, 0, 0],
                                                  data_path=["1", corpora[0]], split="1")
    assert isinstance(blend, BlendedDataset) and len(blend) == 100
    assert blend.datasets[0].num_samples == 101
    assert blend.dataset_sample_index.tolist() == list(range(100))
    plain, _, _ = build_train_valid_test_datasets(config(tmp_path), [100, 0, 0],
                                                  data_path=[corpora[0]], split="1")
    assert isinstance(plain, GPTDataset) and plain.num_samples == 100
    alone, _, _ = build_train_valid_test_datasets(config(tmp_path), [100, 0, 0],
                                                  train_data_path=["1", corpora[0]])
    assert isinstance(alone, GPTDataset) and alone.num_samples == 100


def test_separate_split_blend_sized_as_megatron(corpora, tmp_path):
    train, _, _ = build_train_valid_test_datasets(
        config(tmp_path), [201, 0, 0], train_data_path=["0.3", corpora[0], "0.7", corpora[1]])
    assert len(train) == 202 and [d.num_samples for d in train.datasets] == [62, 142]
    with pytest.raises(ValueError, match="the train split blends weighted corpora, which needs a sample count"):
        build_train_valid_test_datasets(config(tmp_path), [None, 0, 0],
                                        train_data_path=["0.3", corpora[0], "0.7", corpora[1]])


def test_separate_split_paths_use_whole_corpora(corpora, tmp_path):
    train, valid, test = build_train_valid_test_datasets(
        config(tmp_path), [30, 5, 5], train_data_path=[corpora[0]], valid_data_path=[corpora[1]])
    assert test is None
    assert sorted(set(train.document_index.tolist())) == list(range(60))
    assert int(valid[0]["tokens"][0]) >= 200


def test_builder_flag_errors(corpora, tmp_path):
    with pytest.raises(ValueError, match="give either --data-path .* not both"):
        build_train_valid_test_datasets(config(tmp_path), [1, 1, 1], data_path=[corpora[0]],
                                        train_data_path=[corpora[1]])
    with pytest.raises(ValueError, match="no training data: pass --data-path PREFIX"):
        build_train_valid_test_datasets(config(tmp_path), [1, 1, 1])
    with pytest.raises(ValueError, match="--valid-data-path: expected one dataset prefix"):
        build_train_valid_test_datasets(config(tmp_path), [1, 1, 1], train_data_path=[corpora[0]],
                                        valid_data_path=["a", "b"])


# ---- one rank builds the index caches, the others wait ------------------------------------------

def all_datasets(datasets):
    """The GPT datasets and blends of a build, flattened."""
    out = []
    for d in datasets:
        if isinstance(d, BlendedDataset):
            out += d.datasets
        if d is not None:
            out.append(d)
    return out


BLEND = dict(train_valid_test_num_samples=[120, 20, 0], split="8,2,0")


def test_follower_rank_waits_and_maps_what_the_builder_made(corpora, tmp_path):
    """Two ranks as two threads meeting at a real barrier: the follower builds nothing, finds every
    file the builder wrote, and ends with the same indices."""
    barrier = threading.Barrier(2, timeout=60)          # a mismatched barrier fails instead of hanging
    data_path = ["0.4", corpora[0], "0.6", corpora[1]]
    results = {}

    def rank(r):
        results[r] = build_train_valid_test_datasets(
            config(tmp_path), data_path=data_path, build_on_this_rank=(r == 0), barrier=barrier.wait, **BLEND)

    follower = threading.Thread(target=rank, args=(1,))
    follower.start()
    rank(0)
    follower.join()
    built, mapped = all_datasets(results[0]), all_datasets(results[1])
    assert len(built) == len(mapped) == 6                 # 2 splits x (2 parts + blend)
    assert all(d.built_cache for d in built) and not any(d.built_cache for d in mapped)
    for a, b in zip(built, mapped):
        assert a.cache_key == b.cache_key
    np.testing.assert_array_equal(results[1][0].dataset_index, results[0][0].dataset_index)
    assert results[1][0][7]["tokens"].tolist() == results[0][0][7]["tokens"].tolist()


def test_non_building_rank_never_builds(corpora, tmp_path, monkeypatch):
    def must_not_run(*args):
        raise AssertionError("a non-building rank built an index")

    monkeypatch.setattr(gpt_dataset, "build_gpt_indices", must_not_run)
    monkeypatch.setattr(blended_dataset, "blending_indices", must_not_run)
    calls = []
    with pytest.raises(FileNotFoundError, match="was not built: the building rank failed, or does not share"):
        build_train_valid_test_datasets(config(tmp_path), data_path=["0.4", corpora[0], "0.6", corpora[1]],
                                        build_on_this_rank=False, barrier=lambda: calls.append(1), **BLEND)
    assert calls == [1]                                  # met the builder once, then found nothing
    assert not (tmp_path / "cache").exists()


@pytest.fixture
def job_of_two(monkeypatch):
    """Pretend to be a rank of a 2-process job: `set_rank(r)`; returns the barrier call log."""
    from rapidgpt.parallel import comm, state
    calls = []
    monkeypatch.setattr(comm, "barrier", lambda: calls.append(1))

    def set_rank(r):
        monkeypatch.setattr(state, "_STATE", state.ParallelState(world_size=2, rank=r))
    return set_rank, calls


def test_default_protocol_rank_zero_builds_others_wait(corpora, tmp_path, job_of_two):
    """With no build_on_this_rank/barrier (what GPTPretrainer and user scripts pass), rank 0 of a
    job builds and every rank calls the job's barrier once per index."""
    set_rank, calls = job_of_two
    data_path = ["0.4", corpora[0], "0.6", corpora[1]]
    set_rank(1)
    with pytest.raises(FileNotFoundError, match="was not built"):
        build_train_valid_test_datasets(config(tmp_path), data_path=data_path, **BLEND)
    assert calls == [1]
    set_rank(0)
    built = all_datasets(build_train_valid_test_datasets(config(tmp_path), data_path=data_path, **BLEND))
    assert all(d.built_cache for d in built) and len(calls) == 1 + 6
    set_rank(1)
    mapped = all_datasets(build_train_valid_test_datasets(config(tmp_path), data_path=data_path, **BLEND))
    assert not any(d.built_cache for d in mapped) and len(calls) == 1 + 6 + 6


def test_default_protocol_alone_builds_without_barrier(corpora, tmp_path, monkeypatch):
    from rapidgpt.parallel import comm, state
    monkeypatch.setattr(comm, "barrier", lambda: pytest.fail("a single process called a barrier"))
    monkeypatch.setattr(state, "_STATE", state.ParallelState())
    train, _, _ = build_train_valid_test_datasets(config(tmp_path), [10, 0, 0], data_path=[corpora[0]])
    assert train.built_cache
