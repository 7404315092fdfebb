"""Blending (--data-path with weights) and the flags-to-datasets builder."""
import numpy as np
import pytest

import megatron_reference as ref
from rapidgpt.data.blended_dataset import BlendedDataset, blending_indices
from rapidgpt.data.dataset_builder import build_train_valid_test_datasets, parse_data_path
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
    assert parse_data_path(["corpus"]) == (["corpus"], [1.0])
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
    assert [d.num_samples for d in train.datasets] == [51, 151]         # ceil(1.005 * w * 200)
    again, _, _ = build_train_valid_test_datasets(
        config(tmp_path), [200, 20, 0], data_path=["0.25", corpora[0], "0.75", corpora[1]], split="9,1,0")
    assert not again.built_cache and again.cache_key == train.cache_key


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
