"""BERT samples (rapidgpt/data/bert_dataset.py): a hand-computed corpus, Megatron's samples mapping
(tests/fixtures/megatron_bert_mapping.npz, written by Megatron-LM's own C++ helper), a line-by-line
port of Megatron's sample building (tests/megatron_reference.py), masking statistics, the cache."""
from pathlib import Path

import numpy as np
import pytest

import megatron_reference as megatron
from rapidgpt.data.bert_dataset import MT19937_64, BertDataset, BertDatasetConfig, build_samples_mapping
from rapidgpt.data.dataset_builder import build_train_valid_test_datasets
from rapidgpt.data.indexed_dataset import IndexedDataset, IndexedDatasetBuilder, data_file_path, index_file_path

FIXTURES = Path(__file__).resolve().parent / "fixtures"
CLS, SEP, MASK, PAD = 2, 3, 4, 0
# A toy WordPiece vocabulary: ids 10.. are words, every third one a "##" continuation piece.
VOCAB = {0: "[PAD]", 1: "[UNK]", 2: "[CLS]", 3: "[SEP]", 4: "[MASK]",
         **{i: (f"##p{i}" if i % 3 == 0 else f"w{i}") for i in range(10, 400)}}


def write_corpus(prefix, documents):
    """A sentence-level .bin/.idx: `documents` is a list of documents, each a list of sentences."""
    builder = IndexedDatasetBuilder(data_file_path(prefix), np.uint16)
    for sentences in documents:
        builder.add_document([t for s in sentences for t in s], [len(s) for s in sentences])
    builder.finalize(index_file_path(prefix))
    return IndexedDataset(prefix)


def config(seq_length, **flags):
    return BertDatasetConfig(seq_length=seq_length, cls_id=CLS, sep_id=SEP, mask_id=MASK, pad_id=PAD,
                             vocab_id_to_token=VOCAB, **flags)


def random_documents(rng, n_docs, max_sentences=8):
    return [[rng.randint(10, 400, size=rng.randint(2, 25)).tolist() for _ in range(rng.randint(0, max_sentences))]
            for _ in range(n_docs)]


def test_hand_computed_corpus(tmp_path):
    """seq length 7 (targets of 4 tokens, no short ones, no masking): doc 0 is one sample of its
    three sentences (a target is reached only with one sentence left, so the run goes on), doc 1
    (one sentence) none, doc 2 two samples of two sentences each."""
    s = [[10, 11, 12], [13, 14, 15, 16], [17, 18], [19, 20, 21, 22, 23], [30, 31], [32, 33], [34, 35], [36, 37]]
    ds = write_corpus(str(tmp_path / "c"), [[s[0], s[1], s[2]], [s[3]], [s[4], s[5], s[6], s[7]]])
    cfg = config(7, mask_prob=0.0, short_seq_prob=0.0, data_cache_path=str(tmp_path / "cache"))
    bert = BertDataset(ds, "train", np.arange(3), 3, cfg)
    assert sorted(map(tuple, bert.samples_mapping.tolist())) == [(0, 3, 4), (4, 6, 4), (6, 8, 4)]
    for i in range(3):
        sample = bert[i]
        first, end, _ = bert.samples_mapping[i]
        sentences = [s[j] for j in range(first, end)]
        assert sample["labels"].tolist() == [-1] * 7 and sample["loss_mask"].sum() == 0
        n = int(sample["padding_mask"].sum())
        text, types = sample["text"][:n].tolist(), sample["types"][:n].tolist()
        assert text[0] == CLS and text[-1] == SEP and text.count(SEP) == 2
        cut = text.index(SEP)
        a, b = text[1:cut], text[cut + 1:-1]
        assert types == [0] * (len(a) + 2) + [1] * (len(b) + 1)
        assert sample["text"][n:].tolist() == [PAD] * (7 - n) and sample["types"][n:].tolist() == [PAD] * (7 - n)
        if end - first == 2:             # one cut; the order says whether the pair was swapped
            first_sentence, second_sentence = sentences
            assert (a, b) == ((second_sentence, first_sentence) if sample["is_random"] else tuple(sentences))
            assert not sample["truncated"] and len(a) + len(b) == 4
        else:                            # 9 tokens cut down to 4: A and B are runs of the pair
            assert sample["truncated"] and len(a) + len(b) == 4
            joined = [t for x in sentences for t in x]
            assert all(any(joined[k:k + len(part)] == part for k in range(len(joined))) for part in (a, b) if part)


def test_samples_mapping_equals_megatrons_helper():
    """Megatron-LM's helpers.build_mapping (C++), run by tests/fixtures/make_megatron_bert_mapping.py."""
    fixture = np.load(FIXTURES / "megatron_bert_mapping.npz")
    cases = sorted(k[:-len("_params")] for k in fixture.files if k.endswith("_params"))
    assert len(cases) >= 4
    for case in cases:
        _, max_num_samples, max_seq_length, short_seq_milli, seed, min_num_sent = fixture[case + "_params"].tolist()
        ours = build_samples_mapping(fixture["docs"], fixture["sizes"], int(max_num_samples), int(max_seq_length),
                                     short_seq_milli / 1000.0, int(seed), int(min_num_sent))
        np.testing.assert_array_equal(ours, fixture[case + "_mapping"].astype(np.int64), err_msg=case)


