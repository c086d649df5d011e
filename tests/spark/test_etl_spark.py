"""ETL on a local SparkSession with an embedded Hive (Derby) metastore."""
import collections
import functools
import hashlib
import json
import os

import numpy as np
import pytest

from hvdtrain.core import config
from hvdtrain.core.errors import DataError
from hvdtrain.data import manifest
from hvdtrain.hadoop import fs
from tests.support.spark_jvm import assert_local_default_fs
from tests.unit.test_tfrecord import read_with_tfrecord_package

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def hive_cfg(tmp_path_factory):
    base = tmp_path_factory.mktemp("hive")
    return config.from_dict({
        "name": "etltest", "workdir": str(base),
        "source": {"table": "etltest.reviews", "sample": {"rows": 1500, "num_classes": 3, "seed": 11}},
        "etl": {"max_length": 24, "vocab_size": 300, "min_shards_per_split": 2, "min_shard_mb": 0},
    }, base_dir=str(base))


@pytest.fixture(scope="module")
def spark(hive_cfg):
    from etl import session

    s = session.get_session(hive_cfg, "local[2,4]")  # local[N,F]: a failed task is retried (up to F attempts)
    assert_local_default_fs(s)
    s.sql("CREATE DATABASE IF NOT EXISTS etltest")
    yield s
    s.stop()


def files_under(out):
    """Every file under a local output folder (a failed run must leave none, staged ones included)."""
    return [os.path.join(root, n) for root, _, names in os.walk(out) for n in names]


def stage_tasks(spark, group):
    """The number of tasks of each stage Spark ran for a job group."""
    tracker = spark.sparkContext.statusTracker()
    stages = [tracker.getStageInfo(s) for j in tracker.getJobIdsForGroup(group)
              for s in tracker.getJobInfo(j).stageIds]
    return [s.numTasks for s in stages if s is not None]


def job(hive_cfg, tmp_path, **etl):
    data = hive_cfg.to_dict()
    data["etl"].update({"output": str(tmp_path / "data"), **etl})
    return config.from_dict(data, base_dir=str(tmp_path))


def read_back(m, split):
    """Every record of a split through tf.data + parse_example, using only the manifest's features."""
    import tensorflow as tf

    from hvdtrain.data import pipeline

    parser = pipeline.Parser(m)
    files = [m.shard_uri(s) for s in m.split(split).shards]
    ds = tf.data.TFRecordDataset(files, compression_type="GZIP" if m.compression == "gzip" else "")
    out = {k: [] for k in m.features}
    for batch in ds.batch(256).map(parser.batch):
        for k in m.features:
            out[k].append(batch[k].numpy())
    return {k: np.concatenate(v) if v else np.array([]) for k, v in out.items()}


