"""Sequence classification: data files and label map, encoding, metrics, --pretrained-checkpoint,
and `--task sequence_classification` end to end (best checkpoint, exact resume mid-epoch, evaluating
a saved classifier with --skip-train and --predictions-file), metrics under data parallelism."""
import contextlib
import io
import json
import math
import os
import re
from argparse import Namespace

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from rapidgpt.arguments import parse_args
from rapidgpt.data.classification import (ClassificationDataError, ClassificationDataset, Example,
                                          classification_datasets, label_names, read_examples, write_predictions)
from rapidgpt.tasks.pretraining import main as pretrain_main
from rapidgpt.tasks.sequence_classification import main as classify_main
from rapidgpt.training.checkpoint_files import BEST, CheckpointError, iteration_dir, read_metadata
from rapidgpt.training.checkpointing import load_pretrained_weights, save_checkpoint
from rapidgpt.training import finetuner
from rapidgpt.training.finetuner import DataParallelMetrics
from rapidgpt.training.metrics import Predictions, classification_metrics, evaluate_classification, predict_classes


class CharTokenizer:
    """One id per character; end-of-document is 0."""
    eod = 0

    def tokenize(self, text):
        return [ord(c) for c in text]


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


# ---- data files --------------------------------------------------------------------------------

def test_jsonl_texts_pairs_and_labels(tmp_path):
    path = write(tmp_path / "d.jsonl", '{"text": "one", "label": "pos"}\n\n'
                                       '{"text_a": "a", "text_b": "b", "label": 1, "id": 7}\n')
    assert read_examples(path) == [Example("one", None, "pos", f"{path}:1"), Example("a", "b", "1", f"{path}:3")]


def test_tsv_with_a_header(tmp_path):
    path = write(tmp_path / "d.tsv", "id\ttext_a\ttext_b\tlabel\n7\tthe cat\tit sleeps\tentailment\n"
                                     "8\ta\tb\t contradiction\r\n")
    assert read_examples(path) == [Example("the cat", "it sleeps", "entailment", f"{path}:2"),
                                   Example("a", "b", "contradiction", f"{path}:3")]


def test_label_map_is_stable():
    assert label_names(["10", "2", "1", "2"]) == ["1", "2", "10"]          # integers: numeric order
    assert label_names(["pos", "neg", "10"]) == ["10", "neg", "pos"]


@pytest.mark.parametrize("name, content, message", [
    ("d.jsonl", '{"text": "a", "label": 0}\n{"label": 1}\n', r"d.jsonl:2: no 'text' \(or 'text_a' and 'text_b'\) field"),
    ("d.jsonl", '{"text": "a"}\n', r"d.jsonl:1: no 'label' field"),
    ("d.jsonl", '{"text": "a", "label": 0}\n{"text": "b", "label": 1.5}\n',
     r"d.jsonl:2: the label must be a string or an integer, got 1.5"),
    ("d.jsonl", '{"text": "a", "label": 0}\n{"text": "b", "label": 0\n', r"d.jsonl:2: not valid JSON"),
    ("d.jsonl", '["a", 0]\n', r"d.jsonl:1: expected a JSON object, got list"),
    ("d.jsonl", "\n\n", r"--data-path .*d.jsonl: no examples in the file"),
    ("d.tsv", "sentence\tlabel\nx\t0\n", r"d.tsv:1: the header must name a 'label' column and a 'text' column"),
    ("d.tsv", "text\tlabel\nx\t0\ny\n", r"d.tsv:3: 1 tab-separated fields, the header has 2"),
    ("d.tsv", "text\tlabel\nx\t \n", r"d.tsv:2: empty label"),
    ("d.csv", "text,label\n", r"--data-path .*d.csv: unknown format '.csv'; give a .jsonl or .tsv file"),
])
def test_bad_files_name_the_file_and_line(tmp_path, name, content, message):
    with pytest.raises(ClassificationDataError, match=message):
        read_examples(write(tmp_path / name, content))


