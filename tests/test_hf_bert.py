"""Hugging Face BERT import/export: masked-LM + next-sentence losses, logits and a classifier's logits
equal to transformers', bit-exact round trips, clear errors.

The fixtures tests/fixtures/hf_bert_tiny/ (BertForPreTraining) and hf_bert_tiny_cls/
(BertForSequenceClassification, the same encoder) were written by transformers itself (see
tests/fixtures/make_hf_bert_tiny.py, not run here): every tensor random, vocabulary 200 (padded to
256 inside RapidGPT), the second row padded, with HF's outputs on fixed inputs.
"""
from pathlib import Path

import numpy as np
import pytest
from mindspore import Tensor

import rapidgpt
from rapidgpt.models.bert import build_bert_classifier, bert_loss_func
from rapidgpt.models.hf_files import read_safetensors
from rapidgpt.pretrained import model_args
from rapidgpt.models.hf_bert import hf_folder_model_flags
from rapidgpt.parallel.random import initialize_parameters
from rapidgpt.training.checkpointing import load_pretrained_weights

from hf_conversion import conversion_fixtures

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "hf_bert_tiny"
FIXTURE_CLS = ROOT / "tests" / "fixtures" / "hf_bert_tiny_cls"
convert, expected, converted = conversion_fixtures(FIXTURE, "convert_hf_bert")


def inputs(expected):
    return [Tensor(expected[k].astype(np.int32)) for k in ("input_ids", "attention_mask", "token_type_ids")]


@pytest.mark.parametrize("source", ["hf folder", "converted"])
def test_logits_and_losses_equal_transformers(source, converted, expected):
    model = rapidgpt.load_pretrained(str(FIXTURE if source == "hf folder" else converted))
    assert not model.training and model.vocab_size == 200 and model.padded_vocab_size == 256
    lm_logits, binary_logits = model(*inputs(expected))
    assert lm_logits.shape == (2, 16, 200) and binary_logits.shape == (2, 2)
    np.testing.assert_allclose(lm_logits.asnumpy(), expected["prediction_logits"], rtol=0, atol=1e-5)
    np.testing.assert_allclose(binary_logits.asnumpy(), expected["seq_relationship_logits"], rtol=0, atol=1e-5)
    labels = expected["labels"]              # -100 where not predicted (HF); Megatron's loss mask there
    output = model(*inputs(expected), Tensor(np.maximum(labels, 0).astype(np.int32)))
    loss, stats = bert_loss_func(Tensor((labels >= 0).astype(np.float32)),
                                 Tensor(expected["next_sentence_label"].astype(np.int32)), output)
    assert float(stats["lm loss"]) == pytest.approx(float(expected["mlm_loss"]), abs=1e-5)
    assert float(stats["sop loss"]) == pytest.approx(float(expected["nsp_loss"]), abs=1e-5)
    assert float(loss) == pytest.approx(float(expected["loss"]), abs=1e-5)


def test_padding_changes_nothing_at_real_positions(expected):
    """Keys at padding positions are hidden: the padded row's real tokens compute as without padding."""
    model = rapidgpt.load_pretrained(str(FIXTURE))
    ids, mask, types = inputs(expected)
    full, _ = model(ids, mask, types)
    short, _ = model(ids[1:, :12], mask[1:, :12], types[1:, :12])
    np.testing.assert_allclose(full.asnumpy()[1, :12], short.asnumpy()[0], rtol=0, atol=1e-5)


def test_sequence_classifier_equals_transformers():
    """BertForSequenceClassification's folder loaded as --pretrained-checkpoint into the built-in
    classifier (the encoder, pooler and classifier): transformers' logits."""
    cls_expected = dict(np.load(FIXTURE_CLS / "expected.npz"))
    args = model_args(dict(hf_folder_model_flags(str(FIXTURE_CLS)), num_classes=3))
    model = build_bert_classifier(args, args.vocab_size)
    initialize_parameters(model, args.seed)
    report = load_pretrained_weights(str(FIXTURE_CLS), model)
    assert report.initialised == [] and report.unused == []
    model.set_train(False)
    logits = model(*inputs(cls_expected)).asnumpy()
    np.testing.assert_allclose(logits, cls_expected["logits"], rtol=0, atol=1e-5)
    # A pretraining folder has no classifier: the head starts fresh, the LM and binary heads go unused.
    fresh = build_bert_classifier(args, args.vocab_size)
    report = load_pretrained_weights(str(FIXTURE), fresh)
    assert report.initialised == ["head.bias", "head.weight"]
    assert any(name.startswith("cls.predictions") or name.startswith("lm_head") for name in report.unused)


def test_round_trip_is_bit_exact(tmp_path, converted):
    out = tmp_path / "hf_out"
    assert convert.main(["--to-hf", "--load", str(converted), "--hf-dir", str(out)]) == 0
    original, _ = read_safetensors(str(FIXTURE / "model.safetensors"))
    exported, _ = read_safetensors(str(out / "model.safetensors"))
    assert sorted(exported) == sorted(original)
    for name, value in original.items():
        np.testing.assert_array_equal(exported[name], value, err_msg=name)
    assert (out / "vocab.txt").read_text() == (FIXTURE / "vocab.txt").read_text()
    assert '"do_lower_case": true' in (out / "tokenizer_config.json").read_text()
    # and back again: the same checkpoint tensors
    again = tmp_path / "again"
    assert convert.main(["--hf-dir", str(out), "--save", str(again)]) == 0
    a, b = rapidgpt.load_pretrained(str(converted)), rapidgpt.load_pretrained(str(again))
    for (name, p), (_, q) in zip(a.parameters_and_names(), b.parameters_and_names()):
        np.testing.assert_array_equal(p.asnumpy(), q.asnumpy(), err_msg=name)