def test_hive_table_to_manifest_and_shards_that_read_back(spark, hive_cfg, tmp_path):
    from etl import job as etl_job
    from etl import sources, split

    sources.create_sample_table(spark, hive_cfg)
    cfg = job(hive_cfg, tmp_path)
    spark.sparkContext.setJobGroup("etl-read-back", "the ETL under test")
    persisted = spark.sparkContext._jsc.getPersistentRDDs().size()
    report = etl_job.run(spark, cfg)
    # Nothing the run cached outlives it (a long-lived session runs many ETLs: a bench, a notebook, a scheduler)
    assert spark.sparkContext._jsc.getPersistentRDDs().size() == persisted
    # Tasks per stage follow the data, not spark.sql.shuffle.partitions: a cached plan keeping all 200 shuffle
    # partitions made every later stage run 200 Python tasks (the ETL took 42 s instead of 2 s on these rows).
    assert max(stage_tasks(spark, "etl-read-back")) <= 16
    m = manifest.read(cfg.etl.output)
    assert report["rows_in"] == 1500 == report["rows_written"] + report["rows_rejected"] + report["duplicates_dropped"]
    assert sum(m.split(s).records for s in m.splits) == report["rows_written"]
    assert m.labels == ["politics", "science", "sports"]
    assert not fs.exists(os.path.join(cfg.etl.output, "_staging"))
    keys_seen = set()
    for name in ("train", "validation", "test"):
        sp = m.split(name)
        assert len(sp.shards) >= 2
        for shard in sp.shards:  # checksums and sizes as recorded
            blob = fs.read_bytes(m.shard_uri(shard))
            assert len(blob) == shard.bytes and hashlib.sha256(blob).hexdigest() == shard.sha256
        got = read_back(m, name)
        assert len(got["label"]) == sp.records
        assert got["input_ids"].shape == (sp.records, 24)
        assert (got["attention_mask"].sum(axis=1) > 0).all()
        counts = np.bincount(got["label"], minlength=3)
        assert {m.labels[i]: int(c) for i, c in enumerate(counts) if c} == sp.class_counts()
        # record for record, the same values through an independent reader (the `tfrecord` package)
        # (token features are packed: raw bytes, decoded here with numpy from the manifest's encoding)
        assert (m.features["input_ids"].encoding, m.features["attention_mask"].encoding) == ("u16le", "u8")
        other = read_with_tfrecord_package([m.shard_uri(s) for s in sp.shards], m.compression,
                                           {"key": "byte", "label": "int", "input_ids": "raw",
                                            "attention_mask": "raw"})
        assert other["key"] == [k.decode() for k in got["key"]]
        np.testing.assert_array_equal(np.array(other["label"]).reshape(-1), got["label"])
        for feature in ("input_ids", "attention_mask"):
            dtype = manifest.ENCODINGS[m.features[feature].encoding]
            np.testing.assert_array_equal(np.stack([np.frombuffer(bytes.fromhex(h), dtype) for h in other[feature]]),
                                          got[feature])
        keys = {k.decode() for k in got["key"]}
        assert all(split.split_of(k, cfg.etl.splits) == name for k in keys)  # split is by key hash
        keys_seen |= keys
    assert len(keys_seen) == 1500
    assert m.source["sample"]["accuracy_ceiling"] > 0.8
    vocab = fs.read_bytes(os.path.join(cfg.etl.output, "vocab.txt")).decode().splitlines()
    assert vocab[0] == "[PAD]" and len(vocab) == m.vocab["size"]


def test_wordpiece_from_spark_counts_is_byte_identical_under_any_partitioning(spark):
    """Counts reduced on the executors, only the top candidates collected, the same vocabulary whatever the
    input's partitioning; an unseen word spells with learned pieces."""
    from etl import job as etl_job
    from etl import sample, text
    from hvdtrain.core.config import SampleConfig
    from hvdtrain.data import wordpiece

    opts, cap = text.TextOptions(max_length=16), 120
    docs = [doc for _, doc, _ in sample.generate(SampleConfig(rows=600, seed=5))]
    docs += [f"unique{i:04d}word" for i in range(2 * wordpiece.candidates_limit(cap))]  # more words than reach the driver
    df = spark.createDataFrame([(d,) for d in docs], "text string")
    base = text.base(opts)
    exact = collections.Counter(w for d in docs for w in text.words(base, d))
    vocabs = []
    for parts in (1, 7):
        counts = etl_job.top_word_counts(df.repartition(parts), opts, cap)
        assert list(counts.items()) == wordpiece.top_words(exact, wordpiece.candidates_limit(cap))
        vocab = text.learn_vocab(counts, cap)
        vocabs.append("\n".join(vocab).encode())
    assert vocabs[0] == vocabs[1]
    vocab = vocabs[0].decode().split("\n")
    assert len(vocab) <= cap
    held_out = "uniquewords"  # never seen: its pieces must come from the learned units
    assert held_out not in exact
    pieces = [t for t in text.from_vocab(vocab, opts).encode(held_out).tokens if t != text.PAD]
    assert text.UNK not in pieces and any(len(p.removeprefix("##")) > 1 for p in pieces), pieces


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
    names = os.listdir(cfg.etl.output)  # published beside the old dataset, which is gone once replaced
    assert "train" not in names and [n for n in names if n.startswith("v-")] == [second.split("train").shards[0]
                                                                                 .path.split("/")[0]]
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
    assert report["duplicates_dropped"] == 1 and report["rows_written"] == 60
    assert report["rows_in"] == report["rows_written"] + report["rows_rejected"] + report["duplicates_dropped"]
    # every shard encoded by the compiled loops in the executors' Python (hvdtrain_native, installed by make env)
    assert report["shards_by_encoder"] == {"native": sum(report["shards_by_split"].values())}
    rejects = spark.read.parquet(os.path.join(data["etl"]["output"], "rejects")).collect()
    assert os.stat(os.path.join(data["etl"]["output"], "rejects")).st_mode & 0o777 == 0o700  # raw rows (#54)
    assert sorted((r.rule, r.value) for r in rejects) == sorted([
        ("key_null", None), ("text_null", None), ("text_empty", "   "), ("label_null", None),
        ("label_unknown", "zzz"), ("duplicate_key", "ok1")])
    dup = next(r for r in rejects if r.rule == "duplicate_key")  # the kept row is chosen by content
    assert dup.text == "good text number 1"
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
    assert files_under(out) == []


