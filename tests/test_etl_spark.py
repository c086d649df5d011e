"""ETL on a local SparkSession with an embedded Hive (Derby) metastore."""
import json
import os

import numpy as np
import pytest

from hvdtrain import config, fs, manifest
from hvdtrain.errors import DataError

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def hive_cfg(tmp_path_factory):
    base = tmp_path_factory.mktemp("hive")
    return config.from_dict({
        "name": "etltest", "workdir": str(base),
        "source": {"table": "etltest.reviews", "sample": {"rows": 1500, "num_classes": 3, "seed": 11}},
        "etl": {"max_length": 24, "vocab_size": 300, "min_shards_per_split": 2},
    }, base_dir=str(base))


@pytest.fixture(scope="module")
def spark(hive_cfg):
    from etl import session

    s = session.get_session(hive_cfg, "local[2]")
    yield s
    s.stop()


def job(hive_cfg, tmp_path, **etl):
    data = hive_cfg.to_dict()
    data["etl"].update({"output": str(tmp_path / "data"), **etl})
    return config.from_dict(data, base_dir=str(tmp_path))


def read_back(m, split):
    """Every record of a split through tf.data + parse_example, using only the manifest's spec."""
    import tensorflow as tf

    dtypes = {"int64": tf.int64, "float32": tf.float32, "bytes": tf.string}
    spec = {k: tf.io.FixedLenFeature(f.shape, dtypes[f.dtype]) for k, f in m.features.items()}
    files = [m.shard_uri(s) for s in m.split(split).shards]
    ds = tf.data.TFRecordDataset(files, compression_type="GZIP" if m.compression == "gzip" else "")
    out = {k: [] for k in spec}
    for batch in ds.batch(256).map(lambda x: tf.io.parse_example(x, spec)):
        for k in spec:
            out[k].append(batch[k].numpy())
    return {k: np.concatenate(v) if v else np.array([]) for k, v in out.items()}


def test_hive_table_to_manifest_and_shards_that_read_back(spark, hive_cfg, tmp_path):
    from etl import job as etl_job
    from etl import sources, split

    sources.create_sample_table(spark, hive_cfg)
    cfg = job(hive_cfg, tmp_path)
    report = etl_job.run(spark, cfg)
    m = manifest.read(cfg.etl.output)
    assert report["rows_in"] == 1500 == report["rows_written"] + report["rows_rejected"] + report["duplicates_dropped"]
    assert sum(m.split(s).records for s in m.splits) == report["rows_written"]
    assert m.labels == ["politics", "science", "sports"]
    assert not fs.exists(os.path.join(cfg.etl.output, "_staging", ""))  or fs.listdir(os.path.join(cfg.etl.output, "_staging")) == []
    keys_seen = set()
    for name in ("train", "validation", "test"):
        sp = m.split(name)
        assert len(sp.shards) >= 2
        for shard in sp.shards:  # checksums and sizes as recorded
            import hashlib
            blob = fs.read_bytes(m.shard_uri(shard))
            assert len(blob) == shard.bytes and hashlib.sha256(blob).hexdigest() == shard.sha256
        got = read_back(m, name)
        assert len(got["label"]) == sp.records
        assert got["input_ids"].shape == (sp.records, 24)
        assert (got["attention_mask"].sum(axis=1) > 0).all()
        counts = np.bincount(got["label"], minlength=3)
        assert {m.labels[i]: int(c) for i, c in enumerate(counts) if c} == sp.class_counts()
        keys = {k.decode() for k in got["key"]}
        assert all(split.split_of(k, cfg.etl.splits) == name for k in keys)  # split is by key hash
        keys_seen |= keys
    assert len(keys_seen) == 1500
    assert m.source["sample"]["accuracy_ceiling"] > 0.8
    vocab = fs.read_bytes(os.path.join(cfg.etl.output, "vocab.txt")).decode().splitlines()
    assert vocab[0] == "[PAD]" and len(vocab) == m.vocab["size"]


def test_rerun_is_refused_without_overwrite_and_identical_with_it(spark, hive_cfg, tmp_path):
    from etl import job as etl_job
    from etl import sources

    sources.create_sample_table(spark, hive_cfg)
    cfg = job(hive_cfg, tmp_path)
    etl_job.run(spark, cfg)
    first = manifest.read(cfg.etl.output)
    with pytest.raises(DataError, match="already holds a dataset .* --overwrite"):
        etl_job.run(spark, cfg)
    # Same rows, different input partitioning: the shards must come out byte-identical.
    spark.table("etltest.reviews").repartition(7).write.mode("overwrite").saveAsTable("etltest.reviews_7")
    data = cfg.to_dict()
    data["etl"]["overwrite"] = True
    data["source"]["table"] = "etltest.reviews_7"
    etl_job.run(spark, config.from_dict(data))
    second = manifest.read(cfg.etl.output)
    for name in first.splits:
        assert [s.sha256 for s in first.split(name).shards] == [s.sha256 for s in second.split(name).shards]


def test_bad_rows_are_quarantined_with_rule_and_value(spark, hive_cfg, tmp_path):
    from etl import job as etl_job
    from etl import split

    fractions = hive_cfg.etl.splits
    test_key = next(f"k{i}" for i in range(1000) if split.split_of(f"k{i}", fractions) == "test")
    rows = [(f"ok{i}", f"good text number {i}", ["a", "b"][i % 2]) for i in range(60)] + [
        (None, "no key", "a"), ("nt", None, "a"), ("et", "   ", "b"), ("nl", "no label", None),
        ("ok1", "duplicate of ok1", "a"), (test_key, "label never seen in train", "zzz"),
    ]
    spark.createDataFrame(rows, "id string, text string, label string") \
        .write.mode("overwrite").saveAsTable("etltest.dirty")
    data = job(hive_cfg, tmp_path).to_dict()
    data["source"] = {"table": "etltest.dirty"}
    report = etl_job.run(spark, config.from_dict(data))
    assert report["rows_in"] == 66
    assert report["rejects_by_rule"] == {"key_null": 1, "text_null": 1, "text_empty": 1, "label_null": 1,
                                         "label_unknown": 1}
    assert report["duplicates_dropped"] == 1
    assert report["rows_in"] == report["rows_written"] + report["rows_rejected"] + report["duplicates_dropped"]
    rejects = spark.read.parquet(os.path.join(data["etl"]["output"], "rejects")).collect()
    assert {(r.rule, r.value) for r in rejects} >= {("label_unknown", "zzz"), ("text_empty", "   ")}
    saved = json.loads(fs.read_bytes(os.path.join(data["etl"]["output"], "etl_report.json")))
    assert saved["rows_rejected"] == 5


@pytest.mark.parametrize("source, message", [
    ({"table": "etltest.nope"}, "source.table etltest.nope does not exist in the Hive metastore"),
    ({"table": "etltest.dirty", "text_column": "body"}, "has no column source.text_column='body'"),
])
def test_bad_sources_fail_clearly_and_publish_nothing(spark, hive_cfg, tmp_path, source, message):
    from etl import job as etl_job

    spark.createDataFrame([("a", "b", "c")], "id string, text string, label string") \
        .write.mode("overwrite").saveAsTable("etltest.dirty")
    data = job(hive_cfg, tmp_path).to_dict()
    data["source"] = source
    with pytest.raises(DataError, match=message):
        etl_job.run(spark, config.from_dict(data))
    out = data["etl"]["output"]
    assert not fs.exists(os.path.join(out, "manifest.json"))
    assert not fs.exists(out) or set(fs.listdir(out)) <= {"_staging"}
