"""Batch scoring on local Spark with an embedded Hive metastore, against a tiny model trained here once.

The module's fixture runs the real chain once: sample Hive table -> ETL -> one
epoch of a tiny transformer (``python -m hvdtrain.training.train``, logged to a local
MLflow store and registered) -> ``etl.score_job.run`` into a Hive table. The
tests then check that one run (and a few cheap reruns) from every side.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from hvdtrain import score as score_lib
from hvdtrain.core import config
from hvdtrain.core.errors import DataError
from hvdtrain.data import manifest as manifest_lib
from hvdtrain.data import tfrecord
from hvdtrain.hadoop import fs, lease

# The module fixture (ETL, one training epoch, a scoring run) takes 2-3 minutes on an idle 2-core machine;
# the limit leaves room for a loaded one.
pytestmark = [pytest.mark.spark, pytest.mark.timeout(2400)]
REPO = Path(__file__).resolve().parents[2]
PARTITION = "ds=2026-11-23"


def _job(base: Path, **extra) -> dict:
    data = {
        "name": "scoretest", "workdir": str(base / "work"),
        "source": {"table": "scoretest.reviews", "sample": {"rows": 1200, "num_classes": 3, "seed": 5}},
        "etl": {"max_length": 24, "vocab_size": 300, "min_shards_per_split": 1},
        "model": {"kind": "transformer", "embed_dim": 16, "num_heads": 2, "ff_dim": 32, "num_layers": 1},
        "train": {"epochs": 1, "batch_size": 32, "progress": "log"},
        "checkpoint": {"enabled": False},
        "tracking": {"registered_model_name": "scoretest_model"},
        "score": {"arrow_batch": 100, "predict_batch": 64, "partitions": 6},
    }
    for section, values in extra.items():
        data.setdefault(section, {}).update(values) if isinstance(values, dict) else data.update({section: values})
    return data


def _cfg(world: SimpleNamespace, **extra) -> config.JobConfig:
    return config.from_dict(_job(world.base, **extra), base_dir=str(world.base))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):
    from etl import job as etl_job
    from etl import score_job, session, sources

    base = tmp_path_factory.mktemp("score")
    path = base / "job.yaml"
    path.write_text(yaml.safe_dump(_job(base)))
    cfg = config.load(path)
    spark = session.get_session(cfg, "local[2]")
    sources.create_sample_table(spark, cfg)
    etl_job.run(spark, cfg)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI" and not k.startswith("HOROVOD_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-m", "hvdtrain.training.train", str(path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # The rows to score: the sample plus 3 unscorable rows; score.partitions=6: more tasks than Python workers.
    bad = spark.createDataFrame([(None, "a fine text", "x"), ("bad-1", None, "x"), ("bad-2", "   ", "x")],
                                "id string, text string, label string")
    rows = spark.table("scoretest.reviews").selectExpr("CAST(id AS STRING) AS id", "text", "label")
    rows.repartition(6).unionByName(bad).write.mode("overwrite").saveAsTable("scoretest.to_score")
    world = SimpleNamespace(base=base, spark=spark, cfg=cfg, model=cfg.train.output,
                            result=json.loads(fs.read_bytes(fs.join(cfg.train.output, "result.json"))))
    world.score_cfg = _cfg(world, source={"table": "scoretest.to_score"}, score={"columns": ["label"]})
    target = score_job.plan_target(world.score_cfg.score, "scoretest.preds", PARTITION, False, dt.date.today())
    world.report = score_job.run(spark, world.score_cfg, world.model, target, evaluate=True)
    yield world
    spark.stop()


def _etl_features(cfg: config.JobConfig) -> dict[str, dict[str, bytes]]:
    """key -> stored bytes of input_ids / attention_mask, read from the ETL's TFRecords."""
    import tensorflow as tf

    m = manifest_lib.read(cfg.etl.output)
    out = {}
    for split in m.splits.values():
        for shard in split.shards:
            with open(m.shard_uri(shard), "rb") as fh:
                for record in tfrecord.iter_records(fh):
                    ex = tf.train.Example.FromString(record).features.feature
                    out[ex["key"].bytes_list.value[0].decode()] = {
                        name: ex[name].bytes_list.value[0] for name in ("input_ids", "attention_mask")}
    return m, out


def _decode(m: manifest_lib.Manifest, name: str, raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, dtype=manifest_lib.ENCODINGS[m.features[name].encoding]).astype(np.int64)