def file_job(hive_cfg, tmp_path, source, validation=None, **etl):
    data = job(hive_cfg, tmp_path, **etl).to_dict()
    data["source"] = source
    data["validation"] = validation or {}
    return config.from_dict(data, base_dir=str(tmp_path))


GOOD = [(f"r{i}", f"some words here number {i}", ["pos", "neg"][i % 2], i % 7) for i in range(80)]


@pytest.mark.parametrize("fmt", ["parquet", "orc", "json", "csv"])
def test_file_sources_read_back_record_for_record(spark, hive_cfg, tmp_path, fmt):
    from etl import job as etl_job

    src = str(tmp_path / f"src.{fmt}")
    spark.createDataFrame(GOOD, "id string, text string, label string, score int").coalesce(2) \
        .write.mode("overwrite").format(fmt).options(**({"header": "true"} if fmt == "csv" else {})).save(src)
    packed = fmt != "csv"  # one format written with int64 token lists (etl.packed_tokens=false)
    cfg = file_job(hive_cfg, tmp_path, {"path": src, "format": fmt}, compression="gzip", packed_tokens=packed)
    report = etl_job.run(spark, cfg)
    m = manifest.read(cfg.etl.output)
    assert report["rows_written"] == 80 and m.compression == "gzip"
    assert m.features["input_ids"].encoding == (manifest.packed_encoding(m.vocab["size"] - 1) if packed else "")
    got = set()
    for name in m.splits:
        back = read_back(m, name)
        got |= {k.decode() for k in back["key"]}
        assert back["input_ids"].dtype == np.int64 and (back["attention_mask"].sum(axis=1) > 0).all()
    assert got == {r[0] for r in GOOD}
    if not packed:  # plain int64 lists: any reader decodes them with a FixedLenFeature, no manifest needed
        import tensorflow as tf

        files = [m.shard_uri(s) for s in m.split("train").shards]
        spec = {"input_ids": tf.io.FixedLenFeature([m.features["input_ids"].shape[0]], tf.int64)}
        ds = tf.data.TFRecordDataset(files, compression_type="GZIP").batch(1000).map(
            lambda x: tf.io.parse_example(x, spec))
        np.testing.assert_array_equal(next(iter(ds))["input_ids"].numpy(), read_back(m, "train")["input_ids"])


def test_malformed_lines_wrong_types_and_rule_breaks_are_quarantined(spark, hive_cfg, tmp_path):
    from etl import job as etl_job

    lines = [json.dumps({"id": r[0], "text": r[1], "label": r[2], "score": r[3]}) for r in GOOD]
    lines += [
        '{"id": "bad1", "text": "unterminated',                                   # malformed JSON
        json.dumps({"id": "w1", "text": "fine text", "label": "pos", "score": "high"}),  # wrong type
        json.dumps({"id": "w2", "text": "fine text", "label": "pos", "score": 99}),      # out of range
        json.dumps({"id": "w3", "text": "x" * 500, "label": "pos", "score": 1}),         # over-long text
        json.dumps({"id": "w4", "text": "fine text", "label": "maybe", "score": 1}),     # not an allowed label
        json.dumps({"id": "W5", "text": "fine text", "label": "pos", "score": 1}),       # key breaks the regex
    ]
    src = tmp_path / "rows.jsonl"
    src.write_text("\n".join(lines) + "\n")
    cfg = file_job(hive_cfg, tmp_path, {"path": str(src), "format": "json",
                                        "schema": "id STRING, text STRING, label STRING, score STRING"},
                   {"ranges": {"score": {"min": 0, "max": 10}}, "text_max_chars": 200,
                    "allowed_values": {"label": ["pos", "neg"]}, "regex": {"id": "^[a-z]+[0-9]+$"}})
    report = etl_job.run(spark, cfg)
    assert report["rejects_by_rule"] == {"malformed_record": 1, "type:score": 1, "range:score": 1,
                                         "text_too_long": 1, "allowed_values:label": 1, "regex:id": 1}
    assert report["rows_in"] == 86 == report["rows_written"] + report["rows_rejected"] + report["duplicates_dropped"]
    rejects = {r.rule: r.value for r in spark.read.parquet(os.path.join(cfg.etl.output, "rejects")).collect()}
    assert rejects["type:score"] == "high" and rejects["range:score"] == "99" and rejects["regex:id"] == "W5"
    assert rejects["malformed_record"].startswith('{"id": "bad1"')


