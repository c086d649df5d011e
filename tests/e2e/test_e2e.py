"""The whole pipeline as `make demo` runs it, on a smaller table.

Hive table (embedded metastore) -> Spark ETL -> TFRecords + manifest ->
horovodrun -np 2 (Gloo) -> exact evaluation -> export -> MLflow.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from hvdtrain.core import config
from hvdtrain.data import manifest
from hvdtrain.hadoop import fs

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e")
    data = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    data["workdir"] = str(tmp / "work")
    data["source"]["sample"]["rows"] = 6000
    path = tmp / "e2e.yaml"
    path.write_text(yaml.safe_dump(data))
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI" and not k.startswith("HOROVOD_")}
    proc = subprocess.run([sys.executable, "-m", "hvdtrain.cli", "demo", str(path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-6000:]}"
    cfg = config.load(path)
    result = json.loads(fs.read_bytes(os.path.join(cfg.train.output, "result.json")))
    return cfg, result, proc.stdout


def test_demo_prints_accuracy_and_run_id(demo_run):
    _, result, stdout = demo_run
    assert "demo finished:" in stdout
    assert f"test accuracy     {result['test_accuracy']:.4f}" in stdout
    assert result["run_id"] in stdout


def test_accuracy_is_near_the_generators_ceiling(demo_run):
    cfg, result, _ = demo_run
    ceiling = manifest.read(cfg.etl.output).source["sample"]["accuracy_ceiling"]
    # 10% label noise caps accuracy near 0.9; a working pipeline gets within 8 points of it.
    assert ceiling - 0.08 <= result["test_accuracy"] <= ceiling + 0.03, (result["test_accuracy"], ceiling)


def test_both_ranks_end_with_identical_weights(demo_run):
    _, result, _ = demo_run
    report = json.loads(fs.read_bytes(result["report"]))
    digests = report["rank_digest"]["ranks"]
    assert result["world_size"] == 2 and len(digests) == 2
    assert digests[0]["sha256"] == digests[1]["sha256"] and result["ranks_agree"] is True


def test_the_report_times_the_start_up_from_the_launcher(demo_run):
    _, result, _ = demo_run
    startup = json.loads(fs.read_bytes(result["report"]))["startup"]
    assert list(startup) == ["launcher", "interpreter and imports", "rendezvous", "data plan", "tracking",
                             "model build", "first step", "total"], startup
    assert all(v >= 0 for v in startup.values())
    assert startup["total"] == pytest.approx(sum(v for k, v in startup.items() if k != "total"), abs=0.01)


def test_record_counts_agree_from_hive_to_evaluation(demo_run):
    import tensorflow as tf

    cfg, result, _ = demo_run
    m = manifest.read(cfg.etl.output)
    etl_report = json.loads(fs.read_bytes(os.path.join(cfg.etl.output, "etl_report.json")))
    assert etl_report["rows_in"] == 6000
    assert sum(m.split(s).records for s in m.splits) == etl_report["rows_written"]
    for split in m.splits:
        files = [m.shard_uri(s) for s in m.split(split).shards]
        read = sum(1 for _ in tf.data.TFRecordDataset(files))
        assert read == m.split(split).records
    report = json.loads(fs.read_bytes(result["report"]))
    assert report["evaluation"]["test"]["records"] == m.split("test").records


def test_mlflow_run_has_metrics_and_a_loadable_model(demo_run):
    import mlflow
    from mlflow.tracking import MlflowClient

    _, result, _ = demo_run
    client = MlflowClient(result["tracking_uri"])
    run = client.get_run(result["run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.metrics["test_accuracy"] == pytest.approx(result["test_accuracy"])
    assert "train.batch_size" in run.data.params
    artifacts = {a.path for a in client.list_artifacts(result["run_id"])}
    assert "eval_report.json" in artifacts
    mlflow.set_tracking_uri(result["tracking_uri"])
    model = mlflow.pyfunc.load_model(result["mlflow_model_uri"])
    ids = np.zeros((3, 48), dtype=np.int64)
    ids[:, :5] = 7
    mask = (ids > 0).astype(np.int64)
    out = model.predict({"input_ids": ids, "attention_mask": mask})
    assert np.asarray(out).shape[0] == 3


def test_demo_ends_by_scoring_the_test_split_into_hive(demo_run):
    cfg, result, stdout = demo_run
    report = json.loads(fs.read_bytes(fs.join(cfg.score.report_dir, "score_report.json")))
    m = manifest.read(cfg.etl.output)
    assert report["output_table"] == "demo.review_predictions" and report["split"] == "test"
    assert report["rows_in"] == report["scored"] == report["evaluation"]["table_rows"] == m.split("test").records
    # the same rows and model as training's test evaluation: the same accuracy
    assert report["evaluation"]["accuracy"] == pytest.approx(result["test_accuracy"], abs=1e-4)
    part = ", ".join(f"{k}={v}" for k, v in report["partition"].items())
    assert (f"demo.review_predictions ({part}): {report['scored']:,} rows, accuracy "
            f"{report['evaluation']['accuracy']:.4f}") in stdout
