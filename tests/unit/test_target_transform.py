"""A regression target as the model learns it, and back (issue 53, item 3).

The model learns the target standardized with the training split's statistics (or log1p of it, standardized);
every metric, the exported model and scoring see the target's own units.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from hvdtrain.core.config import TaskConfig
from hvdtrain.core.errors import ConfigError, DataError
from hvdtrain.model import heads

STATS = {"count": 1000, "mean": 4000.0, "std": 2500.0, "min": 300.0, "log_mean": 7.8, "log_std": 1.0}


def test_the_transform_follows_task_target_transform_and_the_training_statistics() -> None:
    assert heads.target_transform("regression", "standardize", STATS) == (4000.0, 2500.0, False)
    assert heads.target_transform("regression", "log", STATS) == (7.8, 1.0, True)
    assert heads.target_transform("regression", "none", STATS) == (0.0, 1.0, False)
    assert heads.target_transform("binary", "standardize", STATS) == (0.0, 1.0, False)
    assert heads.target_transform("regression", "standardize", None) == (0.0, 1.0, False)  # an older dataset
    assert heads.target_transform("regression", "standardize", {**STATS, "std": 0.0}) == (4000.0, 1.0, False)
    with pytest.raises(DataError, match=r"target_transform=log needs every training target > -1, but the smallest "
                                        r"is -3.0: use task.target_transform=standardize"):
        heads.target_transform("regression", "log", {**STATS, "min": -3.0, "log_mean": None, "log_std": None})
    with pytest.raises(ConfigError, match="log applies to regression only"):
        TaskConfig(kind="binary", target_transform="log")


def test_the_loss_sees_the_standardized_target_and_the_scores_the_target_units() -> None:
    head = heads.for_task(TaskConfig(kind="regression"), [], {}, STATS)
    labels = np.array([4000.0, 6500.0, 1500.0], np.float32)
    outputs = np.array([[0.0], [1.0], [-1.0]], np.float32)  # exactly the standardized labels
    np.testing.assert_allclose(head.loss(labels, outputs).numpy(), 0.0, atol=1e-6)
    scores = head.eval_outputs(labels, outputs)["scores"].numpy()
    np.testing.assert_allclose(scores, labels, rtol=1e-9)
    raw = heads.for_task(TaskConfig(kind="regression", target_transform="none"), [], {}, STATS)
    np.testing.assert_allclose(raw.loss(labels, outputs).numpy(), (labels - outputs[:, 0]) ** 2)
    logged = heads.for_task(TaskConfig(kind="regression", target_transform="log"), [], {}, STATS)
    back = logged.eval_outputs(labels, ((np.log1p(labels) - 7.8) / 1.0)[:, None])["scores"].numpy()
    np.testing.assert_allclose(back, labels, rtol=1e-5)


def test_a_large_mean_target_keeps_its_spread() -> None:
    stats = {"count": 4, "mean": 1e8, "std": 1.0, "min": 1e8 - 2, "log_mean": None, "log_std": None}
    head = heads.for_task(TaskConfig(kind="regression"), [], {}, stats)
    labels = np.array([1e8 - 1, 1e8 + 1], np.float64)
    np.testing.assert_allclose(head.model_target(labels).numpy(), [-1.0, 1.0], atol=1e-6)
    np.testing.assert_allclose(head.target_units(np.array([-1.0, 1.0])).numpy(), labels, rtol=0, atol=1e-6)


def _tiny_model():
    import keras

    x = keras.Input((3,), name="numeric")
    return keras.Model({"numeric": x}, keras.layers.Dense(1, name="logits")(x), name="tabular_mlp")


@pytest.mark.parametrize("transform", ["standardize", "log"])
def test_the_exported_model_predicts_in_the_target_units_after_a_reload(tmp_path, transform: str) -> None:
    import keras

    model = _tiny_model()
    head = heads.for_task(TaskConfig(kind="regression", target_transform=transform), [], {}, STATS)
    served = heads.serving_model(model, head)
    x = {"numeric": np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)}
    raw = model.predict(x, verbose=0)
    expected = head.target_units(raw[:, 0]).numpy()
    path = os.path.join(tmp_path, "model.keras")
    served.save(path)
    loaded = keras.models.load_model(path)  # built-in layers only: loads without hvdtrain's code
    np.testing.assert_allclose(loaded.predict(x, verbose=0)[:, 0], expected, rtol=1e-4)
    assert heads.serving_model(model, heads.Head("regression")) is model  # nothing to invert: unchanged


def test_a_subclassed_model_cannot_carry_the_inversion_and_says_so_in_one_line() -> None:
    import keras

    class Sub(keras.Model):
        def __init__(self):
            super().__init__(name="mine")
            self.dense = keras.layers.Dense(1)

        def call(self, inputs):
            return self.dense(inputs["numeric"])

    head = heads.for_task(TaskConfig(kind="regression"), [], {}, STATS)
    with pytest.raises(DataError) as info:
        heads.serving_model(Sub(), head)
    assert "'mine' has no symbolic inputs" in str(info.value) and "target_transform=none" in str(info.value)
    assert "\n" not in str(info.value)


def test_the_reported_loss_is_the_training_objective_and_the_errors_are_in_target_units() -> None:
    # Training's loss is the squared error of the standardized target; the evaluation's "loss" must be the same
    # quantity (not the MSE in the target's units, std^2 = 6.25 million times larger here), rmse/mae the raw ones.
    from hvdtrain.model import evaluation

    head = heads.for_task(TaskConfig(kind="regression"), [], {}, STATS)
    labels = np.array([4000.0, 6500.0, 1500.0, 9000.0], np.float32)
    outputs = np.array([[0.1], [1.0], [-1.2], [2.0]], np.float32)
    counts = evaluation.empty_counts("regression", 0)
    evaluation.add_batch(counts, labels, {k: v.numpy() for k, v in head.eval_outputs(labels, outputs).items()})
    report = evaluation.split_report(counts, [], 4)
    assert report["loss"] == pytest.approx(float(np.mean(head.loss(labels, outputs).numpy())), rel=1e-6)
    predictions = outputs[:, 0] * 2500.0 + 4000.0
    assert report["mae"] == pytest.approx(float(np.mean(np.abs(predictions - labels))), rel=1e-6)
    assert report["rmse"] == pytest.approx(float(np.sqrt(np.mean((predictions - labels) ** 2))), rel=1e-6)
