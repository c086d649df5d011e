"""Classification metrics from a confusion matrix (pure NumPy).

Distributed evaluation is exact because everything derives from counts: each
rank builds its local confusion matrix, the ranks sum them (all-reduce SUM),
and the metrics below are computed once from the total. Conventions follow
scikit-learn: a zero denominator gives 0.0, and macro F1 averages over every
class in the label set.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np


def confusion_matrix(labels: np.ndarray, predictions: np.ndarray, num_classes: int) -> np.ndarray:
    """Counts ``cm[true, predicted]`` as int64 ``[num_classes, num_classes]``."""
    labels = np.asarray(labels, dtype=np.int64).ravel()
    predictions = np.asarray(predictions, dtype=np.int64).ravel()
    if labels.shape != predictions.shape:
        raise ValueError(f"labels and predictions differ in length ({labels.size} vs {predictions.size})")
    for name, values in (("labels", labels), ("predictions", predictions)):
        if values.size and (values.min() < 0 or values.max() >= num_classes):
            raise ValueError(f"{name} must be in [0, {num_classes}) (got {values.min()}..{values.max()})")
    flat = np.bincount(labels * num_classes + predictions, minlength=num_classes * num_classes)
    return flat.reshape(num_classes, num_classes).astype(np.int64)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    return np.divide(num, den, out=np.zeros_like(num), where=den > 0)


def per_class(cm: np.ndarray) -> dict[str, np.ndarray]:
    """Precision, recall, F1 and support per class (arrays indexed by class)."""
    cm = np.asarray(cm, dtype=np.int64)
    tp = np.diag(cm)
    predicted = cm.sum(axis=0)
    support = cm.sum(axis=1)
    precision = _ratio(tp, predicted)
    recall = _ratio(tp, support)
    f1 = _ratio(2 * precision * recall, precision + recall)
    return {"precision": precision, "recall": recall, "f1": f1, "support": support}


def accuracy(cm: np.ndarray) -> float:
    cm = np.asarray(cm)
    total = cm.sum()
    return float(np.trace(cm) / total) if total else 0.0


def macro_f1(cm: np.ndarray) -> float:
    return float(per_class(cm)["f1"].mean())


def report(cm: np.ndarray, label_names: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """JSON-ready summary: accuracy, macro F1, per-class metrics, the matrix and record count."""
    cm = np.asarray(cm, dtype=np.int64)
    names = list(label_names) if label_names is not None else [str(i) for i in range(cm.shape[0])]
    if len(names) != cm.shape[0]:
        raise ValueError(f"{len(names)} label names for a {cm.shape[0]}-class confusion matrix")
    stats = per_class(cm)
    return {
        "records": int(cm.sum()),
        "accuracy": accuracy(cm),
        "macro_f1": macro_f1(cm),
        "per_class": {
            name: {"precision": float(stats["precision"][i]), "recall": float(stats["recall"][i]),
                   "f1": float(stats["f1"][i]), "support": int(stats["support"][i])}
            for i, name in enumerate(names)
        },
        "confusion_matrix": cm.tolist(),
    }
