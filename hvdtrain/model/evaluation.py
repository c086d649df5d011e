"""Exact distributed evaluation: every rank counts, the ranks sum, metrics come from the totals.

Each rank reads its part of a split (every record exactly once across ranks,
see :func:`hvdtrain.data.eval_dataset`) and keeps counts only: a confusion
matrix (int64), the sum of per-example losses (float64) and, for two
classes, a histogram of logit margins per true class (int64, for ROC-AUC;
see :mod:`hvdtrain.model.metrics`). Summing those over ranks gives exactly the
counts one process would get on the whole split, so accuracy, macro F1,
loss and ROC-AUC equal the single-process values.

The other tasks keep counts the same way (:mod:`hvdtrain.core.tasks`): binary a
confusion matrix at ``task.threshold`` and a logit histogram (ROC and PR AUC);
multilabel one confusion matrix and one histogram per label and the exact
matches; regression its count, mean and centred sum of squares of y and the
sums of squared and absolute errors (:func:`hvdtrain.model.metrics.regression_moments`),
plus the (target, prediction) pairs of the first :data:`RESIDUAL_SAMPLE` records
each rank evaluates for the residual chart. Neither of those two adds across
ranks, so each rank fills its own row of a ``[ranks, ...]`` array: summing
gathers the rows, and the report merges the moments in rank order.

Binary and multiclass also keep the sum of the unweighted per-example log loss
(``log_loss_sum``): with ``task.class_weights`` the loss is weighted, but the
reported ``log_loss`` is scikit-learn's, which is not.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Sequence

import numpy as np

from hvdtrain.core import tasks
from hvdtrain.model import metrics
from hvdtrain.runtime import distributed

RESIDUAL_SAMPLE = 1000  # (target, prediction) pairs per rank kept for the regression residual chart


@dataclass
class SplitCounts:
    """What evaluation keeps of a split: counts and sums, nothing per example."""

    confusion: np.ndarray  # int64 [classes, classes]: cm[true, predicted] ([0, 0] for multilabel, regression)
    loss_sum: float
    histogram: Optional[np.ndarray] = None  # int64 [2, AUC_BINS]: binary, and multiclass with two classes
    task: str = "multiclass"
    arrays: dict[str, np.ndarray] = field(default_factory=dict)  # multilabel and regression counts
    rank: int = 0  # the row of the regression sample this rank fills

    @property
    def records(self) -> int:
        if self.task == "regression":
            return int(np.atleast_2d(self.arrays["moments"])[:, 0].sum())
        if self.task == "multilabel":
            return int(self.arrays["exact"][1])
        return int(self.confusion.sum())


def empty_counts(task: str, num_classes: int, rank: int = 0, size: int = 1) -> SplitCounts:
    """Zero counts of one split for ``task`` over ``num_classes`` classes or labels (rank ``rank`` of ``size``)."""
    width = 2 if task == "binary" else num_classes if task == "multiclass" else 0
    hist = np.zeros((2, metrics.AUC_BINS), np.int64) if width == 2 else None
    arrays: dict[str, np.ndarray] = {"log_loss_sum": np.zeros(1, np.float64)} if width else {}
    if task == "multilabel":
        arrays = {"label_confusion": np.zeros((num_classes, 2, 2), np.int64),
                  "label_histogram": np.zeros((num_classes, 2, metrics.AUC_BINS), np.int64),
                  "exact": np.zeros(2, np.int64)}
    elif task == "regression":
        arrays = {"moments": np.zeros((size, metrics.MOMENTS), np.float64), "sample": np.zeros((size, RESIDUAL_SAMPLE, 2), np.float64),
                  "sample_n": np.zeros(size, np.int64)}
    return SplitCounts(np.zeros((width, width), np.int64), 0.0, hist, task, arrays, rank)


def add_batch(counts: SplitCounts, labels: np.ndarray, out: dict[str, Any], threshold: float = 0.5) -> None:
    """Add one batch's eval-step outputs to this rank's counts (in place)."""
    counts.loss_sum += float(np.asarray(out["loss"], dtype=np.float64).sum())
    if "log_loss_sum" in counts.arrays:  # a step without class weights may give its loss alone: the same values
        counts.arrays["log_loss_sum"] += float(np.asarray(out.get("log_loss", out["loss"]), np.float64).sum())
    if counts.task == "multiclass":
        counts.confusion += metrics.confusion_matrix(labels, np.asarray(out["pred"]), counts.confusion.shape[0])
        if counts.histogram is not None:
            counts.histogram += metrics.score_histogram(labels, np.asarray(out["margin"]))
    elif counts.task == "binary":
        cm, hist = metrics.binary_counts(labels, np.asarray(out["scores"]), threshold)
        counts.confusion += cm
        counts.histogram += hist
    elif counts.task == "multilabel":
        for name, value in metrics.multilabel_counts(labels, np.asarray(out["scores"]), threshold).items():
            counts.arrays[name] += value
    else:
        scores = np.asarray(out["scores"])
        moments = counts.arrays["moments"]
        moments[counts.rank] = metrics.merge_moments(moments[counts.rank], metrics.regression_moments(labels, scores))
        kept = int(counts.arrays["sample_n"][counts.rank])
        take = min(RESIDUAL_SAMPLE - kept, len(labels))
        if take > 0:
            pairs = np.stack([np.ravel(labels)[:take], np.ravel(scores)[:take]], axis=1)
            counts.arrays["sample"][counts.rank, kept:kept + take] = pairs
            counts.arrays["sample_n"][counts.rank] += take


def count_split(eval_step: Callable[[dict[str, Any]], dict[str, Any]], batches: Iterable[dict[str, Any]],
                label_feature: str, counts: SplitCounts, on_batch: Callable[[], None] = lambda: None,
                threshold: float = 0.5) -> SplitCounts:
    """This rank's counts over its batches, added to ``counts`` (from :func:`empty_counts`, which fixes the task,
    the classes and this rank's slot; no communication); ``on_batch`` hears each batch done."""
    for batch in batches:
        add_batch(counts, np.asarray(batch[label_feature]), eval_step(batch), threshold)
        on_batch()
    return counts