def test_checkpoint_records_bert_and_its_tokenizer(converted):
    from rapidgpt.training.checkpoint_files import find_checkpoint, read_metadata
    model = read_metadata(find_checkpoint(str(converted)))["model"]
    assert model["model_type"] == "bert" and model["bert_binary_head"] is True
    assert model["tokenizer_type"] == "BertWordPieceLowerCase" and model["vocab_file"].endswith("vocab.txt")


def test_classifier_folder_converts_with_a_fresh_lm_head_and_says_so(tmp_path, capsys):
    assert convert.main(["--hf-dir", str(FIXTURE_CLS), "--save", str(tmp_path / "c")]) == 0
    err = capsys.readouterr().err
    assert "has no lm_head.dense.bias, lm_head.dense.weight" in err and "seeded initialisation" in err


@pytest.mark.parametrize("edit,message", [
    ({"hidden_act": "relu"}, "hidden_act='relu' is not supported"),
    ({"model_type": "roberta"}, "model_type 'roberta' is not 'bert'"),
    ({"type_vocab_size": 1}, "type_vocab_size=1 is not supported"),
])
def test_unsupported_configs_are_one_line_errors(tmp_path, capsys, edit, message):
    import json
    import shutil
    folder = tmp_path / "hf"
    shutil.copytree(FIXTURE, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(edit)
    (folder / "config.json").write_text(json.dumps(config))
    assert convert.main(["--hf-dir", str(folder), "--save", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("convert_hf_bert.py: error: ") and message in err and err.count("\n") == 1, err


def test_classification_encoding_equals_the_reference_tokenizer():
    """BERT's classification layout ([CLS] A [SEP] B [SEP], token types 0/1, [PAD]) as Hugging Face's
    own (Rust) WordPiece tokenizer encodes the same text and pair."""
    from tokenizers import BertWordPieceTokenizer as Reference
    from rapidgpt.data.classification import BertClassificationDataset, Example
    from rapidgpt.tokenizer import BertWordPieceTokenizer
    reference = Reference(str(FIXTURE / "vocab.txt"), lowercase=True)
    tokenizer = BertWordPieceTokenizer(str(FIXTURE / "vocab.txt"), lower_case=True)
    examples = [Example("The quick brown fox.", None, "a", "x:1"),
                Example("A generator function returns an iterator.", "Each yield hands one value.", "b", "x:2")]
    ds = BertClassificationDataset(examples, ["a", "b"], tokenizer, seq_length=64)
    for sample, example in zip((ds[0], ds[1]), examples):
        expected = reference.encode(example.text_a, example.text_b) if example.text_b else reference.encode(example.text_a)
        n = len(expected.ids)
        assert sample["tokens"][:n].tolist() == expected.ids and set(sample["tokens"][n:].tolist()) == {tokenizer.pad}
        assert sample["types"][:n].tolist() == expected.type_ids and sample["padding_mask"].sum() == n
    short = BertClassificationDataset(examples[1:], ["a", "b"], tokenizer, seq_length=12)
    assert short.truncated == 1 and short[0]["padding_mask"].sum() == 12 and short[0]["tokens"][11] == tokenizer.sep


def test_sequence_classification_finetunes_a_hugging_face_bert_folder(tmp_path):
    """Rapidformer's BERT finetuning from a terminal: --pretrained-model-name-or-path of a local
    Hugging Face BERT folder, sentence pairs from .tsv; the encoder loads, the classifier starts fresh,
    training lowers the loss and validation reports an accuracy above chance. The pairs are
    learnable in 18 steps at lr 5e-3 (measured: loss 0.71 -> 0.54, accuracy 0.94): a "different"
    pair's second text is drawn from other words than the first (with both from one word list and
    lr 1e-3 the tiny model stayed at chance, and its loss rose or fell with the dropout masks)."""
    import subprocess
    import sys
    rng = np.random.RandomState(0)
    words = ["the", "cat", "sleeps", "dog", "runs", "sun", "fox", "jumps", "lazy", "brown"]
    for name, n in (("train", 96), ("dev", 32)):
        rows = ["text_a\ttext_b\tlabel"]
        for _ in range(n):
            a = " ".join(rng.choice(words[:5], 4))
            same = rng.rand() < 0.5
            b = a if same else " ".join(rng.choice(words[5:], 4))
            rows.append(f"{a}\t{b}\t{'same' if same else 'different'}")
        (tmp_path / f"{name}.tsv").write_text("\n".join(rows) + "\n")
    out = subprocess.run(
        [sys.executable, "-m", "rapidgpt.cli", "--task", "sequence_classification",
         "--pretrained-model-name-or-path", str(FIXTURE), "--data-path", str(tmp_path / "train.tsv"),
         "--valid-data-path", str(tmp_path / "dev.tsv"), "--epochs", "3", "--micro-batch-size", "16",
         "--lr", "5e-3", "--seq-length", "32", "--log-interval", "2", "--no-progress-bar"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-3000:]
    assert "newly initialised (not in the checkpoint): head.bias, head.weight" in log
    assert "labels 0=different, 1=same" in log
    losses = [float(v) for v in __import__("re").findall(r"\| loss: ([\d.E+-]+)", log)]
    assert len(losses) >= 4 and losses[-1] < losses[0]
    accuracies = [float(v) for v in __import__("re").findall(r"accuracy: ([\d.]+)", log)]
    assert len(accuracies) >= 3 and accuracies[-1] >= 0.65, accuracies       # 32 pairs: chance is 0.5 +- 0.09
