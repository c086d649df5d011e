"""The ETL's task options on a local SparkSession (issue 53, item 4): which binary label is positive, and sample
weights from a column."""
from __future__ import annotations

import numpy as np
import pytest

from hvdtrain.core import config
from hvdtrain.core.errors import DataError
from hvdtrain.data import manifest
from tests.support.spark_jvm import assert_local_default_fs

pytestmark = pytest.mark.spark

ROWS = [(f"f{i}", float(i % 13), ["late", "on_time"][i % 3 == 0]) for i in range(120)]  # 2/3 late


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tmp_path_factory.mktemp("task_columns")


@pytest.fixture(scope="module")
def spark(base):
    from etl import session

    cfg = config.from_dict({"name": "taskcols", "workdir": str(base),
                            "source": {"path": str(base / "in"), "format": "parquet"}}, base_dir=str(base))
    s = session.get_session(cfg, "local[2]")
    assert_local_default_fs(s)
    s.conf.set("spark.sql.shuffle.partitions", "2")
    yield s
    s.stop()


def make_cfg(base, tmp_path, src: str, task: dict, **source):
    return config.from_dict({
        "name": "taskcols", "workdir": str(tmp_path),
        "source": {"path": src, "format": "parquet", "text_column": None, "numeric_columns": ["x"], **source},
        "etl": {"output": str(tmp_path / "data"), "min_shards_per_split": 1, "min_shard_mb": 0},
        "task": task,
    }, base_dir=str(tmp_path))


def read_records(m: manifest.Manifest) -> dict[str, np.ndarray]:
    """Every record of every split through the manifest's own features."""
    import tensorflow as tf

    from hvdtrain.data import pipeline

    parser = pipeline.Parser(m)
    files = [m.shard_uri(s) for split in ("train", "validation", "test") for s in m.split(split).shards]
    out: dict[str, list] = {k: [] for k in m.features}
    for batch in tf.data.TFRecordDataset(files).batch(256).map(parser.batch):
        for k in m.features:
            out[k].append(batch[k].numpy())
    return {k: np.concatenate(v) for k, v in out.items()}


@pytest.fixture(scope="module")
def flights(spark, base):
    path = str(base / "flights.parquet")
    spark.createDataFrame(ROWS, "id string, x double, label string").coalesce(1).write.parquet(path)
    return path


def test_the_positive_label_is_encoded_1_and_listed_second(spark, flights, base, tmp_path):
    from etl import job as etl_job

    cfg = make_cfg(base, tmp_path, flights, {"kind": "binary", "positive_label": "late"})
    etl_job.run(spark, cfg)
    m = manifest.read(cfg.etl.output)
    assert m.labels == ["on_time", "late"]  # [negative, positive]: labels[1] is the positive class
    records = read_records(m)
    source = {key: label for key, _, label in ROWS}
    got = {k.decode(): int(v) for k, v in zip(records["key"], records["label"])}
    assert got == {k: int(source[k] == "late") for k in got} and len(got) == len(ROWS)
    assert m.split("train").class_counts()["late"] > m.split("train").class_counts()["on_time"]


def test_a_positive_label_that_is_not_a_label_fails_in_one_line(spark, flights, base, tmp_path):
    from etl import job as etl_job

    cfg = make_cfg(base, tmp_path, flights, {"kind": "binary", "positive_label": "delayed"})
    with pytest.raises(DataError) as info:
        etl_job.run(spark, cfg)
    message = str(info.value)
    assert "task.positive_label 'delayed'" in message and "'late'" in message and "'on_time'" in message
    assert "\n" not in message


def test_a_weight_column_is_written_as_the_weight_feature_and_bad_weights_are_quarantined(spark, base, tmp_path):
    from etl import job as etl_job

    weights = {f"w{i}": float(i % 5) * 0.5 for i in range(90)}  # 0 is a valid weight
    bad = {"neg": -1.0, "nan": float("nan"), "inf": float("inf"), "null": None}
    rows = [(k, float(i % 7), ["a", "b"][i % 2], w) for i, (k, w) in enumerate([*weights.items(), *bad.items()])]
    src = str(tmp_path / "weighted.parquet")
    spark.createDataFrame(rows, "id string, x double, label string, w double").coalesce(1).write.parquet(src)
    cfg = make_cfg(base, tmp_path, src, {"kind": "binary"}, weight_column="w")
    report = etl_job.run(spark, cfg)
    assert report["rejects_by_rule"] == {"weight_negative": 1, "weight_not_a_number": 2, "weight_null": 1}
    rejects = spark.read.parquet(str(tmp_path / "data" / "rejects")).collect()
    assert sorted((r.key, r.rule, r.value) for r in rejects) == [
        ("inf", "weight_not_a_number", "Infinity"), ("nan", "weight_not_a_number", "NaN"),
        ("neg", "weight_negative", "-1.0"), ("null", "weight_null", None)]
    m = manifest.read(cfg.etl.output)
    assert (m.features["weight"].dtype, m.features["weight"].shape) == ("float32", [])
    records = read_records(m)
    got = {k.decode(): float(w) for k, w in zip(records["key"], records["weight"])}
    assert got == weights
