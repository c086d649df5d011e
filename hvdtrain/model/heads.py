"""The loss, the training accuracy and the evaluation outputs of each task (:mod:`hvdtrain.core.tasks`).

The model returns float scores ``[batch, outputs]``; the head turns them into
per-example losses (float32, computed from the float32 logits also under
mixed precision):

* multiclass: softmax cross-entropy over the class logits;
* binary: sigmoid cross-entropy of the one logit (log loss);
* multilabel: sigmoid cross-entropy, averaged over the labels;
* regression: squared error of the one output against the target as the model learns it: standardized
  with the training split's mean and standard deviation (``task.target_transform``, default), or ``log1p``
  of it standardized; :meth:`Head.target_units` turns outputs back into the target's units, for every
  metric, and :func:`serving_model` puts the same inversion into the exported model.

``class_weights`` (binary, multiclass) multiplies each example's loss by its
true class's weight, and a sample weight (the ``weight`` feature, from ``source.weight_column``) by its own:
the batch's loss is then ``mean(w * loss)`` over the batch, what Keras's ``model.fit`` minimizes with
``sample_weight`` (its default reduction, ``sum_over_batch_size``, divides by the batch size, not by the sum of
the weights). Evaluation weighs ``loss`` the same way; the reported ``log_loss`` stays scikit-learn's, unweighted
(:meth:`Head.unweighted_loss`), and so do the other metrics. Training "accuracy" is the fraction of correct decisions:
per example (multiclass, binary at ``threshold``), per label (multilabel);
regression has none (0).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import tensorflow as tf

from hvdtrain.core.errors import DataError

Tensor = Any


@dataclass(frozen=True)
class Head:
    """How one task scores the model's outputs (see the module docstring)."""

    task: str = "multiclass"
    threshold: float = 0.5
    class_weights: Optional[tuple[float, ...]] = None
    # regression: the model learns (log1p(y) if target_log else y - target_shift) / target_scale
    target_shift: float = 0.0
    target_scale: float = 1.0
    target_log: bool = False

    @property
    def scales_target(self) -> bool:
        """Whether the model's output is the target in other units than its own (regression only)."""
        return self.task == "regression" and (self.target_log or self.target_shift != 0.0 or self.target_scale != 1.0)

    def model_target(self, labels: Tensor) -> Tensor:
        """A regression target as the model learns it (float32)."""
        y = tf.cast(labels, tf.float64)
        if self.target_log:
            y = tf.math.log1p(y)
        return tf.cast((y - self.target_shift) / self.target_scale, tf.float32)

    def target_units(self, outputs: Tensor) -> Tensor:
        """A regression model's outputs in the target's own units (float64: a target near 1e8 keeps its digits)."""
        y = tf.cast(outputs, tf.float64) * self.target_scale + self.target_shift
        return tf.math.expm1(y) if self.target_log else y

    @property
    def cut(self) -> float:
        """The logit at which the probability reaches ``threshold``."""
        return math.log(self.threshold / (1 - self.threshold))

    def loss(self, labels: Tensor, logits: Tensor, weights: Optional[Tensor] = None) -> Tensor:
        """Per-example training loss ``[batch]`` (float32): :meth:`unweighted_loss` times the class weight and
        the example's sample weight (``weights`` ``[batch]``, when the dataset has them)."""
        per = self.unweighted_loss(labels, logits)
        if self.class_weights is not None:
            per = per * tf.gather(tf.constant(self.class_weights, tf.float32), tf.cast(labels, tf.int64))
        if weights is not None:
            per = per * tf.reshape(tf.cast(weights, tf.float32), [-1])
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
            per = tf.square(self.model_target(labels) - logits[:, 0])
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

    def eval_outputs(self, labels: Tensor, logits: Tensor, weights: Optional[Tensor] = None) -> dict[str, Tensor]:
        """What evaluation counts: the (weighted) loss, the scores (``pred`` and ``margin`` for multiclass) and,
        for classes, the unweighted ``log_loss`` (the same tensor as ``loss`` without class or sample weights)."""
        logits = tf.cast(logits, tf.float32)
        out = {"loss": self.loss(labels, logits, weights)}
        if self.task in ("multiclass", "binary"):
            weighted = self.class_weights is not None or weights is not None
            out["log_loss"] = self.unweighted_loss(labels, logits) if weighted else out["loss"]
        if self.task == "multiclass":
            out["pred"] = tf.argmax(logits, axis=-1)
            if logits.shape[-1] == 2:
                out["margin"] = logits[:, 1] - logits[:, 0]  # log-odds of class 1
        elif self.task == "multilabel":
            out["scores"] = logits
        else:
            out["scores"] = self.target_units(logits[:, 0])
        return out