LATIN = [(f"r{i}", ["café crème brûlée", "plain words here"][i % 2] + f" {i}", ["pos", "neg"][i % 2])
         for i in range(40)]


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_a_latin1_file_read_as_utf8_fails_naming_the_encoding_and_reads_with_source_encoding(
        spark, hive_cfg, tmp_path, fmt):
    """Spark decodes bytes that are not UTF-8 as U+FFFD without a word: the ETL must refuse (not quarantine the
    accented half, not train on mangled text), and read the file exactly once the encoding is named."""
    from etl import job as etl_job

    if fmt == "csv":
        body = "id,text,label\n" + "".join(f"{k},{t},{lab}\n" for k, t, lab in LATIN)
    else:
        body = "".join(json.dumps({"id": k, "text": t, "label": lab}, ensure_ascii=False) + "\n"
                       for k, t, lab in LATIN)
    src = tmp_path / f"latin1.{fmt}"
    src.write_bytes(body.encode("latin-1"))
    cfg = file_job(hive_cfg, tmp_path, {"path": str(src), "format": fmt})
    column = "text" if fmt == "csv" else "record"  # a JSON line with bad bytes does not parse: its whole record
    with pytest.raises(DataError, match=rf"is not utf-8: 20 rows hold bytes that do not decode \(columns {column}; "
                                        r"first: key .*Nothing was published: set source.encoding .*iso-8859-1"):
        etl_job.run(spark, cfg)
    assert files_under(cfg.etl.output) == []
    cfg = file_job(hive_cfg, tmp_path, {"path": str(src), "format": fmt, "encoding": "iso-8859-1"})
    report = etl_job.run(spark, cfg)
    assert report["rows_written"] == 40 and report["rows_rejected"] == 0
    m = manifest.read(cfg.etl.output)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(fs.read_bytes(fs.join(m.root, m.vocab["tokenizer"])).decode("utf-8"))
    assert not any("\ufffd" in w for w in tok.get_vocab())
    assert "[UNK]" not in tok.encode("café crème brûlée").tokens  # the accented words were learnt as read


def test_reject_fraction_over_the_limit_aborts_and_publishes_nothing(spark, hive_cfg, tmp_path):
    from etl import job as etl_job

    rows = GOOD[:10] + [(f"e{i}", "  ", "pos", 1) for i in range(5)] + [(f"n{i}", None, "pos", 1) for i in range(2)]
    spark.createDataFrame(rows, "id string, text string, label string, score int") \
        .write.mode("overwrite").saveAsTable("etltest.mostly_bad")
    cfg = file_job(hive_cfg, tmp_path, {"table": "etltest.mostly_bad"}, {"fail_if_reject_fraction_over": 0.2})
    with pytest.raises(DataError, match=r"41.2% of 17 rows were rejected.*worst rules: text_empty \(5\), text_null \(2\)"):
        etl_job.run(spark, cfg)
    assert files_under(cfg.etl.output) == []


def test_empty_source_and_unwritable_output_fail_clearly(spark, hive_cfg, tmp_path):
    from etl import job as etl_job

    spark.createDataFrame([], "id string, text string, label string").write.mode("overwrite") \
        .saveAsTable("etltest.empty")
    with pytest.raises(DataError, match="Hive table etltest.empty is empty: nothing to write"):
        etl_job.run(spark, file_job(hive_cfg, tmp_path, {"table": "etltest.empty"}))
    spark.createDataFrame(GOOD, "id string, text string, label string, score int").write.mode("overwrite") \
        .saveAsTable("etltest.good")
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file where the output folder should go")
    cfg = file_job(hive_cfg, tmp_path, {"table": "etltest.good"})
    data = cfg.to_dict()
    data["etl"]["output"] = str(blocker / "data")
    with pytest.raises(Exception) as info:
        etl_job.run(spark, config.from_dict(data))
    assert str(blocker) in str(info.value)
    assert blocker.read_text().startswith("a file")


