"""The training step minimizes what Keras's ``model.fit`` minimizes: the task's loss plus ``model.losses``
(kernel regularizers, ``add_loss``), with and without gradient accumulation."""
from __future__ import annotations

from typing import Any, Sequence

import keras
import numpy as np
import pytest
import tensorflow as tf

from hvdtrain.model.heads import Head
from hvdtrain.training import steps


class _OneProcess:
    """The step's all-reduce in one process (nothing to average), carrying the task head as Reduction does."""

    head = Head("regression")

    def __call__(self, grads: Sequence[Any]) -> list[Any]:
        return list(grads)


def _model(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    x = keras.Input((4,), name="x")
    hidden = keras.layers.Dense(8, activation="tanh", kernel_regularizer=keras.regularizers.L2(0.5),
                                activity_regularizer=keras.regularizers.L2(0.05))(x)  # activity: via add_loss
    return keras.Model(x, keras.layers.Dense(1, kernel_regularizer=keras.regularizers.L2(0.5))(hidden))


def _batch(rows: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(2)
    x = rng.normal(0, 1, (rows, 4)).astype(np.float32)
    return {"x": x, "label": (x.sum(axis=1) + rng.normal(0, 0.1, rows)).astype(np.float32)}


def _keras_step(batch: dict[str, np.ndarray]) -> tuple[float, list[np.ndarray]]:
    """Plain Keras on the same batch: the loss ``train_on_batch`` reports and the weights after the step."""
    model = _model(seed=5)
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    loss = float(model.train_on_batch(batch["x"], batch["label"][:, None]))
    return loss, [w.numpy() for w in model.trainable_variables]


@pytest.mark.parametrize("accum_steps", [1, 2])
def test_regularized_step_matches_keras_fit(accum_steps: int) -> None:
    batch = _batch(16)
    keras_loss, keras_weights = _keras_step(batch)
    model = _model(seed=5)
    assert model.losses, "the model under test has regularization losses"
    step = steps.make_optimizer_step(model, keras.optimizers.SGD(0.05), "label", ["x"], accum_steps,
                                     reduction=_OneProcess())  # type: ignore[arg-type]
    micro = [{k: tf.constant(v[i::accum_steps]) for k, v in batch.items()} for i in range(accum_steps)]
    loss_sum, _ = step(micro)
    unregularized = _model(seed=5)
    plain = float(np.mean((unregularized(batch["x"]).numpy()[:, 0] - batch["label"]) ** 2))
    assert keras_loss > plain + 0.1, "the penalty is large enough to tell apart"
    assert float(loss_sum) / 16 == pytest.approx(keras_loss, rel=1e-5)
    for ours, theirs in zip(model.trainable_variables, keras_weights):
        np.testing.assert_allclose(ours.numpy(), theirs, rtol=1e-5, atol=1e-6)