def test_missing_file(tmp_path):
    with pytest.raises(ClassificationDataError, match=r"--valid-data-path .*nope.tsv: no such file"):
        read_examples(str(tmp_path / "nope.tsv"), "--valid-data-path")


def test_datasets_label_map_from_training_or_checkpoint(tmp_path):
    train = write(tmp_path / "train.jsonl", '{"text": "a", "label": "pos"}\n{"text": "b", "label": "neg"}\n')
    valid = write(tmp_path / "valid.tsv", "text\tlabel\nc\tneg\nd\tneutral\n")
    args = Namespace(data_path=[train], train_data_path=None, valid_data_path=None, test_data_path=None,
                     labels=None, num_classes=None, seq_length=8)
    train_ds, valid_ds, test_ds = classification_datasets(args, CharTokenizer())
    assert args.labels == ["neg", "pos"] and args.num_classes == 2 and (valid_ds, test_ds) == (None, None)
    assert [train_ds[i]["label"] for i in range(2)] == [1, 0]
    args.valid_data_path, args.labels = [valid], None
    with pytest.raises(ClassificationDataError, match=r"valid.tsv:3: label 'neutral' does not occur in the "
                                                      r"training data \(neg, pos\)"):
        classification_datasets(args, CharTokenizer())
    args.labels, args.valid_data_path = ["x", "pos"], None            # as restored from a checkpoint
    with pytest.raises(ClassificationDataError, match=r"train.jsonl:2: label 'neg' does not occur in the label "
                                                      r"map of the checkpoint"):
        classification_datasets(args, CharTokenizer())
    args.labels, args.num_classes = None, 3
    with pytest.raises(ClassificationDataError, match=r"--num-classes 3, but the training data has 2 labels"):
        classification_datasets(args, CharTokenizer())
    # Evaluating a checkpoint: no training data, the checkpoint's label map.
    args.data_path, args.valid_data_path, args.labels, args.num_classes = None, [valid], None, None
    with pytest.raises(ClassificationDataError, match=r"no label map: give the training data"):
        classification_datasets(args, CharTokenizer())
    args.labels = ["neg", "neutral", "pos"]
    train_ds, valid_ds, _ = classification_datasets(args, CharTokenizer())
    assert train_ds is None and [valid_ds[i]["label"] for i in range(2)] == [0, 1] and args.num_classes == 3


def test_encoding_layout_and_truncation():
    examples = [Example("abc", None, "y", "f:1"), Example("abcdefgh", None, "n", "f:2"),
                Example("ab", "cd", "y", "f:3"), Example("abcdefg", "xy", "n", "f:4")]
    ds = ClassificationDataset(examples, ["n", "y"], CharTokenizer(), seq_length=6)
    a, b, c, d, x, y = (ord(ch) for ch in "abcdxy")
    samples = [ds[i] for i in range(4)]
    assert samples[0]["tokens"].tolist() == [a, b, c, 0, 0, 0] and samples[0]["last_index"] == 3
    assert samples[1]["tokens"].tolist() == [a, b, c, d, ord("e"), 0] and samples[1]["last_index"] == 5
    assert samples[2]["tokens"].tolist() == [a, b, 0, c, d, 0] and samples[2]["last_index"] == 5
    assert samples[3]["tokens"].tolist() == [a, b, 0, x, y, 0]          # the longer text is cut first
    assert [s["label"] for s in samples] == [1, 0, 1, 0] and ds.truncated == 2
    assert samples[0]["position_ids"].tolist() == list(range(6))
    assert {k: v.dtype for k, v in samples[0].items()} == {k: np.int32 for k in samples[0]}


# ---- metrics -----------------------------------------------------------------------------------

