"""Checkpoint resharding between tensor-parallel sizes (numpy level; the msrun runs of
test_parallel.py load real TP=2 checkpoints in one process and back)."""
import numpy as np
import pytest

from rapidgpt.engine import RapidGPTEngine
from rapidgpt.models.gpt import build_gpt_model
from rapidgpt.parallel.resharding import merge_shards, split_for_rank, tensor_parallel_layout


def test_gpt_layout_names_every_split_tensor_and_its_optimizer_state():
    args = RapidGPTEngine(argv=["--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2",
                                "--seq-length", "8", "--untie-embeddings-and-output-weights"]).args
    model = build_gpt_model(args, 50)
    names = [p.name for p in model.get_parameters()]
    layout = tensor_parallel_layout(model, names + ["adam_m." + n for n in names] + ["adam_step"])
    assert layout["word_embeddings.weight"] == [0, 50]                    # 50 vocabulary rows, padded
    assert layout["output_layer.weight"] == [0, 50]
    assert layout["layers.0.self_attention.query_key_value.weight"] == [0, None]   # column parallel
    assert layout["layers.0.self_attention.query_key_value.bias"] == [0, None]
    assert layout["layers.0.self_attention.dense.weight"] == [1, None]    # row parallel
    assert layout["adam_m.layers.0.mlp.dense_4h_to_h.weight"] == [1, None]
    # replicated: the row-parallel bias, layer norms, positions, optimizer step
    for name in ("layers.0.self_attention.dense.bias", "position_embeddings.weight", "adam_step"):
        assert name in names + ["adam_step"] and name not in layout


def pieces_of(full, dim, size):
    return np.split(full, size, axis=dim)


@pytest.mark.parametrize("dim", [0, 1])
def test_two_pieces_become_one_and_four(dim):
    full = np.arange(8 * 12, dtype=np.float32).reshape(8, 12)
    merged = merge_shards("w", pieces_of(full, dim, 2), [dim, None])
    np.testing.assert_array_equal(merged, full)
    local_shape = (8 // 4, 12) if dim == 0 else (8, 12 // 4)
    for rank in range(4):
        np.testing.assert_array_equal(split_for_rank("w", merged, [dim, None], local_shape, rank, 4),
                                      pieces_of(full, dim, 4)[rank])


def test_vocabulary_rows_follow_the_padding_of_the_target_size():
    vocab, hidden = 5, 3
    saved = np.zeros((8, hidden), np.float32)                # saved at TP=2, 5 rows padded to 8
    saved[:vocab] = np.arange(vocab * hidden).reshape(vocab, hidden) + 1
    full = merge_shards("emb", pieces_of(saved, 0, 2), [0, vocab])
    cut = split_for_rank("emb", full, [0, vocab], (6, hidden), 0, 1)          # TP=1 model padded to 6
    np.testing.assert_array_equal(cut, saved[:6])
    grown = np.concatenate([split_for_rank("emb", full, [0, vocab], (6, hidden), r, 2) for r in range(2)])
    assert grown.shape == (12, hidden)                                       # TP=2 model padded to 12
    np.testing.assert_array_equal(grown[:vocab], saved[:vocab])
    assert not grown[vocab:].any()


def test_replicated_tensors_pass_through_and_undeclared_splits_are_refused():
    value = np.ones(3, np.float32)
    assert merge_shards("b", [value, value * 2], None) is value
    assert split_for_rank("b", value, None, (3,), 1, 2) is value
    with pytest.raises(ValueError, match="custom.weight is split over tensor-parallel ranks along an "
                                         "undeclared dimension"):
        merge_shards("custom.weight", [value, value], [None, None])
    with pytest.raises(ValueError, match="w: dimension 1 of size 5 cannot be split over 2"):
        split_for_rank("w", np.zeros((2, 5), np.float32), [1, None], (2, 2), 0, 2)
