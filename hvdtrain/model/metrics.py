"""Classification metrics from a confusion matrix (pure NumPy).

Distributed evaluation is exact because everything derives from counts: each
rank builds its local confusion matrix, the ranks sum them (all-reduce SUM),
and the metrics below are computed once from the total. Conventions follow
scikit-learn: a zero denominator gives 0.0, and macro F1 averages over every
class in the label set.

ROC-AUC (binary tasks) follows the same rule: each rank counts its examples in
a fixed grid of score bins per true class (an int64 ``[2, AUC_BINS]``
histogram), the ranks sum the histograms, and the AUC is computed once from
the total. So the distributed value equals the single-process value exactly,
and the all-reduce is a fixed 128 KiB however large the split (gathering every
(score, label) pair instead would grow with the split on every rank). The
score is the logit margin ``logit[1] - logit[0]`` (the log-odds of class 1),
binned uniformly over ``[-AUC_LIMIT, AUC_LIMIT]``: in log-odds, confident
predictions near probability 0 or 1 still fall in different bins. Pairs of a
positive and a negative in the same bin count as ties (1/2, as scikit-learn
counts equal scores), so the result can differ from the exact AUC by at most
:func:`auc_binning_error`, which is reported beside it.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

AUC_BINS = 8192
AUC_LIMIT = 16.0  # log-odds; bin width 2 * 16 / 8192 = 1/256


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


# -- ROC-AUC from score histograms (binary tasks) -------------------------------------

def score_histogram(labels: np.ndarray, scores: np.ndarray, bins: int = AUC_BINS,
                    limit: float = AUC_LIMIT) -> np.ndarray:
    """Counts ``hist[label, bin]`` (int64 ``[2, bins]``) of scores on a uniform grid over ``[-limit, limit]``.

    Scores outside the range count in the end bins; labels must be 0 or 1.
    """
    labels = np.asarray(labels, dtype=np.int64).ravel()
    scores = np.asarray(scores, dtype=np.float64).ravel()
    if labels.shape != scores.shape:
        raise ValueError(f"labels and scores differ in length ({labels.size} vs {scores.size})")
    if labels.size and (labels.min() < 0 or labels.max() > 1):
        raise ValueError(f"ROC-AUC needs binary labels 0/1 (got {labels.min()}..{labels.max()})")
    index = np.clip(np.floor((scores + limit) / (2 * limit) * bins), 0, bins - 1).astype(np.int64)
    index = np.where(np.isnan(scores), bins // 2, index)  # a NaN score says nothing: the middle bin
    flat = np.bincount(labels * bins + index, minlength=2 * bins)
    return flat.reshape(2, bins).astype(np.int64)


def roc_auc_from_histogram(hist: np.ndarray) -> Optional[float]:
    """Area under the ROC curve from ``score_histogram`` counts; None when a class is absent.

    The Mann-Whitney statistic: the fraction of (positive, negative) pairs the
    score orders correctly, a pair in the same bin counting 1/2.
    """
    neg, pos = (np.asarray(h, dtype=np.float64) for h in np.asarray(hist))
    n_neg, n_pos = neg.sum(), pos.sum()
    if n_neg == 0 or n_pos == 0:
        return None
    below = np.cumsum(neg) - neg  # negatives in lower bins
    return float((pos * (below + 0.5 * neg)).sum() / (n_pos * n_neg))


def auc_binning_error(hist: np.ndarray) -> Optional[float]:
    """The most the binned AUC can differ from the exact one (pairs sharing a bin count 1/2)."""
    neg, pos = (np.asarray(h, dtype=np.float64) for h in np.asarray(hist))
    if neg.sum() == 0 or pos.sum() == 0:
        return None
    return float(0.5 * (pos * neg).sum() / (pos.sum() * neg.sum()))


def pr_auc_from_histogram(hist: np.ndarray) -> Optional[float]:
    """Average precision (scikit-learn's ``average_precision_score``) of the binned scores; None without positives.

    Each bin is one threshold, from the highest down: AP = sum over bins of
    (recall gained in the bin) x (precision at the bin). It equals
    scikit-learn's value on the scores rounded to their bins exactly; on the raw
    scores it differs only where positives and negatives share a bin.
    """
    neg, pos = (np.asarray(h, dtype=np.float64)[::-1] for h in np.asarray(hist))
    n_pos = pos.sum()
    if n_pos == 0:
        return None
    tp, fp = np.cumsum(pos), np.cumsum(neg)
    precision = _ratio(tp, tp + fp)
    return float((pos / n_pos * precision).sum())


def binary_counts(labels: np.ndarray, logits: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """(confusion ``[2, 2]`` at probability ``threshold``, logit histogram ``[2, AUC_BINS]``) of 0/1 labels."""
    logits = np.asarray(logits, dtype=np.float64).ravel()
    cut = float(np.log(threshold / (1 - threshold)))  # sigmoid(logit) >= threshold  <=>  logit >= cut
    return confusion_matrix(labels, (logits >= cut).astype(np.int64), 2), score_histogram(labels, logits)


def binary_report(cm: np.ndarray, hist: np.ndarray, log_loss_sum: float, labels: Sequence[str]) -> dict[str, Any]:
    """Binary metrics from summed counts: ROC AUC (with its binning error), PR AUC, log loss, accuracy, F1.

    ``log_loss_sum``: the sum of the unweighted per-example log losses (scikit-learn's ``log_loss`` is
    unweighted whatever class weights training used)."""
    out = report(cm, labels)
    records = int(np.asarray(cm).sum())
    out.update(roc_auc=roc_auc_from_histogram(hist), roc_auc_max_binning_error=auc_binning_error(hist),
               pr_auc=pr_auc_from_histogram(hist), log_loss=log_loss_sum / records if records else 0.0,
               f1=float(per_class(cm)["f1"][1]))
    return out


# -- multilabel: per-label counts --------------------------------------------------------

def multilabel_counts(labels: np.ndarray, logits: np.ndarray, threshold: float) -> dict[str, np.ndarray]:
    """Per-label confusion ``[L, 2, 2]``, per-label logit histograms ``[L, 2, AUC_BINS]`` and exact matches."""
    labels = np.asarray(labels).astype(np.int64)
    logits = np.asarray(logits, dtype=np.float64)
    if labels.ndim != 2 or labels.shape != logits.shape:
        raise ValueError(f"multilabel labels and logits must both be [batch, labels] (got {labels.shape} and "
                         f"{logits.shape})")
    predicted = (logits >= np.log(threshold / (1 - threshold))).astype(np.int64)
    width = labels.shape[1]
    cm = np.stack([confusion_matrix(labels[:, j], predicted[:, j], 2) for j in range(width)]) if width else \
        np.zeros((0, 2, 2), np.int64)
    hist = np.stack([score_histogram(labels[:, j], logits[:, j]) for j in range(width)]) if width else \
        np.zeros((0, 2, AUC_BINS), np.int64)
    exact = np.array([int((predicted == labels).all(axis=1).sum()), labels.shape[0]], np.int64)
    return {"label_confusion": cm, "label_histogram": hist, "exact": exact}


def multilabel_report(counts: dict[str, np.ndarray], loss_sum: float, labels: Sequence[str]) -> dict[str, Any]:
    """Micro and macro F1, macro ROC AUC (labels with both classes present), subset accuracy, per label."""
    cm = np.asarray(counts["label_confusion"], dtype=np.int64)
    tp, fp, fn = cm[:, 1, 1], cm[:, 0, 1], cm[:, 1, 0]
    f1 = _ratio(2 * tp, 2 * tp + fp + fn)
    aucs = [roc_auc_from_histogram(h) for h in counts["label_histogram"]]
    scored = [a for a in aucs if a is not None]
    matched, records = (int(v) for v in counts["exact"])
    per_label = {name: {"f1": float(f1[j]), "roc_auc": aucs[j], "support": int(tp[j] + fn[j]),
                        "predicted": int(tp[j] + fp[j])} for j, name in enumerate(labels)}
    return {"records": records, "micro_f1": float(_ratio(2 * tp.sum(), 2 * tp.sum() + fp.sum() + fn.sum())),
            "macro_f1": float(f1.mean()) if len(f1) else 0.0,
            "macro_roc_auc": float(np.mean(scored)) if scored else None,
            "macro_roc_auc_labels": len(scored),
            "subset_accuracy": matched / records if records else 0.0,
            "accuracy": float(_ratio(np.trace(cm, axis1=1, axis2=2).sum(), cm.sum())),  # per-label (Hamming)
            "loss": loss_sum / records if records else 0.0, "per_label": per_label}


# -- regression: per-rank moments, merged --------------------------------------------------

MOMENTS = 5  # a row of regression moments: [n, mean y, M2 of y, sum (y - p)^2, sum |y - p|]


def regression_moments(targets: np.ndarray, predictions: np.ndarray) -> np.ndarray:
    """float64 ``[n, mean y, sum (y - mean y)^2, sum (y - p)^2, sum |y - p|]`` of one batch.

    Centred on the batch's own mean rather than the raw ``sum y^2``: with a target of mean 1e8 and
    spread 1, ``sum y^2 - (sum y)^2 / n`` loses every digit of the spread to cancellation (R^2 came out
    0.0 instead of 0.75). Combine rows with :func:`merge_moments`, never by adding them.
    """
    y = np.asarray(targets, dtype=np.float64).ravel()
    p = np.asarray(predictions, dtype=np.float64).ravel()
    if y.shape != p.shape:
        raise ValueError(f"targets and predictions differ in length ({y.size} vs {p.size})")
    if not y.size:
        return np.zeros(MOMENTS, np.float64)
    mean = y.mean()
    err = y - p
    return np.array([y.size, mean, ((y - mean) ** 2).sum(), (err * err).sum(), np.abs(err).sum()], np.float64)


def merge_moments(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The moments of two disjoint parts' union (Chan, Golub and LeVeque's pairwise update; pure).

    ``M2 = M2_a + M2_b + delta^2 n_a n_b / n`` with ``delta`` the difference of the means: no sum of
    squares of raw values anywhere, so a large mean costs no precision.
    """
    na, nb = float(a[0]), float(b[0])
    if nb == 0:
        return np.array(a, np.float64)
    if na == 0:
        return np.array(b, np.float64)
    n = na + nb
    delta = float(b[1]) - float(a[1])
    mean = float(a[1]) + delta * nb / n
    m2 = float(a[2]) + float(b[2]) + delta * delta * na * nb / n
    return np.array([n, mean, m2, float(a[3]) + float(b[3]), float(a[4]) + float(b[4])], np.float64)


def regression_report(moments: np.ndarray) -> dict[str, Any]:
    """RMSE, MAE and R^2 (scikit-learn's conventions: R^2 of a constant target is 1.0 if exact, else 0.0).

    ``moments``: one row of :func:`regression_moments`, or ``[ranks, MOMENTS]`` (one row per rank, as the
    evaluation's all-reduce gathers them), merged here in rank order. The result equals the single-process
    value up to rounding of the order of additions, far below the metrics' printed digits.
    """
    rows = np.atleast_2d(np.asarray(moments, dtype=np.float64))
    total = np.zeros(MOMENTS, np.float64)
    for row in rows:
        total = merge_moments(total, row)
    n, mean, sst, sse, sae = (float(v) for v in total)
    if n == 0:
        return {"records": 0, "rmse": 0.0, "mae": 0.0, "r2": 0.0, "loss": 0.0}
    r2 = 1.0 - sse / sst if sst > 0 else (1.0 if sse == 0 else 0.0)
    return {"records": int(n), "rmse": float(np.sqrt(sse / n)), "mae": sae / n, "r2": r2, "loss": sse / n,
            "target_mean": mean, "target_std": float(np.sqrt(sst / n))}