def test_accuracy_and_macro_f1_by_hand():
    labels = [0, 0, 0, 1, 1, 2]
    predictions = [0, 0, 1, 1, 0, 0]               # class 2 is never predicted
    # class 0: TP 2, FP 2, FN 1 -> 4/7; class 1: TP 1, FP 1, FN 1 -> 1/2; class 2: TP 0, FN 1 -> 0
    metrics = classification_metrics(predictions, labels)
    assert metrics["accuracy"] == pytest.approx(3 / 6)
    assert metrics["f1"] == pytest.approx((4 / 7 + 1 / 2 + 0) / 3)
    assert classification_metrics([1, 1], [1, 1]) == {"accuracy": 1.0, "f1": 1.0}
    batches = [{"label": np.array(labels[i:i + 4]).view(HostTensor),
                "logits": np.eye(3)[predictions[i:i + 4]].view(HostTensor)} for i in (0, 4)]
    assert evaluate_classification(lambda batch: batch["logits"], batches) == metrics


class HostTensor(np.ndarray):
    """A numpy array with Tensor's `asnumpy()`: no MindSpore kernel may run before the first
    RapidGPTEngine of the process (it sets the CPU thread count, which must come first)."""

    def asnumpy(self):
        return self.view(np.ndarray)


def two_rank_gather(run, equal_batches=False):
    """`run(loader, gather)` as data-parallel rank 0 of 2 sees it: the loaders of a 10-sample set
    split over 2 ranks by EvalDataLoader (micro batch 2; with `equal_batches`, as under ZeRO-3,
    rank 1 ends with a padding batch of sample 0); rank 1's arrays are recorded from a first run
    and appended to rank 0's by the fake gather, as the collective does."""
    def loader(rank):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(finetuner, "get_data_parallel_rank", lambda: rank)
            patch.setattr(finetuner, "get_data_parallel_world_size", lambda: 2)
            return finetuner.EvalDataLoader(list(range(10)), 2, None, equal_batches=equal_batches)

    rank_0, rank_1 = loader(0), loader(1)
    assert rank_0.indices.tolist() == [0, 1, 4, 5, 8, 9] and rank_1.indices.tolist() == [2, 3, 6, 7]
    assert (rank_0.num_samples, rank_1.num_samples, len(rank_0), len(rank_1)) == (6, 4, 3, 2 + equal_batches)
    assert list(rank_1.sampler)[-1] == ([0] if equal_batches else [6, 7])
    recorded = []
    run(rank_1, lambda values: recorded.append(values) or values)
    rank_1_values = iter(recorded)
    return run(rank_0, lambda values: np.concatenate([values, next(rank_1_values)]))


class HostBatches:
    """An EvalDataLoader's batches with HostTensors of `logits` and `label` rows of its samples."""

    def __init__(self, loader, logits, labels):
        self.loader, self.logits, self.labels, self.indices = loader, logits, labels, loader.indices
        self.without_padding = loader.without_padding

    def __iter__(self):
        for batch in self.loader.sampler:
            yield {"logits": self.logits[batch].view(HostTensor), "label": self.labels[batch].view(HostTensor)}


@pytest.mark.parametrize("equal_batches", [False, True], ids=["", "zero3-padding"])
def test_predictions_gathered_from_two_ranks_come_in_dataset_order(equal_batches):
    rng = np.random.default_rng(0)
    logits, labels = rng.normal(size=(10, 3)).astype(np.float32), rng.integers(0, 3, 10).astype(np.int32)
    predictions = two_rank_gather(lambda loader, gather: predict_classes(
        lambda batch: batch["logits"], HostBatches(loader, logits, labels), gather), equal_batches)
    assert predictions.classes.tolist() == logits.argmax(axis=-1).tolist()
    assert predictions.labels.tolist() == labels.tolist()
    expected = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(predictions.probabilities, expected, rtol=1e-6)


def test_write_predictions(tmp_path):
    predictions = Predictions(np.array([1, 0]), np.array([[0.25, 0.75], [0.9, 0.1]], np.float32), np.array([0, 0]))
    path = tmp_path / "p.jsonl"
    write_predictions(str(path), predictions, ["négatif", "positive"])
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert lines == [{"index": 0, "prediction": "positive", "label": "négatif",
                      "probabilities": {"négatif": 0.25, "positive": 0.75}},
                     {"index": 1, "prediction": "négatif", "label": "négatif",
                      "probabilities": {"négatif": 0.9, "positive": 0.1}}]
    assert os.listdir(tmp_path) == ["p.jsonl"]


