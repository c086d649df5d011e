"""Model builders: the tabular MLP, transformer sizes up to DistilBERT's shape, mixed precision."""
from __future__ import annotations

import keras
import numpy as np
import pytest

from hvdtrain.core.config import ModelConfig
from hvdtrain.data.contract import InputShape
from hvdtrain.model.models import build_model

TABULAR = InputShape(0, 0, 3, "label", kind="mlp", inputs=("numeric", "categorical"), numeric_features=4,
                     cardinalities=(3, 5))


def test_mlp_reads_numeric_and_categorical_and_returns_logits() -> None:
    model = build_model(ModelConfig(kind="mlp", hidden_units=[16, 8], categorical_embed_dim=4), TABULAR)
    assert sorted(t.name for t in model.inputs) == ["categorical", "numeric"]
    x = {"numeric": np.random.default_rng(0).normal(size=(5, 4)).astype("float32"),
         "categorical": np.array([[0, 0], [1, 4], [2, 3], [7, -1], [2, 99]], dtype="int64")}
    logits = model.predict(x, verbose=0)
    assert logits.shape == (5, 3) and np.isfinite(logits).all()
    table = model.get_layer("categorical_embedding")
    assert table.input_dim == 3 + 5  # one table, per-column offsets
    # An index outside its column's range reads that column's unknown bucket, not another column's rows.
    unknown = {"numeric": x["numeric"][:1].repeat(2, 0), "categorical": np.array([[0, 0], [9, -3]], "int64")}
    out = model.predict(unknown, verbose=0)
    np.testing.assert_allclose(out[0], out[1], rtol=1e-6)


@pytest.mark.parametrize("inputs", [("numeric",), ("categorical",)])
def test_mlp_with_one_kind_of_feature(inputs) -> None:
    shape = InputShape(0, 0, 2, "label", kind="mlp", inputs=inputs, numeric_features=3, cardinalities=(4,))
    model = build_model(ModelConfig(kind="mlp", hidden_units=[4]), shape)
    assert [t.name for t in model.inputs] == list(inputs)


def test_transformer_scales_to_distilbert_shape() -> None:
    cfg = ModelConfig(embed_dim=768, num_heads=12, ff_dim=3072, num_layers=6, dropout=0.1)
    model = build_model(cfg, InputShape(max_length=512, vocab_size=30522, num_classes=2, label_feature="label"))
    # DistilBERT-base has 66.4M parameters; the same shape here (no embedding LayerNorm, mean pooling) ~ 66.4M.
    assert model.count_params() == pytest.approx(66.4e6, rel=0.01)
    assert sum(1 for layer in model.layers if layer.name.endswith("_attention")) == 6
    attention = model.get_layer("block0_attention")
    assert attention.num_heads == 12 and attention.key_dim == 64


@pytest.mark.parametrize("precision,compute", [("none", "float32"), ("bfloat16", "bfloat16"),
                                               ("float16", "float16")])
def test_mixed_precision_keeps_float32_logits_and_the_global_policy(precision: str, compute: str) -> None:
    shape = InputShape(max_length=8, vocab_size=20, num_classes=2, label_feature="label")
    model = build_model(ModelConfig(embed_dim=8, num_heads=2, ff_dim=8), shape, precision)
    assert model.get_layer("block0_ffn_in").compute_dtype == compute
    assert model.get_layer("block0_ffn_in").variable_dtype == "float32"
    assert model.get_layer("logits").compute_dtype == "float32"
    ids = np.ones((2, 8), "int64")
    assert model({"input_ids": ids, "attention_mask": ids}).dtype == "float32"
    assert keras.config.dtype_policy().name == "float32"  # restored after building


def test_shape_and_kind_must_agree() -> None:
    with pytest.raises(ValueError, match="model.kind=mlp"):
        build_model(ModelConfig(), TABULAR)
