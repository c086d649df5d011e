"""High-cardinality, hashed and mixed features through the ETL on a local SparkSession (small tables: the
million-row run is the etl_high_cardinality benchmark)."""
import collections
import math

import numpy as np
import pytest

from hvdtrain.core import config
from hvdtrain.data import contract, features, manifest
from tests.support.spark_jvm import assert_local_default_fs
from tests.unit.test_tfrecord import read_with_tfrecord_package

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def base_cfg(tmp_path_factory):
    base = tmp_path_factory.mktemp("highcard")
    return config.from_dict({"name": "highcard", "workdir": str(base),
                             "source": {"path": str(base / "in"), "format": "parquet"},
                             "etl": {"max_length": 12, "vocab_size": 200, "min_shards_per_split": 2,
                                     "min_shard_mb": 0}}, base_dir=str(base))


@pytest.fixture(scope="module")
def spark(base_cfg):
    from etl import session

    s = session.get_session(base_cfg, "local[2]")
    assert_local_default_fs(s)
    s.conf.set("spark.sql.shuffle.partitions", "4")  # small tables: 200 near-empty shuffle tasks only cost time
    yield s
    s.stop()


def with_(cfg, tmp_path, **sections):
    data = cfg.to_dict()
    for name, values in sections.items():
        data[name] = {**data[name], **values}
    data["etl"]["output"] = str(tmp_path / "data")
    return config.from_dict(data, base_dir=str(tmp_path))


@pytest.fixture
def plan_sizes(spark, monkeypatch):
    """The length of the optimized plan of every query collected while the test runs, in order."""
    DataFrame = type(spark.range(1))  # pyspark 4: the classic DataFrame class, not pyspark.sql.DataFrame

    sizes = []
    collect = DataFrame.collect

    def recording(self):
        sizes.append(len(self._jdf.queryExecution().optimizedPlan().toString()))
        return collect(self)

    monkeypatch.setattr(DataFrame, "collect", recording)  # first()/head() collect too
    return sizes


N = 10_000


def rows_with(spark, distinct, n=N):
    return spark.range(n).selectExpr("CAST(id AS STRING) AS id", f"concat('v', id % {distinct}) AS city",
                                     "CAST(id % 97 AS DOUBLE) AS amount", "'x' AS label")


