"""A builder returning a subclassed ``keras.Model``: trains a step, evaluates and exports (``model.keras`` and the
SavedModel) when the class can be saved; otherwise one config line naming the builder, what is missing and the
fix, before any training (it used to end in ``AttributeError: ... has no attribute 'outputs'``)."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from hvdtrain.core import config
from hvdtrain.core.errors import ConfigError
from hvdtrain.data import contract
from hvdtrain.data.synthetic import Layout, TabularSpec, make_tabular_dataset
from hvdtrain.model import heads, models
from hvdtrain.training import steps


@pytest.fixture(scope="module")
def tabular(tmp_path_factory):
    root = tmp_path_factory.mktemp("tabular")
    return make_tabular_dataset(str(root), TabularSpec(Layout(40), num_classes=3, num_numeric=4))


def _custom(builder: str) -> config.ModelConfig:
    return config.ModelConfig(kind="custom", builder=f"tests.support.builders:{builder}")


def test_a_subclassed_model_without_get_config_is_one_line_naming_the_fix(tabular) -> None:
    shape = contract.check_manifest(tabular, _custom("bare_subclassed"), "multiclass")
    with pytest.raises(ConfigError) as info:
        models.build_model(_custom("bare_subclassed"), shape)
    message = str(info.value)
    assert "\n" not in message, message
    for part in ("model.builder", "tests.support.builders:bare_subclassed", "subclassed keras.Model BareNet",
                 "get_config()", "register_keras_serializable", "functional API"):
        assert part in message, message


def test_a_savable_subclassed_model_trains_a_step_evaluates_and_exports(tabular, tmp_path) -> None:
    import keras

    shape = contract.check_manifest(tabular, _custom("savable_subclassed"), "multiclass")
    model = models.build_model(_custom("savable_subclassed"), shape)
    assert sorted(steps.input_names(model)) == sorted(shape.inputs)  # the contract's features, as named inputs
    optimizer = keras.optimizers.Adam(0.01)
    optimizer.build(model.trainable_variables)
    rng = np.random.default_rng(0)
    batch = {"numeric": tf.constant(rng.normal(size=(8, 4)).astype("float32")),
             "categorical": tf.constant(rng.integers(0, 3, (8, len(shape.cardinalities)))),
             "label": tf.constant(rng.integers(0, 3, 8))}
    before = [np.array(w) for w in model.trainable_weights]
    loss_sum, _ = steps.make_train_step(model, optimizer, "label", steps.input_names(model))(batch)
    assert np.isfinite(float(loss_sum))
    assert any(np.abs(np.array(w) - b).max() > 0 for w, b in zip(model.trainable_weights, before))
    assert np.abs(np.array(model.get_layer("savable_net").norm.moving_mean)).max() > 0  # training=True reached it
    outputs = steps.make_eval_step(model, "label", steps.input_names(model), heads.Head())(batch)
    assert outputs
    inputs = {k: batch[k] for k in shape.inputs}
    # exported as a regression on a standardized target is: the inversion appended (heads.serving_model used to
    # refuse a subclassed model here, after the whole training)
    served = heads.serving_model(model, heads.Head(task="regression", target_shift=10.0, target_scale=2.0))
    expected = np.array(model(inputs)) * 2.0 + 10.0
    served.save(tmp_path / "model.keras")
    again = keras.saving.load_model(tmp_path / "model.keras", compile=False)  # builders imported: registered
    np.testing.assert_allclose(again(inputs), expected, rtol=1e-5)
    served.export(str(tmp_path / "saved_model"), verbose=False)
    reloaded = tf.saved_model.load(str(tmp_path / "saved_model"))
    np.testing.assert_allclose(reloaded.serve(inputs), expected, rtol=1e-5)
