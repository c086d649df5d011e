"""The tabular MLP's numeric embeddings (model.numeric_embedding: ple | periodic; Gorishniy, Rubachev, Babenko,
NeurIPS 2022), the ETL's piecewise-linear edges on the scaled values, and categorical_embed_dim: auto.

Before: the MLP took the scaled numeric values as they are, the manifest recorded no bin edges, and every
categorical column had the one width ``categorical_embed_dim``.
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from hvdtrain.core import config as config_lib
from hvdtrain.core.config import ModelConfig
from hvdtrain.core.errors import ConfigError, DataError
from hvdtrain.data.contract import InputShape, check_manifest
from hvdtrain.data.manifest import FeatureSpec, Manifest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EDGES = ((-1.5, -0.25, 0.0, 0.5, 2.0), (0.0, 1.0), (3.0,))  # 4 bins, 1 bin, a constant column


def _shape() -> InputShape:
    return InputShape(0, 0, 2, "label", kind="mlp", inputs=("numeric", "categorical"), numeric_features=3,
                      cardinalities=(4, 300), ple_edges=EDGES)


def reference_ple(x: float, edges: tuple[float, ...], bins: int) -> np.ndarray:
    """The paper's piecewise-linear encoding of one value, padded with zeros to ``bins``, written out plainly."""
    out = np.zeros(bins)
    if len(edges) == 1:
        out[0] = x - edges[0]
        return out
    t_last = len(edges) - 2
    for t in range(len(edges) - 1):
        lo, hi = edges[t], edges[t + 1]
        if x < lo and t > 0:
            out[t] = 0.0
        elif x >= hi and t < t_last:
            out[t] = 1.0
        else:
            out[t] = (x - lo) / (hi - lo)
    return out


def test_ple_matches_the_papers_definition_at_between_and_beyond_the_edges() -> None:
    from hvdtrain.model.models import piecewise_linear_encoding

    points = [-9.0, -1.5, -1.0, -0.25, -0.1, 0.0, 0.2, 0.5, 1.0, 2.0, 7.0, 3.0, 0.999]
    rows = np.array([[p, p, p] for p in points], np.float32)
    got = np.asarray(piecewise_linear_encoding(rows, EDGES))
    assert got.shape == (len(points), 3, 4)
    want = np.array([[reference_ple(float(np.float32(p)), e, 4) for e in EDGES] for p in points])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    # at an inner edge the bin below is exactly full and the one above exactly empty
    at = np.asarray(piecewise_linear_encoding(np.array([[0.0, 1.0, 3.0]], np.float32), EDGES))[0]
    assert at[0].tolist() == [1.0, 1.0, 0.0, 0.0] and at[1].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert at[2].tolist() == [0.0, 0.0, 0.0, 0.0]


def test_mlp_with_ple_embeds_each_numeric_feature_in_numeric_embed_dim() -> None:
    from hvdtrain.model.models import build_model

    model = build_model(ModelConfig(kind="mlp", hidden_units=[8], numeric_embedding="ple", numeric_embed_dim=5),
                        _shape())
    layer = model.get_layer("numeric_embedding")
    assert tuple(layer.kernel.shape) == (3, 4, 5) and tuple(layer.bias.shape) == (3, 5)  # per feature, per bin
    assert tuple(model.get_layer("numeric_flat").output.shape) == (None, 15)
    out = model.predict(_batch(6), verbose=0)
    assert out.shape == (6, _shape().num_outputs) and np.isfinite(out).all()


def test_mlp_with_periodic_embeddings_has_trainable_frequencies_from_n_0_sigma() -> None:
    from hvdtrain.model.models import build_model

    cfg = ModelConfig(kind="mlp", hidden_units=[8], numeric_embedding="periodic", numeric_embed_dim=6,
                      periodic_frequencies=200, periodic_sigma=0.5)
    model = build_model(cfg, _shape())
    freq = model.get_layer("numeric_frequencies")
    assert tuple(freq.kernel.shape) == (3, 200) and freq.trainable
    assert 0.4 < float(np.std(np.asarray(freq.kernel))) < 0.6
    assert tuple(model.get_layer("numeric_embedding").kernel.shape) == (3, 400, 6)  # cos and sin of each
    assert model.predict(_batch(4), verbose=0).shape == (4, _shape().num_outputs)


