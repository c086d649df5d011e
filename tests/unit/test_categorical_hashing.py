"""Hashed categorical columns: the stable hash, its config, and what the manifest tells model builders (pure)."""
import json
import subprocess
import sys

import numpy as np
import pytest

import hvdtrain
from hvdtrain.core import config
from hvdtrain.core.errors import ConfigError
from hvdtrain.data import contract, features, manifest


def stats(**extra):
    base = {"numeric_columns": [], "categorical_columns": ["city", "user"], "impute": "mean", "impute_value": 0.0,
            "scale": True, "numeric": {}, "categories": {"city": ["a", "b"]}, "hash_buckets": {"user": 1000},
            "hash": features.HASH}
    return {**base, **extra}


def test_hash_buckets_are_pinned_and_the_same_in_another_process():
    # Pinned values: a change of the hash would silently move every hashed ID of every trained model.
    assert features.HASH == "xxhash64-42"
    assert [features.hash_bucket(v, 1000) for v in ("u1", "u2", "")] == [288, 373, 653]
    assert features.hash_bucket("user-42", 1_000_000) == 175242
    # XXH64 as a signed long, pmod: a hash with the top bit set (negative in Spark) lands where Spark's pmod puts it
    assert features.xxhash.xxh64_intdigest(b"u2", 42) >= 1 << 63 and features.hash_bucket("u2", 7) == 1 + (
        features.xxhash.xxh64_intdigest(b"u2", 42) - (1 << 64)) % 7
    here = [features.hash_bucket(f"id{i}", 97) for i in range(50)]
    code = "from hvdtrain.data import features; print([features.hash_bucket(f'id{i}', 97) for i in range(50)])"
    repo = hvdtrain.code_root()  # the folder that holds the package, as a fresh interpreter would import it
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "123"}, cwd=repo).stdout
    assert json.loads(there) == here
    assert all(1 <= b <= 97 for b in here) and len(set(here)) > 30  # spread over the buckets, 0 never used


def test_transform_hashes_named_columns_and_indexes_the_others():
    rows = [["a", "u1"], ["b", None], [None, "u2"], ["zzz", "u1"]]
    _, cat = features.transform(stats(), [[] for _ in rows], rows)
    assert cat.dtype == np.int64 and cat.shape == (4, 2)
    assert cat[:, 0].tolist() == [1, 2, 0, 0]  # vocabulary: 1 + index, unknown and missing 0
    assert cat[:, 1].tolist() == [features.hash_bucket("u1", 1000), 0, features.hash_bucket("u2", 1000),
                                  features.hash_bucket("u1", 1000)]
    assert features.cardinalities(stats()) == [3, 1001]
    # the same encoder the ETL writes with and scoring predicts with
    enc = features.FeatureEncoder(None, stats())
    np.testing.assert_array_equal(enc.encode(None, [[] for _ in rows], rows)["categorical"], cat)


def test_models_whose_etl_hashed_with_blake2b_still_score_in_their_buckets():
    """Manifests written before the ETL hashed in Spark SQL record ``blake2b-64``: their buckets are kept."""
    assert [features.hash_bucket(v, 1000, "blake2b-64") for v in ("u1", "u2", "")] == [131, 115, 757]
    assert features.hash_bucket("user-42", 1_000_000, "blake2b-64") == 375024
    old = stats(hash="blake2b-64")
    rows = [["a", "u1"], ["b", "u2"]]
    _, cat = features.transform(old, [[] for _ in rows], rows)
    assert cat[:, 1].tolist() == [131, 115]
    np.testing.assert_array_equal(features.FeatureEncoder(None, old).encode(None, [[] for _ in rows], rows)
                                  ["categorical"], cat)


def test_statistics_hashed_by_another_scheme_are_refused():
    with pytest.raises(ValueError, match="hashed with 'crc32'.*rerun the ETL"):
        features.FeatureEncoder(None, stats(hash="crc32"))


def job(**etl):
    return config.from_dict({"source": {"table": "db.t", "text_column": None, "categorical_columns": ["user", "city"]},
                             "etl": etl})


def test_hash_bucket_config_is_validated():
    assert job(categorical_hash_buckets={"user": 1_000_000}).etl.categorical_hash_buckets == {"user": 1_000_000}
    for bad in ({"user": 1}, {"user": 2**31}):
        with pytest.raises(ConfigError, match=r"etl\.categorical_hash_buckets must map each column to a bucket"):
            job(categorical_hash_buckets=bad)
    with pytest.raises(ConfigError, match=r"etl\.categorical_hash_buckets\.user must be an integer"):
        job(categorical_hash_buckets={"user": "many"})
    with pytest.raises(ConfigError, match=r"names columns that are not in source.categorical_columns \(user, city\)"):
        job(categorical_hash_buckets={"item": 10})


def test_the_contract_gives_model_builders_the_bucket_counts():
    tab = {**stats(), "cardinalities": features.cardinalities(stats())}
    m = manifest.Manifest(features={"categorical": manifest.FeatureSpec("int64", [2]),
                                    "label": manifest.FeatureSpec("int64", [])},
                          label_feature="label", labels=["x", "y"], splits={}, preprocessing={"tabular": tab})
    shape = contract.check_manifest(m, config.ModelConfig(kind="mlp"))
    assert shape.cardinalities == (3, 1001) and shape.hash_buckets == (0, 1000)


def test_ids_made_elsewhere_pass_through_and_an_array_of_values_is_refused():
    """The ETL hands over ids Spark SQL made (an integer array); an array of the values themselves is not ids."""
    ids = np.array([[1, 288], [0, 0]])
    _, cat = features.transform_arrays(stats(), np.zeros((2, 0)), ids, 2)
    np.testing.assert_array_equal(cat, ids)
    with pytest.raises(TypeError, match="categorical ids must be integers"):
        features.transform_arrays(stats(), np.zeros((2, 0)), np.array([["a", "u1"], ["5", None]], dtype=object), 2)
