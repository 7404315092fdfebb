"""Straightforward re-statements of Megatron's data algorithms, used as test oracles.

These follow Megatron-LM's gpt_dataset.py / helpers.cpp step by step (loops instead of our
vectorised code), so a difference between them and rapidgpt.data is a bug in one of them.
The split and blend sizing below are line-by-line ports of megatron/core/datasets/ at
NVIDIA/Megatron-LM commit d98e8a64ddf34856e74b24714e3bedb2f5a39553 (Aug 2026): utils.py
(normalize), blended_megatron_dataset_config.py (parse_and_normalize_split,
convert_split_vector_to_split_matrix), blended_megatron_dataset_builder.py
(_build_megatron_dataset_splits' index range, _get_size_per_split_per_dataset, the top-level
size of a weighted blend) and blended_dataset.py (weights normalised again before blending).
"""
import functools
import math
import re

import numpy as np

SURPLUS = 0.005          # BlendedMegatronDatasetConfig.mid_level_dataset_surplus default


def normalize(weights):
    w = np.array(weights, dtype=np.float64)
    w_sum = np.sum(w)
    w = (w / w_sum).tolist()
    return w


def parse_and_normalize_split(split):
    split = list(map(float, re.findall(r"[.0-9]+", split)))
    split = split + [0.0 for _ in range(3 - len(split))]
    assert len(split) == 3
    assert all(map(lambda _: _ >= 0.0, split))
    return normalize(split)


def convert_split_vector_to_split_matrix(vector_a):
    vector_b = vector_a
    expansion_a = functools.reduce(lambda a, b: a + [a[len(a) - 1] + b], [[0], *vector_a])
    expansion_b = functools.reduce(lambda a, b: a + [a[len(a) - 1] + b], [[0], *vector_b])
    bookends_a = list(zip(expansion_a[:-1], expansion_a[1:]))
    bookends_b = list(zip(expansion_b[:-1], expansion_b[1:]))
    matrix = []
    for bookend_a, bookend_b in zip(bookends_a, bookends_b):
        if min(bookend_a[1], bookend_b[1]) <= max(bookend_a[0], bookend_b[0]):
            overlap = None
        else:
            overlap = (max(bookend_a[0], bookend_b[0]), min(bookend_a[1], bookend_b[1]))
        matrix.append(overlap)
    return matrix


class MockGPTLowLevelDataset:
    """megatron/core/datasets/gpt_dataset.py's MockGPTLowLevelDataset (d98e8a6), its tokenizer's
    vocab_size and eod given directly."""
    seed = 0
    size = 100000
    max_sequence_length = 4096

    def __init__(self, vocab_size, eod):
        self.vocab_size = vocab_size
        self.eod_token = eod
        rng = np.random.default_rng(seed=self.seed)
        self.sequence_lengths = rng.integers(low=1, high=self.max_sequence_length, size=self.size, dtype=np.int32)

    def __getitem__(self, idx):
        length = self.sequence_lengths[idx]
        sample = np.int64(np.concatenate([(np.arange(length - 1) + 1) % self.vocab_size, [self.eod_token]]))
        return sample

    def get(self, idx, offset=0, length=None):
        if length is None:
            length = self.sequence_lengths[idx] - offset
        return self[idx][offset : offset + length]


def split_ranges(split, num_elements):
    """`(beg, end)` of each split's documents, None for a split Megatron does not build."""
    ranges = []
    for bookend in convert_split_vector_to_split_matrix(parse_and_normalize_split(split)):
        if bookend is None:
            ranges.append(None)
        else:
            beg = int(round(bookend[0] * float(num_elements)))
            end = int(round(bookend[1] * float(num_elements)))
            ranges.append((beg, end))
    return ranges


def get_size_per_split_per_dataset(normalized_weights, target_size_per_split, surplus=0.0):
    assert np.isclose(sum(normalized_weights), 1.0)
    return [
        [int(math.ceil(math.ceil(target_size * weight) * (1 + surplus)))
         for target_size in target_size_per_split]
        for weight in normalized_weights
    ]


