"""Small ``model.kind: custom`` builders the tests train: one with BatchNormalization (state every rank updates
on its own batches), subclassed ``keras.Model`` builders with and without what ``model.keras`` needs.

Used as ``builder: "tests.support.builders:<name>"`` with the repository on ``PYTHONPATH``.
"""
from __future__ import annotations

from typing import Any

import keras


def batch_norm_mlp(contract: Any, params: dict[str, Any]) -> keras.Model:
    """numeric -> Dense -> BatchNormalization -> Dropout -> logits (functional)."""
    numeric = keras.Input((contract.numeric_features,), dtype="float32", name="numeric")
    x = keras.layers.Dense(params.get("units", 8), activation="relu", name="hidden")(numeric)
    x = keras.layers.BatchNormalization(momentum=params.get("momentum", 0.5), name="bn")(x)
    x = keras.layers.Dropout(0.1, name="dropout")(x)
    logits = keras.layers.Dense(contract.num_outputs, dtype="float32", name="logits")(x)
    return keras.Model({"numeric": numeric}, logits, name="batch_norm_mlp")


class BareNet(keras.Model):
    """A subclassed model with no ``get_config`` and no registration: trains, but cannot be saved as ``.keras``."""

    def __init__(self, num_outputs: int, **kwargs: Any):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(8, activation="relu")
        self.logits = keras.layers.Dense(num_outputs, dtype="float32")

    def call(self, inputs: dict[str, Any]) -> Any:
        return self.logits(self.hidden(inputs["numeric"]))


@keras.saving.register_keras_serializable(package="hvdtrain_tests")
class SavableNet(keras.Model):
    """A subclassed model done right for ``model.keras``: registered, with ``get_config``; BatchNormalization
    inside, and it reads ``numeric`` only."""

    def __init__(self, num_outputs: int, units: int = 8, **kwargs: Any):
        super().__init__(**kwargs)
        self.num_outputs, self.units = num_outputs, units
        self.hidden = keras.layers.Dense(units, activation="relu")
        self.norm = keras.layers.BatchNormalization()
        self.logits = keras.layers.Dense(num_outputs, dtype="float32")

    def call(self, inputs: dict[str, Any], training: bool = False) -> Any:
        return self.logits(self.norm(self.hidden(inputs["numeric"]), training=training))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "num_outputs": self.num_outputs, "units": self.units}


def bare_subclassed(contract: Any, params: dict[str, Any]) -> keras.Model:
    return BareNet(contract.num_outputs)


def savable_subclassed(contract: Any, params: dict[str, Any]) -> keras.Model:
    return SavableNet(contract.num_outputs, params.get("units", 8))