def _table(world, table: str = "scoretest.preds"):
    return world.spark.table(table).where(f"ds = '{PARTITION.split('=')[1]}'").toPandas()


def test_job_accounts_for_every_row_and_loads_the_model_once_per_worker(world) -> None:
    r = world.report
    assert (r["rows_in"], r["scored"], r["rejected"]) == (1203, 1200, 3)
    assert r["rejects_by_reason"] == {"blank text (text)": 1, "null key (id)": 1, "null text (text)": 1}
    assert r["tasks"] == 6 and r["arrow_batches"] >= 12  # score.partitions=6, Arrow batches of 100 rows
    assert 1 <= r["model_loads"] <= 2, r  # local[2]: two reused Python workers, each loads once
    preds, rejects = _table(world), _table(world, "scoretest.preds_rejects")
    assert len(preds) == 1200 and preds["id"].is_unique and preds["predicted_label"].notna().all()
    assert sorted(rejects["reject_reason"]) == sorted(r["rejects_by_reason"])
    assert set(preds["model_uri"]) == {world.model} and set(preds["manifest_digest"]) == {r["model"]["manifest_digest"]}
    np.testing.assert_allclose(np.stack(preds["probabilities"]).sum(axis=1), 1.0, atol=1e-5)
    saved = json.loads(fs.read_bytes(fs.join(world.score_cfg.score.report_dir, "score_report.json")))
    assert saved["rows_in"] == saved["scored"] + saved["rejected"] == 1203
    assert r["evaluation"]["rows"] == 1200 and r["evaluation"]["accuracy"] == pytest.approx(
        float((preds["predicted_label"] == preds["label"]).mean()), abs=1e-4)
    drift = json.loads(fs.read_bytes(fs.join(world.score_cfg.score.report_dir, "drift_report.json")))
    assert not drift["drifted"] and drift["text"]["unknown_token_rate"] < 0.01  # the training rows: no drift


def test_scoring_features_are_the_etl_bytes_and_predictions_equal_the_driver_side_model(world) -> None:
    import keras

    from etl import score_job
    from hvdtrain.data.features import FeatureEncoder

    m, stored = _etl_features(world.cfg)
    bundle = score_lib.load_bundle(world.model)
    rows = score_job.read_input(world.spark, world.cfg, bundle).toPandas()
    spec = score_lib.make_spec(bundle)
    feats = score_lib.encode_rows(rows, spec, FeatureEncoder(bundle.tokenizer_json, bundle.tabular))
    assert len(rows) == len(stored) == 1200
    for i, key in enumerate(rows["id"]):
        for name in ("input_ids", "attention_mask"):  # the packed layout: values end to end in the encoding's dtype
            packed = feats[name][i].astype(manifest_lib.ENCODINGS[m.features[name].encoding]).tobytes()
            assert packed == stored[key][name], (key, name)
    # driver side: the exported model on the ETL's own features, training=False
    keys = sorted(stored)
    x = {name: np.stack([_decode(m, name, stored[k][name]) for k in keys]) for name in ("input_ids", "attention_mask")}
    model = keras.saving.load_model(fs.join(world.model, "model.keras"), compile=False)
    expected = score_lib.softmax(np.asarray(model(x, training=False)))
    preds = _table(world).set_index("id").loc[keys]
    got = np.stack(preds["probabilities"])
    assert np.abs(got - expected).max() <= 1e-5
    assert list(preds["predicted_label"]) == [m.labels[i] for i in expected.argmax(axis=1)]


def test_mlflow_model_resolves_by_every_reference_and_works_through_pyfunc_spark_udf(world) -> None:
    import mlflow

    folder = score_lib.load_bundle(world.model)
    weights = score_lib.load_keras(folder.model_bytes).get_weights()
    run_id = world.result["run_id"]
    for ref in (f"runs:/{run_id}/model", "models:/scoretest_model/1", "scoretest_model"):
        bundle = score_lib.load_bundle(ref, world.cfg.tracking, world.cfg.workdir)
        assert (bundle.tokenizer_json, bundle.labels_doc) == (folder.tokenizer_json, folder.labels_doc), ref
        for mine, logged in zip(weights, score_lib.load_keras(bundle.model_bytes).get_weights(), strict=True):
            np.testing.assert_array_equal(mine, logged)  # MLflow re-saves the file: same weights, other bytes
    assert bundle.version == "1" and bundle.uri == "models:/scoretest_model/1"
    with pytest.raises(DataError, match="models:/scoretest_model/7"):
        score_lib.load_bundle("models:/scoretest_model/7", world.cfg.tracking, world.cfg.workdir)
    # what users will try: mlflow.pyfunc.spark_udf of the logged model on pre-tokenized rows
    m, stored = _etl_features(world.cfg)
    keys = sorted(stored)[:200]
    rows = [(k, *[_decode(m, n, stored[k][n]).tolist() for n in ("input_ids", "attention_mask")]) for k in keys]
    df = world.spark.createDataFrame(rows, "id string, input_ids array<bigint>, attention_mask array<bigint>")
    mlflow.set_tracking_uri(world.result["tracking_uri"])
    udf = mlflow.pyfunc.spark_udf(world.spark, world.result["mlflow_model_uri"], result_type="array<float>",
                                  env_manager="local")
    logits = df.select("id", udf("input_ids", "attention_mask").alias("logits")).toPandas()
    got = score_lib.softmax(np.stack(logits.set_index("id").loc[keys]["logits"]))
    ours = np.stack(_table(world).set_index("id").loc[keys]["probabilities"])
    assert np.abs(got - ours).max() <= 1e-5


