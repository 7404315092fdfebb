"""Straightforward re-statements of Megatron's data algorithms, used as test oracles.

These follow Megatron-LM's gpt_dataset.py / helpers.cpp step by step (loops instead of our
vectorised code), so a difference between them and rapidgpt.data is a bug in one of them.
"""
import numpy as np


def num_epochs(tokens_per_epoch, seq_length, num_samples):
    epochs, total = 0, 0
    while True:
        epochs += 1
        total += tokens_per_epoch
        if (total - 1) // seq_length >= num_samples:
            return epochs


def document_index(documents, epochs, rng, separate_last_epoch):
    if not separate_last_epoch or epochs == 1:
        index = np.mgrid[0:epochs, 0:len(documents)][1]
        index[:] = documents
        index = index.reshape(-1).astype(np.int32)
        rng.shuffle(index)
        return index
    first = document_index(documents, epochs - 1, rng, False)
    last = document_index(documents, 1, rng, False)
    return np.concatenate((first, last))


def sample_index(sizes, doc_idx, seq_length, epochs, tokens_per_epoch):
    """helpers.cpp build_sample_idx, one sample and one document at a time."""
    num_samples = (epochs * tokens_per_epoch - 1) // seq_length
    out = np.zeros((num_samples + 1, 2), np.int64)
    doc_idx_index, doc_offset = 0, 0
    for s in range(1, num_samples + 1):
        remaining = seq_length + 1
        while remaining != 0:
            doc_length = int(sizes[doc_idx[doc_idx_index]]) - doc_offset
            remaining -= doc_length
            if remaining <= 0:
                doc_offset += remaining + doc_length - 1
                remaining = 0
            else:
                doc_idx_index += 1
                doc_offset = 0
        out[s] = doc_idx_index, doc_offset
    return out


def shuffle_index(num_samples, total_size, rng):
    first = np.arange(num_samples, dtype=np.uint32)
    rng.shuffle(first)
    if num_samples == total_size:
        return first
    last = np.arange(num_samples, total_size, dtype=np.uint32)
    rng.shuffle(last)
    return np.concatenate((first, last))


def index_mappings(sizes, documents, num_samples, seq_length, seed):
    tokens_per_epoch = int(np.sum(sizes[documents]))
    epochs = num_epochs(tokens_per_epoch, seq_length, num_samples)
    if epochs == 1:
        separate = False
    else:
        before_last = ((epochs - 1) * tokens_per_epoch - 1) // seq_length
        last_epoch_samples = num_samples - before_last
        per_epoch = (tokens_per_epoch - 1) // seq_length
        assert 0 <= last_epoch_samples <= per_epoch + 1
        separate = last_epoch_samples < int(0.80 * per_epoch)
    rng = np.random.RandomState(seed=seed)
    doc_idx = document_index(documents, epochs, rng, separate)
    sample_idx = sample_index(sizes, doc_idx, seq_length, epochs, tokens_per_epoch)
    n = before_last if separate else sample_idx.shape[0] - 1
    shuffle_idx = shuffle_index(n, sample_idx.shape[0] - 1, rng)
    return doc_idx, sample_idx, shuffle_idx


def blending_indices(weights, size):
    """helpers.cpp build_blending_indices."""
    current = [0] * len(weights)
    dataset_index, sample_index_ = [], []
    for i in range(size):
        x = max(float(i), 1.0)
        best, best_err = 0, weights[0] * x - current[0]
        for d in range(1, len(weights)):
            err = weights[d] * x - current[d]
            if err > best_err:
                best, best_err = d, err
        dataset_index.append(best)
        sample_index_.append(current[best])
        current[best] += 1
    return np.array(dataset_index), np.array(sample_index_)


def ltor_masks(tokens, eod, reset_position_ids, reset_attention_mask, eod_mask_loss):
    """get_ltor_masks_and_position_ids for one sample; returns (attention 'masked' bool, loss, pos)."""
    s = len(tokens)
    attention = np.tril(np.ones((1, s, s)))
    loss_mask = np.ones(s, np.float32)
    if eod_mask_loss:
        loss_mask[tokens == eod] = 0.0
    position_ids = np.arange(s)
    if reset_position_ids or reset_attention_mask:
        eod_index = position_ids[tokens == eod].copy()
        prev = 0
        for i in eod_index:
            if reset_attention_mask:
                attention[0, i + 1:, :i + 1] = 0
            if reset_position_ids:
                position_ids[i + 1:] -= i + 1 - prev
                prev = i + 1
    return attention < 0.5, loss_mask, position_ids
