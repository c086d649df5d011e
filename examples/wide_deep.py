"""A wide-and-deep model over text, numeric and categorical columns: an example of ``model.kind: custom``.

Use it with::

    model:
      kind: custom
      builder: "wide_deep:build"   # package.module:function
      code: ../examples            # the folder holding the module: shipped to every rank, YARN and Spark
      params: {embed_dim: 32, deep_units: [64, 32], dropout: 0.1}

``build(contract, params)`` gets the dataset's contract (each feature's
name, dtype, shape and vocabulary / category sizes, the task and
``contract.num_outputs``) and returns an uncompiled Keras model that outputs
``[batch, contract.num_outputs]`` raw scores; hvdtrain adds the task's loss
and metrics. ``MaskedMeanPool`` is a custom layer: registered for Keras
serialization, so ``model.keras`` (and scoring, which imports this module
first) loads it back.
"""
from __future__ import annotations

from typing import Any

import keras
from keras import layers, ops


@keras.saving.register_keras_serializable(package="wide_deep")
class MaskedMeanPool(layers.Layer):
    """Mean of token embeddings over the real tokens (mask 1), zeros for an all-padding row."""

    def call(self, embedded: Any, mask: Any) -> Any:
        weights = ops.expand_dims(ops.cast(mask, embedded.dtype), -1)
        return ops.sum(embedded * weights, axis=1) / ops.maximum(ops.sum(weights, axis=1), 1.0)


@keras.saving.register_keras_serializable(package="wide_deep")
class TakeColumn(layers.Layer):
    """Column ``index`` of a ``[batch, m]`` tensor (one categorical column)."""

    def __init__(self, index: int, **kwargs: Any):
        super().__init__(**kwargs)
        self.index = index

    def call(self, x: Any) -> Any:
        return x[:, self.index]

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "index": self.index}


def _inputs(contract: Any) -> dict[str, Any]:
    return {name: keras.Input(feature.shape, dtype=feature.dtype, name=name)
            for name, feature in contract.features.items()}


def build(contract: Any, params: dict[str, Any]) -> keras.Model:
    """Wide: a linear model of the numeric columns and one-hot categories. Deep: text, numeric and
    categorical embeddings through a small MLP. Their sum is the output."""
    dim = int(params.get("embed_dim", 32))
    inputs = _inputs(contract)
    wide, deep = [], []
    if "input_ids" in inputs:
        tokens = layers.Embedding(contract.features["input_ids"].vocab_size, dim, name="token_embedding")
        deep.append(MaskedMeanPool(name="text_pool")(tokens(inputs["input_ids"]), inputs["attention_mask"]))
    if "numeric" in inputs:
        wide.append(inputs["numeric"])
        deep.append(inputs["numeric"])
    if "categorical" in inputs:
        for j, size in enumerate(contract.features["categorical"].cardinalities):
            column = TakeColumn(j, name=f"column{j}")(inputs["categorical"])
            wide.append(layers.CategoryEncoding(size, output_mode="one_hot", name=f"onehot{j}")(column))
            deep.append(layers.Flatten(name=f"flat{j}")(layers.Embedding(size, dim, name=f"embed{j}")(column)))
    x = layers.Concatenate(name="deep_features")(deep) if len(deep) > 1 else deep[0]
    for i, units in enumerate(params.get("deep_units", [64, 32])):
        x = layers.Dense(int(units), activation="relu", name=f"deep{i}")(x)
        x = layers.Dropout(float(params.get("dropout", 0.1)), name=f"deep_dropout{i}")(x)
    out = layers.Dense(contract.num_outputs, dtype="float32", name="deep_out")(x)
    if wide:
        linear = layers.Concatenate(name="wide_features")(wide) if len(wide) > 1 else wide[0]
        out = layers.Add(name="wide_and_deep")([out, layers.Dense(contract.num_outputs, dtype="float32",
                                                                 name="wide_out")(linear)])
    return keras.Model(inputs, out, name="wide_deep")