def test_statistic_plans_do_not_grow_from_10_to_10000_distinct_values(spark, base_cfg, tmp_path, plan_sizes):
    from etl import drift, tabular

    cfg = with_(base_cfg, tmp_path, source={"text_column": None, "numeric_columns": ["amount"],
                                            "categorical_columns": ["city"]}, etl={"max_categories": N})
    measured = {}
    for distinct in (10, 10_000):
        plan_sizes.clear()
        df = rows_with(spark, distinct)
        stats = tabular.fit(df, cfg.source, cfg.etl)
        known = stats["categories"]["city"]
        counts = drift.bin_counts(df, {"amount": stats["reference"]["numeric"]["amount"]["edges"]}, {"city": known})
        measured[distinct] = list(plan_sizes)
        # the counts are right, not only small: every value N / distinct times, ties ordered by value
        assert len(known) == distinct and known[:3] == sorted(f"v{i}" for i in range(distinct))[:3]
        assert counts["categorical"]["city"] == [N // distinct] * distinct + [0, 0]
        assert stats["reference"]["categorical"]["city"]["shares"] == pytest.approx([1 / distinct] * distinct + [0, 0])
        assert stats["distinct_values"] == {"city": distinct}
        assert sum(counts["numeric"]["amount"]) == N
    small, large = measured[10], measured[10_000]
    assert len(small) == len(large) >= 4  # the same queries...
    for s, big in zip(small, large):  # ...of the same size (expression ids may gain a digit or two)
        assert big <= s * 1.05 + 100, (small, large)


def test_a_capped_vocabulary_keeps_the_top_values_and_counts_the_rest_as_other(spark, base_cfg, tmp_path):
    from etl import stats

    df = spark.createDataFrame([(f"k{i}", ["a", "b", "b", "c", "c", "c", None][i % 7]) for i in range(700)],
                               "id string, city string")
    got = stats.category_counts(df, ["city"], 2)["city"]
    assert got.top == [("c", 300), ("b", 200)] and (got.rows, got.missing, got.distinct) == (600, 100, 3)
    assert got.bin_counts() == [300, 200, 100, 100]  # c, b, other (a), missing


ROWS = 240
NON_FINITE_TEXT = {3: "NaN", 17: "Infinity", 40: "-Infinity", 77: "inf"}  # row -> amount (a STRING column)
NON_FINITE_DOUBLE = {5: float("nan"), 23: float("inf"), 61: float("-inf")}  # row -> price (a DOUBLE column)


def mixed_rows():
    out = []
    for i in range(ROWS):
        amount = NON_FINITE_TEXT.get(i, None if i % 11 == 0 else f"{(i % 13) * 1.5}")
        price = NON_FINITE_DOUBLE.get(i, float(i % 29))
        out.append((f"r{i:04d}", f"words about thing {i % 9} and more {i % 4}", ["pos", "neg"][i % 2],
                    amount, price, ["red", "green", "blue", None][i % 4], f"user-{i * 7919 % 1000}"))
    return out


def test_text_numeric_vocabulary_and_hashed_columns_in_one_run_with_non_finite_values_rejected(
        spark, base_cfg, tmp_path):
    from etl import job as etl_job

    rows = mixed_rows()
    spark.createDataFrame(rows, "id string, text string, label string, amount string, price double, "
                                "colour string, user string").write.mode("overwrite").parquet(base_cfg.source.path)
    cfg = with_(base_cfg, tmp_path, source={"numeric_columns": ["amount", "price"],
                                            "categorical_columns": ["colour", "user"]},
                etl={"categorical_hash_buckets": {"user": 64}})
    report = etl_job.run(spark, cfg)
    bad = set(NON_FINITE_TEXT) | set(NON_FINITE_DOUBLE)
    assert report["rejects_by_rule"] == {"non_finite:amount": len(NON_FINITE_TEXT),
                                         "non_finite:price": len(NON_FINITE_DOUBLE)}
    assert report["rows_written"] == ROWS - len(bad)
    rejects = spark.read.parquet(f"{cfg.etl.output}/rejects").collect()
    assert sorted((r["key"], r["rule"], r["value"]) for r in rejects) == sorted(
        [(f"r{i:04d}", "non_finite:amount", v) for i, v in NON_FINITE_TEXT.items()]
        + [(f"r{i:04d}", "non_finite:price", {5: "NaN", 23: "Infinity", 61: "-Infinity"}[i])
           for i in NON_FINITE_DOUBLE])

    m = manifest.read(cfg.etl.output)
    assert set(m.features) == {"input_ids", "attention_mask", "numeric", "categorical", "label", "key"}
    tab = m.preprocessing["tabular"]
    assert tab["hash_buckets"] == {"user": 64} and tab["hash"] == features.HASH and "user" not in tab["categories"]
    assert tab["cardinalities"] == [4, 65]  # red/green/blue + unknown; 64 buckets + missing
    assert all(math.isfinite(tab["numeric"][c][k]) for c in ("amount", "price") for k in ("mean", "std", "median"))
    # one dataset feeds the text model and the tabular one; builders see the bucket counts
    assert contract.check_manifest(m, config.ModelConfig(kind="mlp")).hash_buckets == (0, 64)
    assert contract.check_manifest(m, config.ModelConfig(kind="transformer")).vocab_size == m.vocab["size"]

    by_key = {r[0]: r for r in rows}
    encoder = features.FeatureEncoder(None, tab)  # what scoring runs on raw rows
    for split in m.splits:
        got = read_with_tfrecord_package([m.shard_uri(s) for s in m.split(split).shards], m.compression,
                                         {"key": "byte", "numeric": "float", "categorical": "int",
                                          "input_ids": "raw"})
        if not got["key"]:
            continue
        numeric = np.array(got["numeric"], np.float32).reshape(-1, 2)
        assert np.isfinite(numeric).all() and not set(got["key"]) & {f"r{i:04d}" for i in bad}
        categorical = np.array(got["categorical"]).reshape(-1, 2)
        raw = [by_key[k] for k in got["key"]]
        assert categorical[:, 1].tolist() == [features.hash_bucket(r[6], 64) for r in raw]
        np.testing.assert_array_equal(encoder.encode(None, [[None if r[3] is None else float(r[3]), r[4]] for r in raw],
                                                     [[r[5], r[6]] for r in raw])["categorical"], categorical)
    counts = collections.Counter(r[5] for r in rows)
    assert set(tab["categories"]["colour"]) == {c for c in counts if c}


def test_category_ids_in_spark_sql_are_the_ids_scoring_computes_in_python(spark):
    """The ETL buckets and looks up categorical values on the JVM (``etl.tabular.category_ids``); scoring does it in
    Python (``features.category_ids_of``). Both on the same values: hashed columns at several bucket counts (a
    hash with its top bit set is negative in Spark, so ``pmod`` matters), a vocabulary column, and values that are
    empty, missing, unseen, non-ASCII, control characters or long."""
    import random

    from etl import tabular

    rng = random.Random(5)
    alphabet = "abcXYZ019 -_.,;:'\"\\/\t\n\x00\x1féüß漢字😀Ωł\u0301\u200b"
    values = ["", " ", "a", "A", "1", "1.0", "true", "x" * 300, None, *(
        "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 40))) for _ in range(3000))]
    vocab = sorted({v for v in values[::7] if v is not None})
    buckets = {"h2": 2, "h97": 97, "hbig": 2**31 - 2}
    stats = {"categorical_columns": ["h2", "voc", "h97", "hbig"], "hash_buckets": buckets, "hash": features.HASH,
             "categories": {"voc": vocab}, "numeric_columns": []}
    df = spark.createDataFrame([(i, v, v, v, v) for i, v in enumerate(values)], "id long, a string, b string, "
                               "c string, d string").repartition(3)
    got = tabular.category_ids(df, stats, ["a", "b", "c", "d"], ["i0", "i1", "i2", "i3"]).orderBy("id") \
        .select("i0", "i1", "i2", "i3").toPandas().to_numpy()
    want = features.category_ids_of(stats, [values] * 4, len(values))
    assert got.dtype == np.int64 and got.shape == want.shape == (len(values), 4)
    np.testing.assert_array_equal(got, want)
    assert got[:, 1].max() == len(vocab) and (got[:, 1] == 0).sum() > 1000  # found and unseen values both met
    assert set(got[:, 0]) == {0, 1, 2} and got[:, 3].max() > 2**30  # every bucket of 2; large buckets reached
