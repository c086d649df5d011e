"""Keras 3 model builders, chosen by ``model.kind``.

``transformer`` takes a dict of ``input_ids`` and ``attention_mask`` (int64,
shape ``[batch, max_length]``, mask 1 = token, 0 = padding); ``mlp`` takes
``numeric`` (float32 ``[batch, k]``, already imputed and scaled by the ETL)
and/or ``categorical`` (int64 ``[batch, m]``, 0 = unknown bucket). Both return
float32 class logits, also under a mixed-precision policy (the logits layer
computes in float32, so the loss does too).

Models are functional graphs of built-in layers and ``keras.ops`` only, so
``model.keras`` (and the MLflow Keras flavor built on it) loads with plain
``keras.models.load_model``: no hvdtrain import and no custom objects at
serving time.
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable, Iterator

import keras
from keras import layers, ops

from hvdtrain.config import ModelConfig

if TYPE_CHECKING:
    from hvdtrain.data.contract import InputShape

# train.mixed_precision -> Keras dtype policy (variables stay float32 under both mixed policies).
POLICIES = {"none": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}


def _embed(input_ids: Any, vocab_size: int, max_length: int, embed_dim: int) -> Any:
    """Token embedding plus a learned embedding of each position."""
    positions = ops.cumsum(ops.ones_like(input_ids), axis=1) - 1  # 0..max_length-1, from the input's shape
    tokens = layers.Embedding(vocab_size, embed_dim, name="token_embedding")(input_ids)
    return tokens + layers.Embedding(max_length, embed_dim, name="position_embedding")(positions)


def _encoder_block(x: Any, key_mask: Any, cfg: ModelConfig, name: str) -> Any:
    """Post-norm encoder block: self-attention over real tokens, then a feed-forward net."""
    attended = layers.MultiHeadAttention(cfg.num_heads, cfg.embed_dim // cfg.num_heads, dropout=cfg.dropout,
                                         name=f"{name}_attention")(x, x, attention_mask=key_mask)
    x = layers.LayerNormalization(epsilon=1e-6, name=f"{name}_norm1")(
        x + layers.Dropout(cfg.dropout, name=f"{name}_drop1")(attended))
    ffn = layers.Dense(cfg.ff_dim, activation="gelu", name=f"{name}_ffn_in")(x)
    ffn = layers.Dense(cfg.embed_dim, name=f"{name}_ffn_out")(ffn)
    return layers.LayerNormalization(epsilon=1e-6, name=f"{name}_norm2")(
        x + layers.Dropout(cfg.dropout, name=f"{name}_drop2")(ffn))


def _masked_mean(x: Any, attention_mask: Any) -> Any:
    """Mean over real tokens (an all-padding row pools to zeros)."""
    mask = ops.expand_dims(ops.cast(attention_mask, x.dtype), -1)
    return ops.sum(x * mask, axis=1) / ops.maximum(ops.sum(mask, axis=1), 1.0)


def transformer_classifier(cfg: ModelConfig, shape: "InputShape") -> keras.Model:
    """Transformer encoder text classifier returning logits ``[batch, num_classes]``."""
    max_length = shape.max_length
    input_ids = keras.Input((max_length,), dtype="int64", name="input_ids")
    attention_mask = keras.Input((max_length,), dtype="int64", name="attention_mask")
    # [batch, 1, keys]: every query position attends to real tokens only.
    key_mask = ops.expand_dims(ops.cast(attention_mask, "bool"), 1)
    x = layers.Dropout(cfg.dropout, name="embedding_dropout")(_embed(input_ids, shape.vocab_size, max_length,
                                                                     cfg.embed_dim))
    for i in range(cfg.num_layers):
        x = _encoder_block(x, key_mask, cfg, name=f"block{i}")
    x = layers.Dropout(cfg.dropout, name="pooled_dropout")(_masked_mean(x, attention_mask))
    logits = layers.Dense(shape.num_classes, dtype="float32", name="logits")(x)
    return keras.Model({"input_ids": input_ids, "attention_mask": attention_mask}, logits, name="text_transformer")


def _categorical_embedding(categorical: Any, cardinalities: tuple[int, ...], dim: int) -> Any:
    """One embedding table per column, stored as a single table with per-column offsets.

    An index outside its column's range (a category the ETL never saw) maps to
    that column's unknown bucket 0 instead of reading another column's rows.
    """
    sizes = ops.convert_to_tensor(list(cardinalities), dtype="int64")
    offsets = ops.convert_to_tensor([sum(cardinalities[:j]) for j in range(len(cardinalities))], dtype="int64")
    known = ops.logical_and(categorical >= 0, categorical < sizes)
    ids = ops.where(known, categorical, ops.zeros_like(categorical)) + offsets
    table = layers.Embedding(sum(cardinalities), dim, name="categorical_embedding")(ids)  # [batch, m, dim]
    return layers.Flatten(name="categorical_flat")(table)


def mlp_classifier(cfg: ModelConfig, shape: "InputShape") -> keras.Model:
    """Tabular MLP: numeric features and categorical embeddings, concatenated, then Dense layers."""
    inputs, parts = {}, []
    if "numeric" in shape.inputs:
        inputs["numeric"] = keras.Input((shape.numeric_features,), dtype="float32", name="numeric")
        parts.append(inputs["numeric"])
    if "categorical" in shape.inputs:
        inputs["categorical"] = keras.Input((len(shape.cardinalities),), dtype="int64", name="categorical")
        parts.append(_categorical_embedding(inputs["categorical"], shape.cardinalities, cfg.categorical_embed_dim))
    x = parts[0] if len(parts) == 1 else layers.Concatenate(name="features")(parts)
    for i, units in enumerate(cfg.hidden_units):
        x = layers.Dense(units, activation="relu", name=f"dense{i}")(x)
        x = layers.Dropout(cfg.dropout, name=f"dropout{i}")(x)
    logits = layers.Dense(shape.num_classes, dtype="float32", name="logits")(x)
    return keras.Model(inputs, logits, name="tabular_mlp")


BUILDERS: dict[str, Callable[[ModelConfig, "InputShape"], keras.Model]] = {
    "transformer": transformer_classifier,
    "mlp": mlp_classifier,
}


@contextlib.contextmanager
def dtype_policy(mixed_precision: str) -> Iterator[None]:
    """Build layers under ``train.mixed_precision``'s policy; the global policy is restored after.

    Layers keep the policy they were built with (it is saved in ``model.keras``),
    so nothing global stays changed for later models in the same process.
    """
    if mixed_precision not in POLICIES:
        raise ValueError(f"train.mixed_precision must be one of {', '.join(POLICIES)} (got {mixed_precision!r})")
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(POLICIES[mixed_precision])
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def build_model(model_cfg: ModelConfig, shape: "InputShape", mixed_precision: str = "none") -> keras.Model:
    """The model named by ``model_cfg.kind``, built for this dataset's sizes."""
    if shape.kind != model_cfg.kind:
        raise ValueError(f"input shape is for model.kind={shape.kind}, not {model_cfg.kind}")
    with dtype_policy(mixed_precision):
        return BUILDERS[model_cfg.kind](model_cfg, shape)