class Warnings:
    def __init__(self):
        self.messages = []

    def warning(self, message):
        self.messages.append(message)


def test_metrics_that_differ_between_data_parallel_ranks_are_combined_and_reported_once():
    # Rank 0 evaluated 6 samples, 4 right; rank 1 evaluated 4, all right: 8/10 over the set.
    logger = Warnings()
    ranks = DataParallelMetrics(lambda row: np.concatenate([row, [[4, 1.0, 0.5]]]), logger)
    assert ranks.agree({"accuracy": 4 / 6, "f1": 0.5}, 6) == pytest.approx({"accuracy": 0.8, "f1": 0.5})
    (message,) = logger.messages
    assert "accuracy: rank 0 0.666667, rank 1 1.000000; samples evaluated: rank 0 6, rank 1 4" in message
    assert "f1:" not in message                                       # equal on both ranks
    assert ("run_compute_metrics sees 1/DP of the validation set on each data-parallel rank; gather "
            "predictions/labels with self.gather(...) before computing metrics") in message
    assert "not for metrics like F1" in message
    assert ranks.agree({"accuracy": 0.5, "f1": 0.5}, 6) == pytest.approx({"accuracy": 0.7, "f1": 0.5})
    assert len(logger.messages) == 1                                  # once per run
    # A rank without samples does not count; equal values (gathered metrics) are kept as they are.
    empty = DataParallelMetrics(lambda row: np.concatenate([row, [[0, np.nan]]]), Warnings())
    assert empty.agree({"accuracy": 0.25}, 8) == {"accuracy": 0.25}
    logger = Warnings()
    same = DataParallelMetrics(lambda row: np.concatenate([row, [[4, 1 / 3]]]), logger)
    assert same.agree({"accuracy": 1 / 3}, 6) == {"accuracy": 1 / 3} and logger.messages == []


@pytest.mark.parametrize("equal_batches", [False, True], ids=["", "zero3-padding"])
def test_the_ranks_weighted_accuracy_is_the_accuracy_of_the_whole_set(equal_batches):
    rng = np.random.default_rng(1)
    logits, labels = rng.normal(size=(10, 3)).astype(np.float32), rng.integers(0, 3, 10).astype(np.int32)

    def run(loader, gather):          # a run_compute_metrics that does not gather, then the engine's check
        metrics = evaluate_classification(lambda batch: batch["logits"], HostBatches(loader, logits, labels))
        return DataParallelMetrics(gather, Warnings()).agree(metrics, loader.num_samples)

    assert two_rank_gather(run, equal_batches)["accuracy"] == pytest.approx(np.mean(logits.argmax(axis=-1) == labels))


# ---- --pretrained-checkpoint: weights only, name prefix, report ---------------------------------

class Pretrained(nn.Cell):
    def __init__(self):
        super().__init__()
        self.body = nn.Dense(3, 4)
        self.lm_head = nn.Dense(4, 5)


class Backbone(nn.Cell):
    def __init__(self, body_in):
        super().__init__()
        self.body = nn.Dense(body_in, 4)


class Classifier(nn.Cell):
    def __init__(self, body_in=3):
        super().__init__()
        self.backbone = Backbone(body_in)
        self.head = nn.Dense(4, 2)


def test_pretrained_weights_load_under_a_prefix_and_report_new_and_unused(tmp_path):
    args = Namespace(save=str(tmp_path / "pre"), ckpt_format="ckpt", no_save_optim=True, no_save_rng=True,
                     keep_last_n_checkpoints=None)
    pretrained = Pretrained()
    save_checkpoint(args, 3, 0, pretrained, None, None)
    model = Classifier()
    head_before = model.head.weight.asnumpy().copy()
    report = load_pretrained_weights(args.save, model)
    assert report.loaded == ["backbone.body.bias", "backbone.body.weight"]
    assert report.initialised == ["head.bias", "head.weight"]
    assert report.unused == ["lm_head.bias", "lm_head.weight"]
    np.testing.assert_array_equal(model.backbone.body.weight.asnumpy(), pretrained.body.weight.asnumpy())
    np.testing.assert_array_equal(model.head.weight.asnumpy(), head_before)
    with pytest.raises(CheckpointError, match=r": body.weight has shape \(4, 3\), the model's backbone.body.weight has \(4, 5\)"):
        load_pretrained_weights(args.save, Classifier(body_in=5))
    with pytest.raises(CheckpointError, match=r"--pretrained-checkpoint .*: no complete checkpoint found"):
        load_pretrained_weights(str(tmp_path / "empty"), model)