def test_tabular_columns_use_statistics_fitted_on_train_only(spark, hive_cfg, tmp_path):
    from etl import job as etl_job
    from etl import split

    fractions = hive_cfg.etl.splits
    rows = []
    for i in range(300):
        key = f"t{i}"
        is_train = split.split_of(key, fractions) == "train"
        # Non-train rows carry huge values: if they leaked into the fit, the mean would move.
        age = None if i % 10 == 0 else (float(i % 50) if is_train else 1e6)
        city = ("c", "c", "c", "a", "a", "b")[i % 6] if i % 7 else None  # c most frequent, b least
        rows.append((key, age, city, ["x", "y"][i % 2]))
    spark.createDataFrame(rows, "id string, age double, city string, label string") \
        .write.mode("overwrite").saveAsTable("etltest.tab")
    cfg = file_job(hive_cfg, tmp_path, {"table": "etltest.tab", "text_column": None,
                                        "numeric_columns": ["age"], "categorical_columns": ["city"]})
    etl_job.run(spark, cfg)
    m = manifest.read(cfg.etl.output)
    assert set(m.features) == {"numeric", "categorical", "label", "key"}
    tab = m.preprocessing["tabular"]
    train_ages = [r[1] for r in rows if r[1] is not None and split.split_of(r[0], fractions) == "train"]
    assert tab["numeric"]["age"]["mean"] == pytest.approx(np.mean(train_ages))
    train_cities = collections.Counter(r[2] for r in rows if r[2] and split.split_of(r[0], fractions) == "train")
    assert len(set(train_cities.values())) == 3  # distinct counts: the order is decided by count alone
    assert tab["categories"]["city"] == [c for c, _ in train_cities.most_common()] == ["c", "a", "b"]
    got = read_back(m, "train")
    assert got["numeric"].shape == (m.split("train").records, 1)
    assert abs(float(np.mean(got["numeric"]))) < 1e-5  # standard-scaled on train (imputed rows add the mean)
    assert set(got["categorical"].ravel().tolist()) <= {0, 1, 2, 3} and 0 in got["categorical"].ravel()
    for name in m.splits:  # float and int features, record for record, through the independent reader too
        mine = read_back(m, name)
        other = read_with_tfrecord_package([m.shard_uri(s) for s in m.split(name).shards], m.compression,
                                           {"key": "byte", "numeric": "float", "categorical": "int", "label": "int"})
        assert other["key"] == [k.decode() for k in mine["key"]]
        np.testing.assert_array_equal(np.array(other["numeric"], np.float32).reshape(mine["numeric"].shape),
                                      mine["numeric"])
        np.testing.assert_array_equal(np.array(other["categorical"]).reshape(mine["categorical"].shape),
                                      mine["categorical"])
        np.testing.assert_array_equal(np.array(other["label"]).reshape(-1), mine["label"])
    # drift reference for scoring: training deciles and category shares, and a PSI check against them
    from etl import drift as etl_drift
    from hvdtrain.data import drift

    ref = tab["reference"]
    assert ref["categorical"]["city"]["bins"] == tab["categories"]["city"] + [drift.OTHER, drift.MISSING]
    train_rows = [r for r in rows if split.split_of(r[0], fractions) == "train"]
    missing = sum(r[1] is None for r in train_rows) / len(train_rows)
    assert ref["numeric"]["age"]["shares"][-1] == pytest.approx(missing) and sum(ref["numeric"]["age"]["shares"]) \
        == pytest.approx(1.0)
    edges = {"age": ref["numeric"]["age"]["edges"]}
    cats = {"city": tab["categories"]["city"]}
    same = spark.createDataFrame(train_rows, "id string, age double, city string, label string")
    moved = spark.createDataFrame([(f"m{i}", 1e6, "z", "x") for i in range(100)],
                                  "id string, age double, city string, label string")
    calm = drift.report(ref, etl_drift.bin_counts(same, edges, cats), 0.2, 0.05)
    shifted = drift.report(ref, etl_drift.bin_counts(moved, edges, cats), 0.2, 0.05)
    assert not calm["drifted"] and calm["columns"]["age"]["psi"] < 0.01
    assert shifted["drifted"] and {a.split(":")[0] for a in shifted["alerts"]} == {"numeric column age",
                                                                                   "categorical column city"}


# -- row accounting and the commit protocol under faults (hooks: etl/faults.py) -------------------------