def test_periodic_needs_no_edges_and_ple_without_them_is_refused_in_one_line() -> None:
    from hvdtrain.model.models import build_model

    no_edges = InputShape(0, 0, 2, "label", kind="mlp", inputs=("numeric",), numeric_features=3)
    build_model(ModelConfig(kind="mlp", numeric_embedding="periodic"), no_edges)
    with pytest.raises(ConfigError, match="model.numeric_embedding.*rerun the ETL"):
        build_model(ModelConfig(kind="mlp", numeric_embedding="ple"), no_edges)


def test_the_default_embeds_by_the_etls_edges_where_the_dataset_has_them_and_reads_values_where_not() -> None:
    """#53 item 6: the default (auto), chosen by measurement, is ple on a dataset whose manifest holds the ETL's
    quantile edges (every dataset of this version), and the plain scaled values on an older one, which still
    trains instead of being refused."""
    from hvdtrain.model.models import build_model

    with_edges = build_model(ModelConfig(kind="mlp", hidden_units=[8]), _shape())
    explicit = build_model(ModelConfig(kind="mlp", hidden_units=[8], numeric_embedding="ple"), _shape())
    assert [w.shape for w in with_edges.weights] == [w.shape for w in explicit.weights]
    assert with_edges.get_layer("numeric_embedding") is not None
    older = InputShape(0, 0, 2, "label", kind="mlp", inputs=("numeric",), numeric_features=3)
    plain = build_model(ModelConfig(kind="mlp", hidden_units=[8]), older)
    assert "numeric_embedding" not in [layer.name for layer in plain.layers]
    assert [w.shape for w in plain.weights] == [w.shape for w in build_model(
        ModelConfig(kind="mlp", hidden_units=[8], numeric_embedding="none"), older).weights]