def weighted_blend_sizes(raw_weights, sizes):
    """A weighted `--data-path` blend: per split the top-level size, and per split the sample count
    each mid-level dataset is built with (`[split][dataset]`), plus the weights the blend uses."""
    weights = normalize(raw_weights)
    target = get_size_per_split_per_dataset(weights, sizes)
    buffer = get_size_per_split_per_dataset(weights, sizes, surplus=SURPLUS)
    top = [sum(list(zip(*target))[i]) for i in range(len(sizes))]
    return top, [list(col) for col in zip(*buffer)], weights


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


def blended_dataset_indices(weights, size):
    """BlendedDataset._build_indices with a size: normalise the weights it is given, then blend."""
    return blending_indices(normalize(weights), size)


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


# ---- BERT samples: line-by-line ports of megatron/legacy/data/dataset_utils.py (get_a_and_b_segments,
# truncate_segments, create_tokens_and_tokentypes, create_masked_lm_predictions with its defaults:
# max_ngrams 3, whole-word masking, no permutation, no geometric distribution, "bert" masking;
# pad_and_convert_to_numpy) and bert_dataset.py's build_training_sample, at NVIDIA/Megatron-LM commit
# 00caa53af309 (2024), where np_rng is the sample's numpy RandomState.

def bert_a_and_b_segments(sample, np_rng):
    n_sentences = len(sample)
    assert n_sentences > 1
    a_end = 1
    if n_sentences >= 3:
        a_end = np_rng.randint(1, n_sentences)
    tokens_a = []
    for j in range(a_end):
        tokens_a.extend(sample[j])
    tokens_b = []
    for j in range(a_end, n_sentences):
        tokens_b.extend(sample[j])
    is_next_random = False
    if np_rng.random() < 0.5:
        is_next_random = True
        tokens_a, tokens_b = tokens_b, tokens_a
    return tokens_a, tokens_b, is_next_random


def bert_truncate_segments(tokens_a, tokens_b, len_a, len_b, max_num_tokens, np_rng):
    assert len_a > 0
    if len_a + len_b <= max_num_tokens:
        return False
    while len_a + len_b > max_num_tokens:
        if len_a > len_b:
            len_a -= 1
            tokens = tokens_a
        else:
            len_b -= 1
            tokens = tokens_b
        if np_rng.random() < 0.5:
            del tokens[0]
        else:
            tokens.pop()
    return True


def bert_tokens_and_tokentypes(tokens_a, tokens_b, cls_id, sep_id):
    tokens = [cls_id] + list(tokens_a) + [sep_id]
    tokentypes = [0] * (len(tokens_a) + 2)
    for token in tokens_b:
        tokens.append(token)
        tokentypes.append(1)
    if tokens_b:
        tokens.append(sep_id)
        tokentypes.append(1)
    return tokens, tokentypes


