"""Exact distributed evaluation: every rank counts, the ranks sum, metrics come from the totals.

Each rank reads its part of a split (every record exactly once across ranks,
see :func:`hvdtrain.data.eval_dataset`) and keeps counts only: a confusion
matrix (int64), the sum of per-example losses (float64) and, for two
classes, a histogram of logit margins per true class (int64, for ROC-AUC;
see :mod:`hvdtrain.metrics`). Summing those over ranks gives exactly the
counts one process would get on the whole split, so accuracy, macro F1,
loss and ROC-AUC equal the single-process values.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Sequence

import numpy as np

from hvdtrain import distributed, metrics


@dataclass
class SplitCounts:
    """What evaluation keeps of a split: counts and sums, nothing per example."""

    confusion: np.ndarray  # int64 [classes, classes]: cm[true, predicted]
    loss_sum: float
    histogram: Optional[np.ndarray] = None  # int64 [2, AUC_BINS], binary tasks only

    @property
    def records(self) -> int:
        return int(self.confusion.sum())


def count_split(eval_step: Callable[[dict[str, Any]], dict[str, Any]], batches: Iterable[dict[str, Any]],
                label_feature: str, num_classes: int, on_batch: Callable[[], None] = lambda: None) -> SplitCounts:
    """This rank's counts over its batches (no communication); ``on_batch`` hears each batch done."""
    cm = np.zeros((num_classes, num_classes), np.int64)
    hist = np.zeros((2, metrics.AUC_BINS), np.int64) if num_classes == 2 else None
    loss_sum = 0.0
    for batch in batches:
        out = eval_step(batch)
        labels = np.asarray(batch[label_feature])
        cm += metrics.confusion_matrix(labels, np.asarray(out["pred"]), num_classes)
        loss_sum += float(np.asarray(out["loss"], dtype=np.float64).sum())
        if hist is not None:
            hist += metrics.score_histogram(labels, np.asarray(out["margin"]))
        on_batch()
    return SplitCounts(cm, loss_sum, hist)


def allreduce_counts(counts: SplitCounts, name: str) -> SplitCounts:
    """The counts summed over ranks (every rank must call this, in the same order)."""
    cm = distributed.allreduce_sum(counts.confusion, name=f"hvdtrain.eval.{name}.cm")
    loss = distributed.allreduce_sum(np.array([counts.loss_sum], np.float64), name=f"hvdtrain.eval.{name}.loss")
    hist = None
    if counts.histogram is not None:
        hist = distributed.allreduce_sum(counts.histogram, name=f"hvdtrain.eval.{name}.hist")
    return SplitCounts(cm, float(loss[0]), hist)


def split_report(counts: SplitCounts, labels: Sequence[str], expected_records: int) -> dict[str, Any]:
    """JSON-ready metrics of one split (pure): the confusion-matrix report, loss, ROC-AUC when binary."""
    out = {**metrics.report(counts.confusion, labels),
           "loss": counts.loss_sum / counts.records if counts.records else 0.0}
    if counts.histogram is not None:
        out["roc_auc"] = metrics.roc_auc_from_histogram(counts.histogram)
        out["roc_auc_max_binning_error"] = metrics.auc_binning_error(counts.histogram)
    out["expected_records"] = expected_records
    out["complete"] = counts.records == expected_records
    return out


def scalar_metrics(report: dict[str, Any], prefix: str) -> dict[str, float]:
    """The numbers of a split report worth a metric each (``{prefix}_accuracy``, ...)."""
    out = {f"{prefix}_{k}": float(report[k]) for k in ("accuracy", "macro_f1", "loss") if k in report}
    if report.get("roc_auc") is not None:
        out[f"{prefix}_roc_auc"] = float(report["roc_auc"])
    return out