def test_an_occupied_partition_is_refused_then_replaced_atomically_with_overwrite(world) -> None:
    from etl import score_job

    cfg, spark = world.score_cfg, world.spark
    target = score_job.plan_target(cfg.score, "scoretest.preds", PARTITION, False, dt.date.today())
    before = score_job.table_location(spark, "scoretest.preds", target.spec())
    with pytest.raises(DataError, match=r"partition \(ds='2026-11-23'\) of scoretest.preds already holds rows; "
                                        "pass --overwrite"):
        score_job.run(spark, cfg, world.model, target)
    assert score_job.table_location(spark, "scoretest.preds", target.spec()) == before
    report = score_job.run(spark, cfg, world.model, score_job.plan_target(cfg.score, "scoretest.preds", PARTITION, True,
                                                                          dt.date.today()))
    after = score_job.table_location(spark, "scoretest.preds", target.spec())
    assert after != before and report["scored"] == 1200
    assert not fs.exists(score_job.fs_uri(before).rsplit("/", 1)[0])  # the replaced run folder is gone
    assert len(_table(world)) == 1200 and len(_table(world, "scoretest.preds_rejects")) == 3  # replaced, not added


def test_a_second_run_on_a_partition_being_written_is_refused_in_one_line_and_writes_nothing(world) -> None:
    """#54: two runs publishing one partition would each delete the run folder the other just published."""
    from etl import score_job

    cfg, spark = world.score_cfg, world.spark
    target = score_job.plan_target(cfg.score, "scoretest.preds", PARTITION, True, dt.date.today())
    part_root = fs.join(score_job.fs_uri(score_job.table_location(spark, "scoretest.preds")), target.folder())
    before = (score_job.table_location(spark, "scoretest.preds", target.spec()), sorted(fs.listdir(part_root)))
    with lease.acquire(part_root, f"partition ({target.spec()}) of scoretest.preds"):  # another run is writing
        with pytest.raises(lease.LeaseHeld) as err:
            score_job.run(spark, cfg, world.model, target)
    message = str(err.value)
    assert "\n" not in message and message.startswith(
        f"partition ({target.spec()}) of scoretest.preds is being written by"), message
    assert f"pid {os.getpid()} since" in message and fs.join(part_root, lease.NAME) in message
    assert (score_job.table_location(spark, "scoretest.preds", target.spec()), sorted(fs.listdir(part_root))) == before


def test_bad_input_stops_before_any_work_with_one_line(world) -> None:
    from etl import score_job

    spark = world.spark
    spark.sql("CREATE TABLE IF NOT EXISTS scoretest.no_text (id string, body string) USING parquet")
    spark.sql("CREATE TABLE IF NOT EXISTS scoretest.bad_out (id string, score double, ds string) USING parquet "
              "PARTITIONED BY (ds)")
    cases = [
        ({"source": {"table": "scoretest.missing"}}, "scoretest.new1", "source.table scoretest.missing does not exist"),
        ({"source": {"table": "scoretest.no_text"}}, "scoretest.new2",
         "lacks column\\(s\\) text that model .* reads \\(manifest digest [0-9a-f]{16}"),
        ({"source": {"table": "scoretest.to_score"}}, "scoretest.bad_out",
         "output table scoretest.bad_out has columns id string, score double PARTITIONED BY \\(ds\\), but this "
         "job writes id string, predicted_label string"),
    ]
    for extra, table, message in cases:
        cfg = _cfg(world, **extra)
        with pytest.raises(DataError, match=message) as err:
            score_job.run(spark, cfg, world.model, score_job.plan_target(cfg.score, table, PARTITION, False, dt.date.today()))
        assert "\n" not in str(err.value)
    assert not spark.catalog.tableExists("scoretest.new1") and not spark.catalog.tableExists("scoretest.new2")


