"""Evaluation metrics computed from gathered predictions (numpy, on every rank alike)."""
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


def evaluate_classification(logits_of, eval_dataloader, gather=np.asarray):
    """`classification_metrics` over an evaluation set: `logits_of(batch)` gives the `[b, classes]`
    logits of each batch (its "label" `[b]` holds the class ids); `gather` (a Finetuner's
    `self.gather`) collects every data-parallel rank's predictions and labels first."""
    predictions, labels = [], []
    for batch in eval_dataloader:
        predictions.append(logits_of(batch).argmax(axis=-1).asnumpy())
        labels.append(batch["label"].asnumpy())
    return classification_metrics(gather(np.concatenate(predictions)), gather(np.concatenate(labels)))
