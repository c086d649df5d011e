"""Sample weights from a column (issue 53, item 4): a batch's loss is Keras's with ``sample_weight``, i.e.
``mean(w * loss)`` over the batch (Keras's default ``sum_over_batch_size``), and the step's update is the update
``train_on_batch(x, y, sample_weight=w)`` makes."""
from __future__ import annotations

from typing import Any, Sequence

import keras
import numpy as np
import pytest
import tensorflow as tf

from hvdtrain.data import contract
from hvdtrain.model.heads import Head
from hvdtrain.training import steps

# task -> (head, the Keras loss of the same task, model outputs)
TASKS = {
    "binary": (Head("binary"), keras.losses.BinaryCrossentropy(from_logits=True), 1),
    "multiclass": (Head("multiclass"), keras.losses.SparseCategoricalCrossentropy(from_logits=True), 3),
    "regression": (Head("regression"), keras.losses.MeanSquaredError(), 1),
}


class _OneProcess:
    """The step's all-reduce in one process, carrying the task head as ``steps.Reduction`` does."""

    def __init__(self, head: Head):
        self.head = head

    def __call__(self, grads: Sequence[Any]) -> list[Any]:
        return list(grads)


def _model(outputs: int) -> keras.Model:
    keras.utils.set_random_seed(4)
    x = keras.Input((5,), name="x")
    return keras.Model(x, keras.layers.Dense(outputs)(keras.layers.Dense(8, activation="tanh")(x)))


def _batch(task: str, rows: int = 32) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(9)
    x = rng.normal(0, 1, (rows, 5)).astype(np.float32)
    label = {"binary": rng.integers(0, 2, rows), "multiclass": rng.integers(0, 3, rows),
             "regression": rng.normal(0, 2, rows).astype(np.float32)}[task]
    weight = rng.uniform(0, 3, rows).astype(np.float32)
    weight[:4] = 0.0  # a zero weight is allowed: the example counts for nothing
    return {"x": x, "label": label, contract.WEIGHT_FEATURE: weight}


def _keras_label(task: str, label: np.ndarray) -> np.ndarray:
    return label[:, None].astype(np.float32) if task != "multiclass" else label


@pytest.mark.parametrize("task", list(TASKS))
def test_a_weighted_batch_loss_is_keras_compute_loss_with_sample_weight(task: str) -> None:
    head, keras_loss, outputs = TASKS[task]
    batch = _batch(task)
    model = _model(outputs)
    model.compile(loss=keras_loss)
    logits = model(batch["x"])
    theirs = float(model.compute_loss(batch["x"], _keras_label(task, batch["label"]), logits,
                                      sample_weight=batch[contract.WEIGHT_FEATURE]))
    ours = head.loss(tf.constant(batch["label"]), logits, tf.constant(batch[contract.WEIGHT_FEATURE]))
    assert float(tf.reduce_mean(ours)) == pytest.approx(theirs, rel=1e-5)
    unweighted = float(tf.reduce_mean(head.loss(tf.constant(batch["label"]), logits)))
    assert abs(unweighted - theirs) > 1e-3, "the weights change the loss"


@pytest.mark.parametrize("task", list(TASKS))
def test_a_weighted_step_is_train_on_batch_with_sample_weight(task: str) -> None:
    head, keras_loss, outputs = TASKS[task]
    batch = _batch(task)
    plain = _model(outputs)
    plain.compile(optimizer=keras.optimizers.SGD(0.1), loss=keras_loss)
    keras_loss_value = float(plain.train_on_batch(batch["x"], _keras_label(task, batch["label"]),
                                                  sample_weight=batch[contract.WEIGHT_FEATURE]))
    model = _model(outputs)
    step = steps.make_optimizer_step(model, keras.optimizers.SGD(0.1), "label", ["x"],
                                     reduction=_OneProcess(head))  # type: ignore[arg-type]
    loss_sum, _ = step([{k: tf.constant(v) for k, v in batch.items()}])
    assert float(loss_sum) / len(batch["x"]) == pytest.approx(keras_loss_value, rel=1e-5)
    for ours, theirs in zip(model.trainable_variables, plain.trainable_variables):
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6)


def test_evaluation_weighs_the_loss_only_and_keeps_the_log_loss_unweighted() -> None:
    head = Head("binary")
    batch = _batch("binary")
    labels, logits = tf.constant(batch["label"]), tf.constant(np.linspace(-2, 2, 32, dtype=np.float32)[:, None])
    out = head.eval_outputs(labels, logits, tf.constant(batch[contract.WEIGHT_FEATURE]))
    plain = head.unweighted_loss(labels, logits).numpy()
    np.testing.assert_allclose(out["loss"].numpy(), plain * batch[contract.WEIGHT_FEATURE], rtol=1e-6)
    np.testing.assert_allclose(out["log_loss"].numpy(), plain, rtol=1e-6)  # scikit-learn's, unweighted