@pytest.mark.slow
@pytest.mark.parametrize("embedding", ["ple", "periodic"])
def test_a_model_with_numeric_embeddings_saves_and_loads_with_plain_keras(tmp_path, embedding) -> None:
    from hvdtrain.model.models import build_model

    model = build_model(ModelConfig(kind="mlp", hidden_units=[8], numeric_embedding=embedding,
                                    categorical_embed_dim="auto"), _shape())
    x = _batch(5)
    path = str(tmp_path / "model.keras")
    model.save(path)
    np.save(tmp_path / "numeric.npy", x["numeric"])
    np.save(tmp_path / "categorical.npy", x["categorical"])
    np.save(tmp_path / "want.npy", model.predict(x, verbose=0))
    # A fresh interpreter that never imports hvdtrain: scoring's executors and MLflow serving load it this way.
    code = ("import sys, numpy as np, keras\n"
            f"d = {str(tmp_path)!r}\n"
            "m = keras.saving.load_model(d + '/model.keras', compile=False)\n"
            "x = {'numeric': np.load(d + '/numeric.npy'), 'categorical': np.load(d + '/categorical.npy')}\n"
            "np.testing.assert_allclose(m.predict(x, verbose=0), np.load(d + '/want.npy'), rtol=1e-5, atol=1e-6)\n"
            "assert not any(n.startswith('hvdtrain') for n in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), capture_output=True, text=True,
                          timeout=300, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_auto_categorical_width_follows_fastais_rule_capped_at_32() -> None:
    from hvdtrain.model.models import build_model, embedding_widths

    assert embedding_widths((2, 4, 10, 50, 300, 5000), "auto") == (2, 3, 6, 14, 32, 32)
    assert embedding_widths((2, 4), 8) == (8, 8)
    model = build_model(ModelConfig(kind="mlp", hidden_units=[8], categorical_embed_dim="auto"), _shape())
    assert model.get_layer("categorical_embedding0").output_dim == 3
    assert model.get_layer("categorical_embedding1").output_dim == 32
    assert model.get_layer("categorical_embedding1").input_dim == 300
    # an index outside a column's range reads that column's unknown bucket, as with one shared table
    x = _batch(2)
    x["categorical"] = np.array([[0, 0], [9, -4]], np.int64)
    x["numeric"] = np.repeat(x["numeric"][:1], 2, axis=0)
    out = model.predict(x, verbose=0)
    np.testing.assert_allclose(out[0], out[1], rtol=1e-6)


def test_config_takes_auto_and_the_embedding_fields_and_names_bad_values() -> None:
    cfg = config_lib.from_dict({"name": "t", "model": {"kind": "mlp", "categorical_embed_dim": "auto",
                                                       "numeric_embedding": "ple", "numeric_embed_dim": 12}})
    assert cfg.model.categorical_embed_dim == "auto" and cfg.model.numeric_embedding == "ple"
    assert config_lib.from_dict({"name": "t", "model": {"categorical_embed_dim": 4}}).model.categorical_embed_dim == 4
    defaults = ModelConfig()
    assert (defaults.numeric_embedding, defaults.categorical_embed_dim) == ("auto", 8)
    with pytest.raises(ConfigError, match="model.numeric_embedding must be one of auto, none, ple, periodic"):
        config_lib.from_dict({"name": "t", "model": {"numeric_embedding": "splines"}})
    with pytest.raises(ConfigError, match="model.categorical_embed_dim"):
        config_lib.from_dict({"name": "t", "model": {"categorical_embed_dim": "wide"}})
    with pytest.raises(ConfigError, match="model.periodic_sigma must be a finite number > 0"):
        config_lib.from_dict({"name": "t", "model": {"periodic_sigma": 0}})
    with pytest.raises(ConfigError, match="etl.ple_bins must be in"):
        config_lib.from_dict({"name": "t", "etl": {"ple_bins": 0}})


def _manifest(tabular: dict) -> Manifest:
    return Manifest(features={"numeric": FeatureSpec("float32", [3]), "label": FeatureSpec("int64", [])},
                    label_feature="label", labels=["a", "b"], splits={}, preprocessing={"tabular": tabular},
                    task="binary")


def test_the_contract_carries_the_etls_edges_and_ple_without_them_names_the_fix() -> None:
    edges = [list(e) for e in EDGES]
    shape = check_manifest(_manifest({"ple_edges": edges}), ModelConfig(kind="mlp", numeric_embedding="ple"))
    assert shape.ple_edges == EDGES
    assert check_manifest(_manifest({}), ModelConfig(kind="mlp")).ple_edges == ()  # none asked, none needed
    with pytest.raises(DataError, match="ple_edges.*rerun the ETL with this hvdtrain version"):
        check_manifest(_manifest({}), ModelConfig(kind="mlp", numeric_embedding="ple"))
    with pytest.raises(DataError, match="ple_edges"):  # one list short
        check_manifest(_manifest({"ple_edges": edges[:2]}), ModelConfig(kind="mlp", numeric_embedding="ple"))


def test_etl_edges_are_the_raw_quantiles_as_the_shards_hold_them() -> None:
    from etl import tabular

    assert tabular.ple_quantiles(4) == [0.0, 0.25, 0.5, 0.75, 1.0]
    tab = {"numeric_columns": ["a", "b", "c"], "datetime": {}, "numeric_features": ["a", "b", "c"],
           "categorical_columns": [], "impute": "mean", "impute_value": 0.0, "scale": True,
           "numeric": {"a": {"mean": 10.0, "std": 4.0, "median": 9.0, "count": 5.0},
                       "b": {"mean": 0.3, "std": 0.0, "median": 0.3, "count": 5.0},  # constant: std 0
                       "c": {"mean": None, "std": None, "median": None, "count": 0.0}}}  # never a value
    raw = [[2.0, 6.0, 6.0, 10.0, 30.0], [0.3] * 5, []]
    got = tabular.ple_edges(tab, raw)
    # what the shard writer makes of those raw values (hvdtrain.data.features.transform), deduplicated, sorted
    shards, _ = tabular.transform(tab, [[2.0, 0.3, None], [6.0, 0.3, None], [10.0, 0.3, None], [30.0, 0.3, None]],
                                  [])
    assert got[0] == sorted({float(v) for v in shards[:, 0]}) == [-2.0, -1.0, 0.0, 5.0]
    assert got[1] == [float(shards[0, 1])] and got[2] == [float(shards[0, 2])]


def _batch(n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"numeric": rng.normal(size=(n, 3)).astype(np.float32),
            "categorical": np.stack([rng.integers(0, 4, n), rng.integers(0, 300, n)], axis=1).astype(np.int64)}