def bert_masked_lm_predictions(tokens, vocab_id_list, vocab_id_to_token_dict, masked_lm_prob, cls_id, sep_id,
                               mask_id, max_predictions_per_seq, np_rng, max_ngrams=3):
    cand_indexes = []
    for i, token in enumerate(tokens):
        if token == cls_id or token == sep_id:
            continue
        if len(cand_indexes) >= 1 and vocab_id_to_token_dict[token].startswith("##"):
            cand_indexes[-1].append(i)
        else:
            cand_indexes.append([i])
    output_tokens = list(tokens)
    masked_lm_positions, masked_lm_labels = [], []
    if masked_lm_prob == 0:
        return output_tokens, masked_lm_positions, masked_lm_labels
    num_to_predict = min(max_predictions_per_seq, max(1, int(round(len(tokens) * masked_lm_prob))))
    ngrams = np.arange(1, max_ngrams + 1, dtype=np.int64)
    pvals = 1.0 / np.arange(1, max_ngrams + 1)
    pvals /= pvals.sum(keepdims=True)
    ngram_indexes = []
    for idx in range(len(cand_indexes)):
        ngram_index = []
        for n in ngrams:
            ngram_index.append(cand_indexes[idx:idx + n])
        ngram_indexes.append(ngram_index)
    np_rng.shuffle(ngram_indexes)
    masked_lms = []
    covered_indexes = set()
    for cand_index_set in ngram_indexes:
        if len(masked_lms) >= num_to_predict:
            break
        if not cand_index_set:
            continue
        n = np_rng.choice(ngrams[:len(cand_index_set)],
                          p=pvals[:len(cand_index_set)] / pvals[:len(cand_index_set)].sum(keepdims=True))
        index_set = sum(cand_index_set[n - 1], [])
        n -= 1
        while len(masked_lms) + len(index_set) > num_to_predict:
            if n == 0:
                break
            index_set = sum(cand_index_set[n - 1], [])
            n -= 1
        if len(masked_lms) + len(index_set) > num_to_predict:
            continue
        is_any_index_covered = False
        for index in index_set:
            if index in covered_indexes:
                is_any_index_covered = True
                break
        if is_any_index_covered:
            continue
        for index in index_set:
            covered_indexes.add(index)
            if np_rng.random() < 0.8:
                masked_token = mask_id
            else:
                if np_rng.random() < 0.5:
                    masked_token = tokens[index]
                else:
                    masked_token = vocab_id_list[np_rng.randint(0, len(vocab_id_list))]
            output_tokens[index] = masked_token
            masked_lms.append((index, tokens[index]))
    assert len(masked_lms) <= num_to_predict
    np_rng.shuffle(ngram_indexes)
    masked_lms = sorted(masked_lms, key=lambda x: x[0])
    for index, label in masked_lms:
        masked_lm_positions.append(index)
        masked_lm_labels.append(label)
    return output_tokens, masked_lm_positions, masked_lm_labels


def bert_pad_and_convert_to_numpy(tokens, tokentypes, masked_positions, masked_labels, pad_id, max_seq_length):
    num_tokens = len(tokens)
    padding_length = max_seq_length - num_tokens
    assert padding_length >= 0
    filler = [pad_id] * padding_length
    tokens_np = np.array(tokens + filler, dtype=np.int64)
    tokentypes_np = np.array(tokentypes + filler, dtype=np.int64)
    padding_mask_np = np.array([1] * num_tokens + [0] * padding_length, dtype=np.int64)
    labels = [-1] * max_seq_length
    loss_mask = [0] * max_seq_length
    for i in range(len(masked_positions)):
        labels[masked_positions[i]] = masked_labels[i]
        loss_mask[masked_positions[i]] = 1
    return tokens_np, tokentypes_np, np.array(labels, np.int64), padding_mask_np, np.array(loss_mask, np.int64)


def bert_training_sample(sample, target_seq_length, max_seq_length, vocab_id_list, vocab_id_to_token_dict,
                         cls_id, sep_id, mask_id, pad_id, masked_lm_prob, np_rng, binary_head):
    if binary_head:
        tokens_a, tokens_b, is_next_random = bert_a_and_b_segments(sample, np_rng)
    else:
        tokens_a = []
        for j in range(len(sample)):
            tokens_a.extend(sample[j])
        tokens_b = []
        is_next_random = False
    max_num_tokens = target_seq_length
    truncated = bert_truncate_segments(tokens_a, tokens_b, len(tokens_a), len(tokens_b), max_num_tokens, np_rng)
    tokens, tokentypes = bert_tokens_and_tokentypes(tokens_a, tokens_b, cls_id, sep_id)
    max_predictions_per_seq = masked_lm_prob * max_num_tokens
    tokens, masked_positions, masked_labels = bert_masked_lm_predictions(
        tokens, vocab_id_list, vocab_id_to_token_dict, masked_lm_prob, cls_id, sep_id, mask_id,
        max_predictions_per_seq, np_rng)
    tokens_np, tokentypes_np, labels_np, padding_mask_np, loss_mask_np = bert_pad_and_convert_to_numpy(
        tokens, tokentypes, masked_positions, masked_labels, pad_id, max_seq_length)
    return {"text": tokens_np, "types": tokentypes_np, "labels": labels_np, "is_random": int(is_next_random),
            "loss_mask": loss_mask_np, "padding_mask": padding_mask_np, "truncated": int(truncated)}