def test_shifted_text_is_flagged_and_fail_on_drift_stops_before_scoring(world) -> None:
    from etl import score_job

    spark = world.spark
    shifted = [(f"s{i}", "ωψχ φυτ σρπ " * 5 + "the", "x") for i in range(200)]  # letters the vocabulary never saw
    spark.createDataFrame(shifted, "id string, text string, label string").write.mode("overwrite") \
        .saveAsTable("scoretest.shifted")
    cfg = _cfg(world, source={"table": "scoretest.shifted"},
               score={"fail_on_drift": True, "report_dir": str(world.base / "drift")})
    with pytest.raises(DataError, match=r"input drift: text column text: unknown-token rate (0\.9\d\d|1\.000) vs "
                                        r"0\.000 in training"):
        score_job.run(spark, cfg, world.model, score_job.plan_target(cfg.score, "scoretest.shifted_preds", PARTITION,
                                                                     False, dt.date.today()))
    assert not spark.catalog.tableExists("scoretest.shifted_preds")
    drift = json.loads((world.base / "drift" / "drift_report.json").read_text())
    assert drift["drifted"] and drift["text"]["rows"] == 200


def test_a_failed_rejects_publish_puts_the_predictions_partition_back(world, monkeypatch) -> None:
    """#28 item 2: the live partition never points at a folder the clean-up deletes."""
    from etl import score_job

    cfg, spark = world.score_cfg, world.spark
    target = score_job.plan_target(cfg.score, "scoretest.preds", PARTITION, True, dt.date.today())
    before = score_job.table_location(spark, "scoretest.preds", target.spec())
    real, old_run = score_job.point_partition, before.rstrip("/").rsplit("/", 1)[0]

    def rejects_fail(spark_, table, target_, folder, exists):  # the switch to the new run fails, the way back works
        if table == target.rejects_table and folder and old_run not in folder:
            raise RuntimeError("metastore unavailable (injected)")
        return real(spark_, table, target_, folder, exists)

    monkeypatch.setattr(score_job, "point_partition", rejects_fail)
    with pytest.raises(RuntimeError, match="injected"):
        score_job.run(spark, cfg, world.model, target)
    monkeypatch.undo()
    assert score_job.table_location(spark, "scoretest.preds", target.spec()) == before
    assert fs.exists(score_job.fs_uri(before))
    assert len(_table(world)) == 1200 and len(_table(world, "scoretest.preds_rejects")) == 3
    runs = fs.listdir(score_job.fs_uri(before).rsplit("/", 2)[0])
    assert runs == [score_job.fs_uri(before).rstrip("/").rsplit("/", 2)[1]]  # the failed run's folder is gone


def test_empty_or_mostly_rejected_input_never_replaces_a_partition(world) -> None:
    """#28 items 3 and 12: score.min_rows and score.max_reject_fraction refuse to publish, naming the numbers."""
    from etl import score_job

    spark = world.spark
    rows = [(f"r{i}", " " if i % 4 else "a fine text", "x") for i in range(40)]  # 30 of 40 blank
    spark.createDataFrame(rows, "id string, text string, label string").write.mode("overwrite") \
        .saveAsTable("scoretest.mostly_bad")
    spark.sql("CREATE TABLE IF NOT EXISTS scoretest.empty_input (id string, text string, label string) USING parquet")
    before = score_job.table_location(spark, "scoretest.preds", f"ds='{PARTITION.split('=')[1]}'")
    cases = [("scoretest.empty_input", r"only 0 rows scored \(rows_in 0, rejected 0\), fewer than score.min_rows=1"),
             ("scoretest.mostly_bad", r"30 of 40 rows rejected \(75.0%\), more than score.max_reject_fraction=0.5")]
    for table, message in cases:
        cfg = _cfg(world, source={"table": table}, score={"columns": ["label"]})
        with pytest.raises(DataError, match=message):
            score_job.run(spark, cfg, world.model, score_job.plan_target(cfg.score, "scoretest.preds", PARTITION, True,
                                                                         dt.date.today()))
    assert score_job.table_location(spark, "scoretest.preds", f"ds='{PARTITION.split('=')[1]}'") == before
    assert len(_table(world)) == 1200