# ---- the black-box task ------------------------------------------------------------------------

POSITIVE = "good great excellent happy love wonderful nice best".split()
NEGATIVE = "bad awful terrible sad hate horrible poor worst".split()
FILLER = "the movie was and a plot actor it is this very really film story of".split()
LOSS_LINE = re.compile(r" iteration\s+(\d+)/.*?\| loss: ([\d.E+-]+) \|.*grad norm: ([\d.]+).*samples per second")
VALIDATION_LINE = re.compile(r"validation at epoch (\d+) \(iteration (\d+)\) \| accuracy: ([\d.]+) \| f1: ([\d.]+) \|")


def reviews(path, size, seed):
    """Learnable jsonl: two words of the label's sentiment among five filler words."""
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for _ in range(size):
            label = ["negative", "positive"][rng.integers(2)]
            words = list(rng.choice(POSITIVE if label == "positive" else NEGATIVE, 2, replace=False))
            words += list(rng.choice(FILLER, 5, replace=False))
            rng.shuffle(words)
            f.write(json.dumps({"text": " ".join(words), "label": label}) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A tiny GPT pretrained for a few iterations on the demo corpus, saved under A."""
    os.environ["RAPIDGPT_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    save = str(tmp_path_factory.mktemp("pretrained"))
    assert pretrain_main(["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
                          "--seq-length", "32", "--micro-batch-size", "4", "--train-iters", "6", "--lr", "2e-3",
                          "--eval-iters", "0", "--max-new-tokens", "0", "--no-progress-bar", "--save", save]) == 0
    yield save
    os.environ.pop("RAPIDGPT_CACHE_DIR", None)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reviews")
    return {"train": reviews(folder / "train.jsonl", 128, 1), "valid": reviews(folder / "valid.jsonl", 64, 2)}


def run_task(*argv):
    """`rapidgpt --task sequence_classification ARGV` in this process -> what it printed."""
    with contextlib.redirect_stdout(io.StringIO()) as out:
        status = classify_main(["--task", "sequence_classification", *argv])
    assert status == 0, out.getvalue()
    return out.getvalue()


def classify(pretrained, data, *argv):
    """Finetune the pretrained GPT on the reviews -> (losses, validations, printed output)."""
    out = run_task("--pretrained-checkpoint", pretrained, "--data-path", data["train"], "--valid-data-path",
                   data["valid"], "--micro-batch-size", "8", "--global-batch-size", "16", "--lr", "3e-3",
                   "--log-interval", "1", "--no-progress-bar", "--hidden-dropout", "0", "--attention-dropout", "0",
                   *argv)
    losses = {int(m.group(1)): (m.group(2), m.group(3)) for m in LOSS_LINE.finditer(out)}
    validations = {int(m.group(2)): (m.group(3), m.group(4)) for m in VALIDATION_LINE.finditer(out)}
    return losses, validations, out


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, pretrained, data):
    """3 epochs from the pretrained GPT, saved every 8 iterations, then the test set -> (the --save
    folder, its best iteration, (losses, validations, printed output))."""
    save = str(tmp_path_factory.mktemp("finetuned") / "ckpt")
    run = classify(pretrained, data, "--epochs", "3", "--save", save, "--save-interval", "8", "--test-data-path",
                   data["valid"])
    accuracies = {iteration: float(accuracy) for iteration, (accuracy, _) in run[1].items()}
    return save, max(accuracies, key=lambda it: (accuracies[it], -it)), run          # the first best epoch


def model_tensors(checkpoint_dir):
    """The model's tensors (not the optimizer's) of a checkpoint directory, as numpy."""
    rank_dir = os.path.join(checkpoint_dir, "mp_rank_00")
    with open(os.path.join(rank_dir, "state.json")) as f:
        names = json.load(f)["model_parameters"]
    saved = ms.load_checkpoint(os.path.join(rank_dir, "model_optim_rng.ckpt"))
    return {name: saved[name].asnumpy() for name in names}


def test_finetune_from_a_pretrained_gpt_keeps_the_best_epoch(finetuned):
    save, best_iteration, (losses, validations, out) = finetuned
    assert "labels 0=negative, 1=positive" in out
    assert re.search(r"loaded 28 of the model's 30 parameters from --pretrained-checkpoint .* into 'backbone.'", out)
    assert "newly initialised (not in the checkpoint): head.bias, head.weight" in out
    assert "unused checkpoint tensors: none" in out
    assert sorted(losses) == list(range(1, 25)) and sorted(validations) == [8, 16, 24]
    first, last = (np.mean([float(losses[i][0]) for i in part]) for part in (range(1, 5), range(21, 25)))
    assert last < first - 0.2, out
    accuracies = {iteration: float(acc) for iteration, (acc, _) in validations.items()}
    assert max(accuracies.values()) > 0.8 and accuracies[best_iteration] == max(accuracies.values()), out
    best = read_metadata(iteration_dir(os.path.join(save, BEST), best_iteration))
    assert best["best"] == {"metric": "accuracy", "value": accuracies[best_iteration],
                            "epoch": best_iteration / 8, "iteration": best_iteration}
    assert best["model"]["labels"] == ["negative", "positive"]
    assert sorted(os.listdir(os.path.join(save, BEST))) == ["iter_%07d" % best_iteration,
                                                            "latest_checkpointed_iteration.txt"]
    kept, regular = (model_tensors(iteration_dir(d, best_iteration)) for d in (os.path.join(save, BEST), save))
    assert sorted(kept) == sorted(regular) and "head.weight" in kept
    for name in kept:
        np.testing.assert_array_equal(kept[name], regular[name])
    assert f"best validation accuracy: {accuracies[best_iteration]:.6f} at epoch {best_iteration // 8}" in out
    assert re.search(r"test at the end of training \(iteration 24\) \| accuracy: [\d.]+ \| f1: [\d.]+ \|", out), out


def test_finetuning_resumes_mid_epoch_exactly(tmp_path, finetuned, pretrained, data):
    """Stopped at iteration 5 (epoch 1 of 3, 8 iterations each) and resumed: the uninterrupted run is
    the `finetuned` one (its --save-interval and test set change no number)."""
    _, _, (full, full_validations, _) = finetuned
    save = str(tmp_path / "finetuned")
    first, _, out = classify(pretrained, data, "--epochs", "3", "--load", save, "--save", save,
                             "--exit-interval", "5")
    assert "no checkpoint under --load" in out and "starting from --pretrained-checkpoint" in out
    resumed, validations, out = classify(pretrained, data, "--epochs", "3", "--load", save,
                                         "--save", save)
    assert f"loaded checkpoint from {save} at iteration 5" in out and "--pretrained-checkpoint" not in out
    assert sorted(first) == [1, 2, 3, 4, 5] and sorted(resumed) == list(range(6, 25))
    assert {i: full[i] for i in range(1, 6)} == first
    assert {i: full[i] for i in range(6, 25)} == resumed                 # loss and grad norm, to the digit
    assert validations == full_validations and sorted(validations) == [8, 16, 24]


def test_fp16_finetuning_with_recompute_and_zero_3_learns_as_fp32_does(pretrained, data):
    """--task sequence_classification --fp16 --zero-3-memory-optimization (one process: each
    parameter one piece): the pretrained fp32 weights go into the fp32 main copies of the pieces, the
    classifier trains in fp16 (with recompute on) and reaches the fp32 run's accuracy. (ZeRO-3 against
    the unsharded run: tests/test_zero.py; a ZeRO-3 classifier evaluates its checkpoint exactly below.)"""
    losses, validations, out = classify(pretrained, data, "--epochs", "3", "--fp16", "--initial-loss-scale", "4096",
                                        "--checkpoint-activations", "--zero-3-memory-optimization")
    assert "(ZeRO stage 3: 1/1 of each layer's parameters)" in out
    assert re.search(r"loaded 28 of the model's 30 parameters from --pretrained-checkpoint", out)
    assert sorted(validations) == [8, 16, 24] and max(float(a) for a, _ in validations.values()) > 0.8, out
    assert all(math.isfinite(float(loss)) for loss, _ in losses.values())


@pytest.mark.parametrize("zero", [(), ("--zero-3-memory-optimization",)], ids=["", "zero3"])
def test_a_finetuned_classifier_is_evaluated_without_training_data(tmp_path, finetuned, data, zero):
    """Also with ZeRO-3, whose model (one process: one piece per parameter) has no optimizer to load
    the checkpoint's whole tensors through."""
    save, best_iteration, (_, validations, _) = finetuned
    accuracy, f1 = validations[best_iteration]
    predictions = tmp_path / "predictions.jsonl"
    out = run_task("--load", os.path.join(save, BEST), "--skip-train", "--valid-data-path", data["valid"],
                   "--predictions-file", str(predictions), "--no-progress-bar", *zero)
    assert "labels 0=negative, 1=positive" in out and "--skip-train: weights only" in out
    evaluation = re.search(rf"validation of the --load checkpoint \(iteration {best_iteration}\) \| accuracy: "
                           rf"([\d.]+) \| f1: ([\d.]+) \|", out)
    assert evaluation and evaluation.groups() == (accuracy, f1), out
    lines = [json.loads(line) for line in predictions.read_text().splitlines()]
    with open(data["valid"]) as f:
        assert [line["label"] for line in lines] == [json.loads(example)["label"] for example in f]
    assert [line["index"] for line in lines] == list(range(64))
    assert np.mean([line["prediction"] == line["label"] for line in lines]) == float(accuracy)
    for line in lines:
        probabilities = line["probabilities"]
        assert list(probabilities) == ["negative", "positive"]
        assert sum(probabilities.values()) == pytest.approx(1, abs=1e-5)         # each rounded to 6 decimals
        assert line["prediction"] == max(probabilities, key=probabilities.get)


