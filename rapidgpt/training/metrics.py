"""Evaluation metrics computed from gathered predictions (numpy, on every rank alike)."""
from typing import NamedTuple

import numpy as np


def classification_metrics(predictions, labels):
    """Accuracy and macro-F1 of class ids `predictions [n]` against `labels [n]`.

    Macro-F1 is the mean, over every class that occurs in the labels or the predictions
    (scikit-learn's default), of F1_c = 2 TP_c / (2 TP_c + FP_c + FN_c); a class that is never
    predicted correctly counts 0.
    """
    predictions, labels = np.asarray(predictions).ravel(), np.asarray(labels).ravel()
    if predictions.shape != labels.shape or not len(labels):
        raise ValueError(f"need as many predictions as labels (at least one), got {len(predictions)} "
                         f"and {len(labels)}")
    f1 = []
    for c in np.union1d(predictions, labels):
        tp = np.sum((predictions == c) & (labels == c))
        fp_plus_fn = np.sum((predictions == c) != (labels == c))
        f1.append(2 * tp / (2 * tp + fp_plus_fn))
    return {"accuracy": float(np.mean(predictions == labels)), "f1": float(np.mean(f1))}


def _gathered(arrays, gather):
    """This rank's `arrays` concatenated, then `gather`ed over the data-parallel ranks (a rank
    without batches, when the set is smaller than micro batch x DP, adds nothing)."""
    return gather(np.concatenate(arrays) if arrays else np.zeros(0, np.float32))


def evaluate_classification(logits_of, eval_dataloader, gather=np.asarray):
    """`classification_metrics` over an evaluation set: `logits_of(batch)` gives the `[b, classes]`
    logits of each batch (its "label" `[b]` holds the class ids); `gather` (a Finetuner's
    `self.gather`) collects every data-parallel rank's predictions and labels first."""
    predictions, labels = [], []
    for batch in eval_dataloader:
        predictions.append(logits_of(batch).argmax(axis=-1).asnumpy())
        labels.append(batch["label"].asnumpy())
    predictions, labels = _without_padding(eval_dataloader, predictions), _without_padding(eval_dataloader, labels)
    return classification_metrics(_gathered(predictions, gather), _gathered(labels, gather))


def _without_padding(eval_dataloader, results):
    """Per-batch `results` without those of the padding batches a Finetuner's EvalDataLoader adds
    under ZeRO-3 (another iterable of batches has none)."""
    drop = getattr(eval_dataloader, "without_padding", None)
    return drop(results) if drop is not None else results


class Predictions(NamedTuple):
    """A classifier's output over an evaluation set; row i is the set's sample i."""
    classes: np.ndarray          # [n] the predicted class ids (argmax of the logits)
    probabilities: np.ndarray    # [n, classes] float32, softmax of the logits
    labels: np.ndarray           # [n] the true class ids


def predict_classes(logits_of, eval_dataloader, gather=np.asarray):
    """`Predictions` over a Finetuner's evaluation set, in dataset order, on every rank.

    `logits_of` and `gather` as for `evaluate_classification`. The gathered rows come rank after
    rank; `eval_dataloader.indices` (the dataset index of each of this rank's samples), gathered
    alike, puts them back in dataset order.
    """
    classes, probabilities, labels = [], [], []
    for batch in eval_dataloader:
        logits = logits_of(batch).asnumpy().astype(np.float32)
        exp = np.exp(logits - logits.max(axis=-1, keepdims=True))
        classes.append(logits.argmax(axis=-1))
        probabilities.append((exp / exp.sum(axis=-1, keepdims=True)).ravel())     # flat: ranks may have none
        labels.append(batch["label"].asnumpy())
    classes, probabilities, labels = (_without_padding(eval_dataloader, results)
                                      for results in (classes, probabilities, labels))
    order = np.argsort(gather(eval_dataloader.indices), kind="stable")
    labels = _gathered(labels, gather)[order].astype(np.int64)
    probabilities = _gathered(probabilities, gather).reshape(len(labels), -1)[order]
    return Predictions(_gathered(classes, gather)[order].astype(np.int64), probabilities, labels)