FAULT_ROWS = [(f"f{i:03d}", f"text of row {i} with words {i % 13}", ["a", "b"][i % 3 == 0]) for i in range(240)] + [
    ("f007", "a duplicate of f007", "a"), ("f100", "another duplicate", "b"), ("bad", None, "a")]


@pytest.fixture(scope="module")
def fault_table(spark):
    spark.createDataFrame(FAULT_ROWS, "id string, text string, label string").repartition(3) \
        .write.mode("overwrite").saveAsTable("etltest.faults")
    return "etltest.faults"


def fault_job(hive_cfg, tmp_path, name, **etl):
    data = job(hive_cfg, tmp_path / name, min_shards_per_split=2, **etl).to_dict()
    data["source"] = {"table": "etltest.faults"}
    return config.from_dict(data, base_dir=str(tmp_path))


@pytest.mark.parametrize("stage, named", [("validate", "validate"), ("split", "split"),
                                          ("write", r"write \((train|validation|test)\)")])
def test_a_row_dropped_between_stages_fails_naming_the_stage(spark, hive_cfg, tmp_path, fault_table, monkeypatch,
                                                             stage, named):
    from etl import faults
    from etl import job as etl_job

    monkeypatch.setenv(faults.ENV, f"drop_row:{stage}:f042")
    cfg = fault_job(hive_cfg, tmp_path, stage)
    with pytest.raises(DataError, match=rf"row accounting failed at stage '{named}': .* \(lost 1\); nothing was "
                                        "published"):
        etl_job.run(spark, cfg)
    assert files_under(cfg.etl.output) == []


def published_files(out: str) -> dict[str, bytes]:
    """Every published file's bytes by relative path; rejects (Parquet part names carry a job id) as sorted rows,
    the manifest without its timestamp and the report without its timings. A dataset published over another
    lies in a version folder v-<run>/ the manifest names: paths are compared without it."""
    import re

    import pyarrow.parquet as pq

    unversioned = functools.partial(re.sub, r"^v-[0-9a-f]+/", "")
    files = {}
    for root, _, names in os.walk(out):
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), out)
            files[unversioned(rel)] = open(os.path.join(root, name), "rb").read()
    rejects = [rel for rel in files if rel.startswith("rejects" + os.sep)]
    rows = sorted(map(str, pq.read_table(os.path.join(out, "rejects")).to_pylist())) if rejects else []
    for rel in rejects:
        del files[rel]
    files["rejects (rows)"] = "\n".join(rows).encode()
    doc = json.loads(files.pop("manifest.json"))
    doc.pop("created_at")
    for split in doc["splits"].values():
        for shard in split["shards"]:
            shard["path"] = unversioned(shard["path"])
    doc["vocab"] = {k: unversioned(v) if k in ("path", "tokenizer") else v for k, v in doc["vocab"].items()}
    files["manifest.json (no created_at)"] = json.dumps(doc, sort_keys=True).encode()
    report = json.loads(files.pop("etl_report.json"))
    report.pop("stage_seconds")
    files["etl_report.json (no timings)"] = json.dumps(report, sort_keys=True).encode()
    if "_hvdtrain_ledger.json" in files:  # what it names, as above: paths without v-<run>/, rejects as their rows
        owned = json.loads(files.pop("_hvdtrain_ledger.json"))
        entries = sorted(unversioned(e) for e in owned["entries"] if not e.startswith("rejects/"))
        files["_hvdtrain_ledger.json (entries)"] = json.dumps([owned["writer"], entries]).encode()
    return files


@pytest.mark.parametrize("hook,tasks_per_core,extra", [("fail_write_once:1", None, 1), ("write_twice:2", None, 1),
                                                        ("fail_write_once:1", 1, 2), ("write_twice:2", 1, 1)])
