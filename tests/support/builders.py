"""Small ``model.kind: custom`` builders the tests train: one with BatchNormalization (state every rank updates
on its own batches).

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