def test_mt19937_64_is_cpps():
    """The 10000th output of a default-seeded std::mt19937_64 (5489) is 9981545732273789042, as the
    C++ standard requires ([rand.predef])."""
    gen = MT19937_64(5489)
    values = [gen.next() for _ in range(10000)]
    assert values[-1] == 9981545732273789042


@pytest.mark.parametrize("binary_head,seed,seq_length", [(True, 1234, 64), (False, 7, 40), (True, 99, 24)])
def test_samples_equal_megatrons_sample_building(tmp_path, binary_head, seed, seq_length):
    """Each sample equals the line-by-line port of Megatron's build_training_sample, drawn from the
    same RandomState(seed + index)."""
    rng = np.random.RandomState(0)
    ds = write_corpus(str(tmp_path / "c"), random_documents(rng, 80))
    cfg = config(seq_length, seed=seed, binary_head=binary_head, data_cache_path=str(tmp_path / "cache"))
    bert = BertDataset(ds, "train", np.arange(80), 300, cfg)
    vocab_ids = list(VOCAB)
    for i in range(len(bert)):
        first, end, target = (int(v) for v in bert.samples_mapping[i])
        expected = megatron.bert_training_sample(
            [ds[j].tolist() for j in range(first, end)], target, seq_length, vocab_ids, VOCAB, CLS, SEP, MASK, PAD,
            0.15, np.random.RandomState(seed + i), binary_head)
        got = bert[i]
        for key, value in expected.items():
            np.testing.assert_array_equal(got[key], value, err_msg=f"sample {i} {key}")


def test_masking_statistics(tmp_path):
    """Over many samples: about --mask-prob of the tokens are predicted (whole words and the cap of
    mask-prob x target length keep it a little below), of them 80% [MASK], 10% a random id, 10% kept;
    [CLS]/[SEP]/padding never."""
    rng = np.random.RandomState(1)
    ds = write_corpus(str(tmp_path / "c"), random_documents(rng, 400))
    bert = BertDataset(ds, "train", np.arange(400), 2000, config(128, data_cache_path=str(tmp_path / "cache")))
    predicted = tokens = masked = kept = 0
    for i in range(2000):
        sample = bert[i]
        where = sample["loss_mask"] > 0
        assert (sample["labels"] >= 0).tolist() == where.tolist()
        assert not set(sample["labels"][where].tolist()) & {CLS, SEP, PAD}
        predicted += int(where.sum())
        tokens += int(sample["padding_mask"].sum())
        masked += int((sample["text"][where] == MASK).sum())
        kept += int((sample["text"][where] == sample["labels"][where]).sum())
    assert 0.13 < predicted / tokens <= 0.15, predicted / tokens
    assert masked / predicted == pytest.approx(0.8, abs=0.015)
    assert kept / predicted == pytest.approx(0.1 + 0.1 / 390, abs=0.015)      # kept, or drawn equal by chance
    assert (predicted - masked - kept) / predicted == pytest.approx(0.1, abs=0.015)


def test_cache_reuse_and_seed(tmp_path):
    rng = np.random.RandomState(2)
    ds = write_corpus(str(tmp_path / "c"), random_documents(rng, 50))
    cfg = config(48, data_cache_path=str(tmp_path / "cache"))
    first = BertDataset(ds, "train", np.arange(50), 100, cfg)
    again = BertDataset(ds, "train", np.arange(50), 100, cfg)
    assert first.built_cache and not again.built_cache and first.cache_key == again.cache_key
    np.testing.assert_array_equal(first.samples_mapping, again.samples_mapping)
    for key, value in first[5].items():
        np.testing.assert_array_equal(again[5][key], value)
    other = BertDataset(ds, "train", np.arange(50), 100, config(48, seed=5, data_cache_path=str(tmp_path / "cache")))
    assert other.built_cache and other.cache_key != first.cache_key
    assert not np.array_equal(other.samples_mapping, first.samples_mapping)
    assert len(first) >= 100           # whole epochs


def test_builder_splits_documents_and_blends(tmp_path):
    """--split cuts a BERT corpus by documents; weighted --data-path blends two corpora."""
    rng = np.random.RandomState(3)
    a = str(tmp_path / "a_text_sentence")
    write_corpus(a, random_documents(rng, 100))
    b = str(tmp_path / "b_text_sentence")
    write_corpus(b, random_documents(rng, 60))
    cfg = config(48, data_cache_path=str(tmp_path / "cache"))
    train, valid, test = build_train_valid_test_datasets(cfg, [200, 40, 0], data_path=[a], split="90,10,0",
                                                         build_on_this_rank=True)
    assert isinstance(train, BertDataset) and test is None
    assert train.samples_mapping.max(axis=0)[1] <= IndexedDataset(a).document_indices[90]
    assert valid.samples_mapping[:, 0].min() >= IndexedDataset(a).document_indices[90]
    blend, _, _ = build_train_valid_test_datasets(cfg, [100, 0, 0], data_path=["0.7", a, "0.3", b], split="1",
                                                  build_on_this_rank=True)
    assert len(blend) == 100 and set(blend[0]) == set(train[0])