def test_retried_and_duplicated_write_tasks_publish_the_clean_run_byte_for_byte(spark, hive_cfg, tmp_path,
                                                                                fault_table, monkeypatch, hook,
                                                                                tasks_per_core, extra):
    """local[2,4]: the first attempt of shard 1's write dies after one record (Spark retries the task), or shard
    2 is written twice as a speculative attempt would. Staging holds the extra attempts' files; only the
    successful attempts' shards may be published. With one write task a core, the 6 shards are written by 2 tasks
    of 3: the failed attempt had staged shard 0 whole and one record of shard 1 (2 extra files), and the copy of
    shard 2 is the last of its task's run."""
    from etl import faults, publish
    from etl import job as etl_job

    monkeypatch.delenv(faults.ENV, raising=False)
    if tasks_per_core is not None:
        monkeypatch.setattr(etl_job, "TASKS_PER_CORE", tasks_per_core)
    cfg = fault_job(hive_cfg, tmp_path, "out", overwrite=True)  # the same config (and config hash) for both runs
    etl_job.run(spark, cfg)
    want = published_files(cfg.etl.output)
    staged: list[list[str]] = []
    real_act = publish.act

    def act(plan):  # observe (not change) the staging folder the publish works from
        folder = os.path.dirname(plan.moves[0][0])
        staged.append(sorted(n for n in os.listdir(folder) if n.endswith(".tfrecord")))
        return real_act(plan)

    monkeypatch.setattr(publish, "act", act)
    monkeypatch.setenv(faults.ENV, hook)
    group = f"faulty-etl-{hook.replace(':', '-')}-{tasks_per_core}"  # a group of its own: jobs are counted by it
    spark.sparkContext.setJobGroup(group, "fault hook " + hook)
    etl_job.run(spark, cfg)
    spark.sparkContext.setJobGroup("", "")

    got = published_files(cfg.etl.output)
    assert sorted(got) == sorted(want)
    for rel in want:
        assert hashlib.sha256(got[rel]).hexdigest() == hashlib.sha256(want[rel]).hexdigest(), rel
    shards = sum(len(m.shards) for m in manifest.read(cfg.etl.output).splits.values())
    assert shards == 6 and etl_job.write_tasks(shards, spark.sparkContext.defaultParallelism) == (
        6 if tasks_per_core is None else 2)
    assert len(staged[0]) == shards + extra, staged  # the extra attempts' files existed and were not published
    tracker = spark.sparkContext.statusTracker()
    stages = [st for j in tracker.getJobIdsForGroup(group) for st in tracker.getJobInfo(j).stageIds]
    failed = sum(tracker.getStageInfo(st).numFailedTasks for st in stages if tracker.getStageInfo(st))
    assert failed == (1 if hook.startswith("fail") else 0)


def test_shard_writing_tasks_set_up_libhdfs_in_their_own_process(spark, tmp_path):
    """A YARN container has HADOOP_HOME but only wildcard CLASSPATH entries, which libhdfs's JVM cannot use: each
    write task must run the set-up training ranks run (hvdtrain.hadoop.fs.prepare_hdfs_client) before it opens its shard.
    The real write function runs in Spark tasks over an hdfs:// stand-in (tests/support/hdfs_standin.py) that records the
    environment every shard was opened under."""
    from functools import partial

    from etl import writer
    from etl.fitted import Fitted
    from tests.support import hdfs_standin

    home, root = str(tmp_path / "hadoop"), tmp_path / "hdfs"
    root.mkdir()
    jars = hdfs_standin.fake_hadoop_client(home)
    plan = writer.ShardPlan({"train": 2, "validation": 1, "test": 1})
    rows = [(p, f"{i:04d}", f"k{p}-{i}", None, "ab"[i % 2]) for p in range(4) for i in range(5)]
    schema = f"{writer.SHARD} int, {writer.ORDER} string, key string, text string, label string"
    ordered = (spark.createDataFrame(rows, schema).repartition(4, writer.SHARD)
               .sortWithinPartitions(writer.SHARD, writer.ORDER))
    task = partial(hdfs_standin.write_batches_in_container, root=str(root), hadoop_home=home, plan=plan,
                   staging="hdfs://namenode:8020/data/_staging/r1", fitted=Fitted(labels=["a", "b"]),
                   columns=writer.Columns(numeric=(), categorical=(), several_texts=False, weight=None,
                                          encode_label={"a": 0, "b": 1}.__getitem__), compression="none")
    results = [writer.result_of(r) for r in ordered.mapInArrow(task, writer.RESULT_SCHEMA).collect()]
    assert sorted(r.records for r in results) == [5, 5, 5, 5]
    seen = hdfs_standin.writes(str(root))
    assert len(seen) == 4 and all(os.getpid() != w["pid"] for w in seen)  # opened in the tasks, not here
    for w in seen:
        assert w["CLASSPATH"] == f"{jars}:{hdfs_standin.CONTAINER_CLASSPATH}", w
        assert w["ARROW_LIBHDFS_DIR"] == os.path.join(home, "lib", "native"), w
    assert all((root / "data" / "_staging" / "r1" / os.path.basename(r.staged)).is_file() for r in results)