def allreduce_counts(counts: SplitCounts, name: str) -> SplitCounts:
    """The counts summed over ranks (every rank must call this, in the same order)."""
    cm = distributed.allreduce_sum(counts.confusion, name=f"hvdtrain.eval.{name}.cm")
    loss = distributed.allreduce_sum(np.array([counts.loss_sum], np.float64), name=f"hvdtrain.eval.{name}.loss")
    hist = None
    if counts.histogram is not None:
        hist = distributed.allreduce_sum(counts.histogram, name=f"hvdtrain.eval.{name}.hist")
    arrays = {key: distributed.allreduce_sum(value, name=f"hvdtrain.eval.{name}.{key}")
              for key, value in sorted(counts.arrays.items())}
    return SplitCounts(cm, float(loss[0]), hist, counts.task, arrays, counts.rank)


def split_report(counts: SplitCounts, labels: Sequence[str], expected_records: int) -> dict[str, Any]:
    """JSON-ready metrics of one split (pure), as the task defines them (:mod:`hvdtrain.core.tasks`)."""
    loss = counts.loss_sum / counts.records if counts.records else 0.0
    # counts built without the unweighted sum (no class weights) have it in loss_sum
    log_loss_sum = float(counts.arrays["log_loss_sum"][0]) if "log_loss_sum" in counts.arrays else counts.loss_sum
    if counts.task == "binary":
        assert counts.histogram is not None  # a binary split always counts its score histogram
        out = metrics.binary_report(counts.confusion, counts.histogram, log_loss_sum, labels)
        out["loss"] = loss
    elif counts.task == "multilabel":
        out = metrics.multilabel_report(counts.arrays, counts.loss_sum, labels)
    elif counts.task == "regression":
        out = metrics.regression_report(counts.arrays["moments"])
        # the training objective, as the step computes it: squared error of the target as the model learns it
        # (task.target_transform), sample weights included; rmse, mae and r2 are in the target's own units
        out["loss"] = loss
        out["residual_sample"] = residual_sample(counts)
    else:
        out = {**metrics.report(counts.confusion, labels), "loss": loss,
               "log_loss": log_loss_sum / counts.records if counts.records else 0.0}
        if counts.histogram is not None:
            out["roc_auc"] = metrics.roc_auc_from_histogram(counts.histogram)
            out["roc_auc_max_binning_error"] = metrics.auc_binning_error(counts.histogram)
    out["task"] = counts.task
    out["expected_records"] = expected_records
    out["complete"] = counts.records == expected_records
    return out


def residual_sample(counts: SplitCounts) -> list[list[float]]:
    """The gathered (target, prediction) pairs of a regression split, rank by rank (pure)."""
    if "sample" not in counts.arrays:
        return []
    sample, kept = counts.arrays["sample"], counts.arrays["sample_n"]
    return [[float(y), float(p)] for r in range(len(kept)) for y, p in sample[r, :int(kept[r])]]


def scalar_metrics(report: dict[str, Any], prefix: str) -> dict[str, float]:
    """The numbers of a split report worth a metric each (``{prefix}_accuracy``, ...): the task's metrics."""
    names = tasks.METRICS.get(report.get("task", "multiclass"), ())
    return {f"{prefix}_{k}": float(report[k]) for k in names if report.get(k) is not None}