def for_task(task: Any, labels: Sequence[str], train_counts: dict[str, int],
             target: Optional[dict[str, Any]] = None) -> Head:
    """The head of ``task`` (a :class:`hvdtrain.core.config.TaskConfig`); ``class_weights`` from
    :func:`class_weight_vector`; a regression's target transform from the training target's statistics
    (``target``: the manifest's ``preprocessing.target``; datasets written without it train on the raw target).

    Raises:
        DataError: ``task.class_weights`` names a label the dataset does not have (one line).
    """
    weights = class_weight_vector(task.class_weights, labels, train_counts)
    shift, scale, log = target_transform(task.kind, getattr(task, "target_transform", "none"), target)
    return Head(task.kind, task.threshold, weights, shift, scale, log)


def class_weight_vector(spec: Any, labels: Sequence[str], train_counts: dict[str, int]
                        ) -> Optional[tuple[float, ...]]:
    """One weight per label in the dataset's order (pure): None for ``none``; ``balanced`` from the training
    split's records per class (``train_counts``, by label name); a mapping ``{label: weight}`` as given, 1 for a
    label it leaves out (Keras's ``class_weight`` does the same).

    Raises:
        DataError: the mapping names a label the dataset does not have (one line naming the labels it has).
    """
    if spec == "balanced":
        return balanced_weights([train_counts.get(name, 0) for name in labels])
    if not isinstance(spec, dict):
        return None
    unknown = [name for name in spec if name not in labels]
    if unknown:
        raise DataError(f"task.class_weights names {', '.join(map(repr, unknown))}, which the dataset does not have; "
                        f"its labels are {', '.join(map(repr, labels))}: name those (quoted in YAML), or rerun the ETL")
    return tuple(float(spec.get(name, 1.0)) for name in labels)


def target_transform(kind: str, transform: str, target: Optional[dict[str, Any]]) -> tuple[float, float, bool]:
    """(shift, scale, log1p first) of a regression target (pure); the identity for other tasks, ``none``, or a
    dataset without target statistics.

    Raises:
        DataError: ``log`` on a target with values <= -1 (log1p is undefined there).
    """
    if kind != "regression" or transform == "none" or not target or not target.get("count"):
        return 0.0, 1.0, False
    if transform == "log":
        if target.get("log_mean") is None:
            raise DataError(f"task.target_transform=log needs every training target > -1, but the smallest is "
                            f"{target.get('min')}: use task.target_transform=standardize (or none)")
        mean, std, log = float(target["log_mean"]), float(target["log_std"] or 0.0), True
    else:
        mean, std, log = float(target["mean"]), float(target["std"] or 0.0), False
    return mean, (std if std > 0 and math.isfinite(std) else 1.0), log


def serving_model(model: Any, head: Head) -> Any:
    """The model as it is exported: for a regression trained on a transformed target, the same layers followed
    by the inversion (built-in Keras layers only, so the ``.keras`` file and the SavedModel load anywhere);
    the model itself otherwise."""
    if not head.scales_target:
        return model
    import keras

    if not getattr(model, "inputs", None):
        raise DataError(f"model {model.name!r} has no symbolic inputs (a subclassed keras.Model), so hvdtrain cannot "
                        "append the regression target's inversion to it for export: build it with the functional "
                        "API, or set task.target_transform=none")
    out = keras.layers.Rescaling(head.target_scale, head.target_shift, dtype="float32", name="target_units")(
        model.outputs[0])
    if head.target_log:
        out = keras.layers.Activation("exponential", dtype="float32", name="target_exp")(out)
        out = keras.layers.Rescaling(1.0, -1.0, dtype="float32", name="target_expm1")(out)
    return keras.Model(model.input, out, name=model.name)


def balanced_weights(class_counts: Sequence[int]) -> tuple[float, ...]:
    """scikit-learn's ``class_weight="balanced"``: ``records / (classes * class records)`` (0 for an absent class)."""
    counts = np.asarray(class_counts, dtype=np.float64)
    total, k = counts.sum(), len(counts)
    return tuple(float(total / (k * c)) if c > 0 else 0.0 for c in counts)