# -- row order (issue 53): shards never follow the key ----------------------------------------------------------

def test_rows_follow_a_seeded_hash_of_the_key_not_the_key(spark, hive_cfg, tmp_path):
    """A table whose label follows its key (an auto-increment ID over a sorted export): every shard holds its
    rows in the order of a seeded hash of the key, so consecutive records are an i.i.d.-like sample of the split
    even read in file order; the order is Spark SQL's, recomputed here in Python, and follows etl.seed."""
    from etl import job as etl_job
    from etl import split

    n = 4000
    rows = [(f"{i:07d}", float(i % 97), "late" if i >= 0.7 * n else "on_time") for i in range(n)]
    spark.createDataFrame(rows, "id string, delay double, label string").repartition(3) \
        .write.mode("overwrite").saveAsTable("etltest.sorted_labels")
    source = {"table": "etltest.sorted_labels", "text_column": None, "numeric_columns": ["delay"]}
    cfg = file_job(hive_cfg, tmp_path, source, min_shards_per_split=1)
    etl_job.run(spark, cfg)
    m = manifest.read(cfg.etl.output)
    assert m.row_order == "hash:1" and manifest.order_warning(m) is None
    late = m.labels.index("late")
    for name in ("train", "test"):
        keys = [k.decode() for k in read_back(m, name)["key"]]
        assert keys == sorted(keys, key=lambda k: (split.order_of(k, 1), k)) and keys != sorted(keys)
    # file order, batches of 64: the label mean varies as i.i.d. batches would (p(1-p)/64; the ratio's standard
    # error with ~50 batches is about 0.2, so [0.4, 2] is wide; key order gives a ratio near 64)
    labels = read_back(m, "train")["label"]
    means = (labels[:len(labels) // 64 * 64] == late).reshape(-1, 64).mean(axis=1)
    p = float(np.mean(labels == late))
    assert 0.4 < float(np.var(means, ddof=1)) / (p * (1 - p) / 64) < 2.0
    # another seed: the same rows in another order
    other = file_job(hive_cfg, tmp_path / "seed2", source, min_shards_per_split=1, seed=2)
    etl_job.run(spark, other)
    m2 = manifest.read(other.etl.output)
    first, second = ([k.decode() for k in read_back(d, "train")["key"]] for d in (m, m2))
    assert m2.row_order == "hash:2" and sorted(second) == sorted(first) and second != first


def test_the_spark_row_order_matches_python_on_any_key(spark):
    from etl import split

    keys = ["0000001", "", "ключ-7", "日本語キー", "a:b", "x" * 300, "naïve café", "😀 emoji"]
    df = split.add_order(spark.createDataFrame([(k,) for k in keys], "key string"), 11)
    assert {r["key"]: r["order"] for r in df.collect()} == {k: split.order_of(k, 11) for k in keys}


def test_a_regression_target_records_its_training_statistics_for_standardization(spark, hive_cfg, tmp_path):
    """Issue 53, item 3: training standardizes a regression target with these; a target near 1e8 with spread 1
    keeps its spread (the one-pass sum of squares would lose it)."""
    from etl import job as etl_job
    from etl import split

    rng = np.random.default_rng(3)
    rows = [(f"y{i}", float(i % 17), float(1e8 + rng.normal())) for i in range(600)]
    spark.createDataFrame(rows, "id string, x double, label double").write.mode("overwrite") \
        .saveAsTable("etltest.big_target")
    cfg = file_job(hive_cfg, tmp_path, {"table": "etltest.big_target", "text_column": None, "numeric_columns": ["x"]},
                   min_shards_per_split=1)
    doc = {k: v for k, v in cfg.to_dict().items() if k != "tune"}  # tune.metric follows the task
    cfg = config.from_dict({**doc, "task": "regression"}, base_dir=str(tmp_path))
    etl_job.run(spark, cfg)
    target = manifest.read(cfg.etl.output).preprocessing["target"]
    train = np.array([r[2] for r in rows if split.split_of(r[0], cfg.etl.splits) == "train"])
    assert target["count"] == len(train)
    assert target["mean"] == pytest.approx(float(np.mean(train)), abs=1e-6)
    assert target["std"] == pytest.approx(float(np.std(train)), rel=1e-6) and 0.8 < target["std"] < 1.2
    assert target["min"] == float(np.min(train))
    assert target["log_mean"] == pytest.approx(float(np.mean(np.log1p(train))), rel=1e-12)
