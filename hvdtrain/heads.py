"""The loss, the training accuracy and the evaluation outputs of each task (:mod:`hvdtrain.tasks`).

The model returns float scores ``[batch, outputs]``; the head turns them into
per-example losses (float32, computed from the float32 logits also under
mixed precision):

* multiclass: softmax cross-entropy over the class logits;
* binary: sigmoid cross-entropy of the one logit (log loss);
* multilabel: sigmoid cross-entropy, averaged over the labels;
* regression: squared error of the one output.

``class_weights`` (binary, multiclass) multiplies each example's loss by its
true class's weight; the reported ``log_loss`` stays scikit-learn's, unweighted
(:meth:`Head.unweighted_loss`). Training "accuracy" is the fraction of correct decisions:
per example (multiclass, binary at ``threshold``), per label (multilabel);
regression has none (0).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import tensorflow as tf

Tensor = Any


@dataclass(frozen=True)
class Head:
    """How one task scores the model's outputs (see the module docstring)."""

    task: str = "multiclass"
    threshold: float = 0.5
    class_weights: Optional[tuple[float, ...]] = None

    @property
    def cut(self) -> float:
        """The logit at which the probability reaches ``threshold``."""
        return math.log(self.threshold / (1 - self.threshold))

    def loss(self, labels: Tensor, logits: Tensor) -> Tensor:
        """Per-example training loss ``[batch]`` (float32): :meth:`unweighted_loss` times the class weight."""
        per = self.unweighted_loss(labels, logits)
        if self.class_weights is not None:
            per = per * tf.gather(tf.constant(self.class_weights, tf.float32), tf.cast(labels, tf.int64))
        return per

    def unweighted_loss(self, labels: Tensor, logits: Tensor) -> Tensor:
        """Per-example loss ``[batch]`` (float32) without class weights (for classes, the log loss)."""
        logits = tf.cast(logits, tf.float32)
        if self.task == "multiclass":
            per = tf.nn.sparse_softmax_cross_entropy_with_logits(tf.cast(labels, tf.int64), logits)
        elif self.task == "binary":
            per = tf.nn.sigmoid_cross_entropy_with_logits(tf.cast(labels, tf.float32), logits[:, 0])
        elif self.task == "multilabel":
            per = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(tf.cast(labels, tf.float32), logits), -1)
        else:
            per = tf.square(tf.cast(labels, tf.float32) - logits[:, 0])
        return per

    def correct(self, labels: Tensor, logits: Tensor) -> Tensor:
        """Correct decisions in the batch (float64): examples, or labels / label count for multilabel."""
        if self.task == "multiclass":
            hits = tf.equal(tf.argmax(logits, axis=-1), tf.cast(labels, tf.int64))
        elif self.task == "binary":
            hits = tf.equal(tf.cast(logits[:, 0] >= self.cut, tf.int64), tf.cast(labels, tf.int64))
        elif self.task == "multilabel":
            agree = tf.equal(tf.cast(logits >= self.cut, tf.float32), tf.cast(labels, tf.float32))
            return tf.reduce_sum(tf.reduce_mean(tf.cast(agree, tf.float64), axis=-1))
        else:
            return tf.constant(0.0, tf.float64)
        return tf.reduce_sum(tf.cast(hits, tf.float64))

    def eval_outputs(self, labels: Tensor, logits: Tensor) -> dict[str, Tensor]:
        """What evaluation counts: the loss, the scores (``pred`` and ``margin`` for multiclass) and, for
        classes, the unweighted ``log_loss`` (the same tensor as ``loss`` without class weights)."""
        logits = tf.cast(logits, tf.float32)
        out = {"loss": self.loss(labels, logits)}
        if self.task in ("multiclass", "binary"):
            out["log_loss"] = out["loss"] if self.class_weights is None else self.unweighted_loss(labels, logits)
        if self.task == "multiclass":
            out["pred"] = tf.argmax(logits, axis=-1)
            if logits.shape[-1] == 2:
                out["margin"] = logits[:, 1] - logits[:, 0]  # log-odds of class 1
        elif self.task == "multilabel":
            out["scores"] = logits
        else:
            out["scores"] = logits[:, 0]
        return out


def for_task(task: Any, labels: Sequence[str], train_counts: dict[str, int]) -> Head:
    """The head of ``task`` (a :class:`hvdtrain.config.TaskConfig`); ``class_weights: balanced`` from the
    training split's records per class (``train_counts``, by label name)."""
    weights = None
    if task.class_weights == "balanced":
        weights = balanced_weights([train_counts.get(name, 0) for name in labels])
    return Head(task.kind, task.threshold, weights)


def balanced_weights(class_counts: Sequence[int]) -> tuple[float, ...]:
    """scikit-learn's ``class_weight="balanced"``: ``records / (classes * class records)`` (0 for an absent class)."""
    counts = np.asarray(class_counts, dtype=np.float64)
    total, k = counts.sum(), len(counts)
    return tuple(float(total / (k * c)) if c > 0 else 0.0 for c in counts)
