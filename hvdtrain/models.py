"""Keras 3 model builders, chosen by ``model.kind``.

Models take a dict of ``input_ids`` and ``attention_mask`` (int64, shape
``[batch, max_length]``, mask 1 = token, 0 = padding) and return class logits.
They are functional graphs of built-in layers and ``keras.ops`` only, so
``model.keras`` (and the MLflow Keras flavor built on it) loads with plain
``keras.models.load_model``: no hvdtrain import and no custom objects at
serving time.
"""
from __future__ import annotations

from typing import Any, Callable

import keras
from keras import layers, ops

from hvdtrain.config import ModelConfig


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


def transformer_classifier(cfg: ModelConfig, vocab_size: int, max_length: int, num_classes: int) -> keras.Model:
    """Transformer encoder text classifier returning logits ``[batch, num_classes]``."""
    input_ids = keras.Input((max_length,), dtype="int64", name="input_ids")
    attention_mask = keras.Input((max_length,), dtype="int64", name="attention_mask")
    # [batch, 1, keys]: every query position attends to real tokens only.
    key_mask = ops.expand_dims(ops.cast(attention_mask, "bool"), 1)
    x = layers.Dropout(cfg.dropout, name="embedding_dropout")(_embed(input_ids, vocab_size, max_length,
                                                                     cfg.embed_dim))
    for i in range(cfg.num_layers):
        x = _encoder_block(x, key_mask, cfg, name=f"block{i}")
    x = layers.Dropout(cfg.dropout, name="pooled_dropout")(_masked_mean(x, attention_mask))
    logits = layers.Dense(num_classes, name="logits")(x)
    return keras.Model({"input_ids": input_ids, "attention_mask": attention_mask}, logits, name="text_transformer")


BUILDERS: dict[str, Callable[[ModelConfig, int, int, int], keras.Model]] = {
    "transformer": transformer_classifier,
}


def build_model(model_cfg: ModelConfig, vocab_size: int, max_length: int, num_classes: int) -> keras.Model:
    """The model named by ``model_cfg.kind``, built for this dataset's sizes."""
    return BUILDERS[model_cfg.kind](model_cfg, vocab_size, max_length, num_classes)