@pytest.mark.parametrize("argv, message", [
    ([], "--task sequence_classification needs the training data; give --data-path TRAIN.jsonl|.tsv (or "
         "--skip-train --load DIR to evaluate)"),
    (["--data-path", "t.jsonl"], "--epochs: --task sequence_classification needs --epochs N (or --train-iters)"),
    (["--data-path", "t.jsonl", "--train-data", "u.jsonl", "--epochs", "1"],
     "--train-data-path: give the training data with --data-path or --train-data-path, not both"),
    (["--data-path", "t.jsonl", "--epochs", "1", "--best-metric", "loss"],
     "loss: sequence_classification reports accuracy and f1"),
    (["--data-path", "t.jsonl", "--epochs", "1", "--num-classes", "1"], "--num-classes: must be >= 2, got 1"),
])
def test_task_flag_errors(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv=["--task", "sequence_classification", *argv])
    assert message in capsys.readouterr().err


def test_pretrained_checkpoint_flags(pretrained, tmp_path):
    args = parse_args(argv=["--pretrained-checkpoint", pretrained, "--seq-length", "16"])
    assert (args.num_layers, args.hidden_size, args.seq_length) == (2, 32, 16)
    assert args.tokenizer_type == "GPT2BPETokenizer"
    with pytest.raises(SystemExit):
        parse_args(argv=["--pretrained-checkpoint", pretrained, "--num-layers", "3"])
    with pytest.raises(SystemExit):
        parse_args(argv=["--pretrained-checkpoint", str(tmp_path)])
    # --load with a checkpoint wins; an empty --load falls back to the pretrained checkpoint.
    assert parse_args(argv=["--load", str(tmp_path), "--pretrained-checkpoint", pretrained]).hidden_size == 32
