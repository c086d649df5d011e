"""The four task kinds: what each one's labels, head, metrics and best-metric direction are (pure).

=============  ==================================  ==============  =============================================
task           label feature (written by the ETL)  model output    validation metrics
=============  ==================================  ==============  =============================================
multiclass     int64 [] class index                logits [K]      accuracy, macro_f1, loss (= log loss),
                                                                   roc_auc (two classes)
binary         int64 [] 0/1 (1 = ``labels[1]``)    logit [1]       roc_auc, pr_auc, log_loss (= loss),
                                                                   accuracy (at ``task.threshold``), f1
multilabel     float32 [L] multi-hot               logits [L]      micro_f1, macro_f1, macro_roc_auc, loss,
                                                                   subset_accuracy
regression     float32 [] target                   value [1]       rmse, mae, r2, loss (= mean squared error)
=============  ==================================  ==============  =============================================

No TensorFlow here: config validation and the ETL use it.
"""
from __future__ import annotations

from typing import Literal

TaskKind = Literal["multiclass", "binary", "multilabel", "regression"]
KINDS: tuple[str, ...] = ("multiclass", "binary", "multilabel", "regression")

METRICS: dict[str, tuple[str, ...]] = {
    "multiclass": ("accuracy", "macro_f1", "loss", "roc_auc"),  # loss is the log loss
    "binary": ("roc_auc", "pr_auc", "log_loss", "loss", "accuracy", "f1"),
    "multilabel": ("micro_f1", "macro_f1", "macro_roc_auc", "subset_accuracy", "loss"),
    "regression": ("rmse", "mae", "r2", "loss"),
}
# The metric a run keeps its best checkpoint by and tunes on when nothing is said.
DEFAULT_METRIC = {"multiclass": "accuracy", "binary": "roc_auc", "multilabel": "micro_f1", "regression": "rmse"}
# What the summary table shows first, per task.
HEADLINE = {"multiclass": ("accuracy", "macro_f1", "loss"), "binary": ("roc_auc", "pr_auc", "log_loss", "accuracy"),
            "multilabel": ("micro_f1", "macro_f1", "macro_roc_auc"), "regression": ("rmse", "mae", "r2")}
_LOWER_IS_BETTER = ("loss", "log_loss", "rmse", "mae")


def direction(metric: str) -> Literal["min", "max"]:
    """``min`` for a loss or an error, ``max`` otherwise; ``metric`` may carry a split prefix."""
    name = metric.split("_", 1)[1] if metric.startswith(("validation_", "train_", "test_")) else metric
    return "min" if name in _LOWER_IS_BETTER else "max"


def validation_metrics(task: str) -> tuple[str, ...]:
    """The ``validation_*`` names a run of this task records each epoch."""
    return tuple(f"validation_{m}" for m in METRICS[task])


def outputs(task: str, num_labels: int) -> int:
    """Width of the model's output: one logit per class or label, one for binary and regression."""
    return num_labels if task in ("multiclass", "multilabel") else 1


def label_spec(task: str, num_labels: int) -> tuple[str, list[int]]:
    """(dtype, shape) of the label feature the ETL writes for this task."""
    if task == "multilabel":
        return "float32", [num_labels]
    if task == "regression":
        return "float32", []
    return "int64", []
