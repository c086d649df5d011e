"""MLflow tracking against a real ``mlflow server`` (SQLite backend, loopback port), and a tracking outage.

The server runs for this module only: started on a free 127.0.0.1 port,
awaited on ``/health``, killed (its whole process group) at the end. Training
runs as a user starts it, ``python -m hvdtrain.training.train CONFIG``, single process.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from hvdtrain.core import config
from hvdtrain.data.synthetic import Layout, TextSpec, make_text_dataset
from tests.support.mlflow_server import free_port, start_server, stop_server

REPO = Path(__file__).resolve().parents[2]
MODEL_NAME = "hvdtrain-test-model"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HOROVOD_", "OMPI_", "PMI_", "MLFLOW_"))}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO), MLFLOW_DISABLE_TELEMETRY="true")
    return env


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root, port = tmp_path_factory.mktemp("mlflow-server"), free_port()
    proc = start_server(root, port)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_server(proc)


def _write_job(tmp: Path, name: str, tracking: dict[str, Any], epochs: int = 2) -> Path:
    data = tmp / "data"
    if not (data / "manifest.json").exists():
        make_text_dataset(str(data), TextSpec(layout=Layout(n_per_split={"train": 320, "validation": 40, "test": 40}),
                                              num_classes=2, class_rate=0.5, seed=9))
    cfg = config.from_dict({
        "name": name, "workdir": str(tmp / name), "source": {"table": "demo.reviews"}, "etl": {"output": str(data)},
        "model": {"embed_dim": 16, "num_heads": 2, "ff_dim": 32, "num_layers": 1},
        "train": {"epochs": epochs, "batch_size": 16, "learning_rate": 0.003, "shuffle_buffer": 64,
                  "validate_every_epoch": True, "progress": "off"},
        "tracking": tracking,
    })
    path = tmp / f"{name}.yaml"
    path.write_text(cfg.to_yaml())
    return path


def _train(tmp: Path, name: str, tracking: dict[str, Any], timeout: float = 180) -> tuple[subprocess.CompletedProcess,
                                                                                       dict[str, Any], float]:
    path = _write_job(tmp, name, tracking)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "hvdtrain.training.train", str(path)], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=timeout)
    seconds = time.monotonic() - start
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc, json.loads(proc.stdout), seconds


@pytest.mark.slow
def test_run_metrics_and_registered_model_reach_a_real_server(tmp_path: Path, mlflow_server: str) -> None:
    from mlflow import MlflowClient, artifacts

    _, result, _ = _train(tmp_path, "served", {"uri": mlflow_server, "experiment": "hvdtrain-server-test",
                                               "log_every_steps": 5, "registered_model_name": MODEL_NAME})
    client = MlflowClient(tracking_uri=mlflow_server, registry_uri=mlflow_server)
    run = client.get_run(result["run_id"])
    assert run.info.status == "FINISHED" and result["tracking_uri"] == mlflow_server
    params, tags = run.data.params, run.data.tags
    assert params["horovod.size"] == "1" and params["horovod.hosts"] == socket.gethostname()
    assert params["train.batch_size"] == "16" and tags["horovod_hosts"] == socket.gethostname()
    assert run.data.metrics["test_accuracy"] == pytest.approx(result["test_accuracy"])

    def history(key: str) -> list[Any]:
        return sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)

    assert [m.step for m in history("step_loss")] == [5, 10, 15, 20, 25, 30, 35, 40]  # 20 steps/epoch x 2
    assert all(0.0 <= m.value <= 1.0 for m in history("data_wait_fraction"))
    assert all(m.value > 0 for m in history("step_samples_per_sec") + history("step_seconds"))
    assert [m.step for m in history("val_accuracy")] == [1, 2] and [m.step for m in history("train_loss")] == [1, 2]

    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"eval_report.json", "labels.json", "confusion_matrix.png", "serving", "config.yaml"} <= names
    model_id = result["mlflow_model_uri"].rsplit("/", 1)[-1]  # models:/<id>
    logged = client.get_logged_model(model_id)
    assert logged.source_run_id == result["run_id"]
    assert "MLmodel" in {a.path for a in client.list_logged_model_artifacts(model_id)}
    mlmodel = Path(artifacts.download_artifacts(artifact_uri=f"{logged.artifact_location}/MLmodel",
                                                dst_path=str(tmp_path / "model"), tracking_uri=mlflow_server))
    assert "keras" in mlmodel.read_text() and "input_ids" in mlmodel.read_text()
    versions = client.search_model_versions(f"name='{MODEL_NAME}'")
    assert [v.run_id for v in versions] == [result["run_id"]]


@pytest.mark.slow
def test_a_tracking_outage_warns_and_training_finishes(tmp_path: Path) -> None:
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    proc, result, seconds = _train(tmp_path, "outage", {"uri": closed, "log_every_steps": 1})
    assert "tracking is off for the rest of this run, training goes on" in proc.stderr
    assert result["run_id"] is None and result["test_accuracy"] >= 0.8
    assert (tmp_path / "outage" / "runs" / "outage" / "model.keras").is_file()
    # MLflow's retries are bounded (tracking.HTTP_DEFAULTS): seconds, not the minutes of its defaults.
    assert seconds < 120, seconds


@pytest.mark.slow
def test_a_server_restart_mid_run_loses_no_per_epoch_metric(tmp_path: Path) -> None:
    """The real server is stopped after epoch 1 and restarted on the same port and store once the run says it
    is buffering: the run keeps what it could not send, flushes it when the server is back, and misses nothing."""
    from mlflow import MlflowClient

    root, port = tmp_path / "server", free_port()
    root.mkdir()
    uri = f"http://127.0.0.1:{port}"
    server = start_server(root, port)
    path = _write_job(tmp_path, "restart", {"uri": uri, "log_every_steps": 0, "max_outage_seconds": 300}, epochs=6)
    job = subprocess.Popen([sys.executable, "-m", "hvdtrain.training.train", str(path)], cwd=REPO, env=_env(),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = ""
        for line in job.stderr:  # rank 0's log lines
            seen += line
            if "epoch 1/6" in line:
                break
        stop_server(server)
        for line in job.stderr:  # the first metrics that found no server
            seen += line
            if "buffering metrics" in line:
                break
        time.sleep(0.5)  # down a little longer than the failed call (the restart itself takes seconds)
        server = start_server(root, port)
        out, err = job.communicate(timeout=600)
        seen += err
        assert job.returncode == 0, seen[-4000:]
        assert "buffering metrics and retrying for up to 300s" in seen and "MLflow answers again after" in seen
        result = json.loads(out)
        assert result["tracking"] == {"active": True, "not_logged": []}
        client = MlflowClient(tracking_uri=uri)  # while the restarted server still runs
        for key in ("train_loss", "val_accuracy", "learning_rate"):
            assert sorted(m.step for m in client.get_metric_history(result["run_id"], key)) == [1, 2, 3, 4, 5, 6], key
        run = client.get_run(result["run_id"])
        assert run.info.status == "FINISHED" and "test_accuracy" in run.data.metrics
    finally:
        if job.poll() is None:
            job.kill()
        stop_server(server)


def test_which_mlflow_failures_are_worth_waiting_for() -> None:
    from hvdtrain.observe import tracking

    assert tracking.is_transient(ConnectionRefusedError(111, "Connection refused"))
    assert tracking.is_transient(RuntimeError("API request to endpoint /api/2.0/mlflow/runs/log-batch failed with "
                                              "exception HTTPConnectionPool: Max retries exceeded"))
    assert tracking.is_transient(RuntimeError("response code 503: service unavailable"))
    assert not tracking.is_transient(RuntimeError("INVALID_PARAMETER_VALUE: Param value too long"))


def test_a_sqlite_store_keeps_new_experiments_artifacts_beside_the_database(tmp_path: Path) -> None:
    """MLflow's default artifact root for a SQLite store is ``./mlruns`` in the current folder: wherever rank 0
    (or a YARN container, deleted when it ends) happens to run. A given SQLite URI keeps them beside it."""
    from hvdtrain.observe.tracking import resolve_store

    db = tmp_path / "store" / "mlflow.db"
    given = resolve_store(f"sqlite:///{db}", {}, str(tmp_path / "work"))
    assert (given.tracking_uri, given.artifact_location) == (f"sqlite:///{db}", f"file://{db.parent}/artifacts")
    from_env = resolve_store(None, {"MLFLOW_TRACKING_URI": f"sqlite:///{db}"}, str(tmp_path / "work"))
    assert from_env == given
    assert resolve_store("http://mlflow:5000", {}, "/w").artifact_location is None  # the server decides
    assert resolve_store("postgresql://db/mlflow", {}, "/w").artifact_location is None
    local = resolve_store(None, {}, str(tmp_path / "work"))
    assert local.artifact_location == f"file://{tmp_path}/work/mlflow/artifacts"


def test_a_continued_run_says_which_steps_a_metric_already_has(tmp_path: Path) -> None:
    """An elastic job's new rank 0 continues the MLflow run: the epochs already logged (``logged_steps``) are not
    logged again when a rollback redoes their end (``hvdtrain.training.elastic``, the job's ``logged_epochs``)."""
    from hvdtrain.observe import tracking

    cfg = config.from_dict({"name": "steps", "workdir": str(tmp_path), "source": {"table": "demo.reviews"},
                            "tracking": {"uri": f"sqlite:///{tmp_path}/mlflow.db"}}, base_dir=str(tmp_path))
    first = tracking.Tracker(cfg)
    run_id = first.start({})
    assert first.logged_steps("train_loss") == set()
    for epoch in (1, 2, 3):
        first.log_metrics({"train_loss": 1.0 / epoch}, epoch)
    first.flush()
    first.end("FAILED")  # the rank 0 that logged them is gone
    continued = tracking.Tracker(cfg)
    assert continued.start({}, resume_run_id=run_id) == run_id
    assert continued.logged_steps("train_loss") == {1, 2, 3} and continued.logged_steps("nothing") == set()
    continued.end()
    assert tracking.Tracker(cfg, enabled=False).logged_steps("train_loss") == set()


def test_a_resumed_try_logs_each_epoch_of_the_run_once(tmp_path: Path) -> None:
    """The fixed-size path: a try killed after epoch 2's metrics were logged but before its checkpoint was
    committed resumes inside epoch 2 and redoes its end. The resumed try's epoch report
    (``hvdtrain.training.hooks.EpochReport``, given the epochs the continued run has) logs epochs 2 and 3 once."""
    from hvdtrain.observe import tracking
    from hvdtrain.observe.events import EPOCH_METRIC, EpochStats
    from hvdtrain.training import hooks

    cfg = config.from_dict({"name": "resumed", "workdir": str(tmp_path), "source": {"table": "demo.reviews"},
                            "tracking": {"uri": f"sqlite:///{tmp_path}/mlflow.db"}}, base_dir=str(tmp_path))

    def epochs(tracker: Any, numbers: list[int], logged: set[int]) -> None:
        report = hooks.EpochReport(3, tracker.log_metrics, lambda: 0.01, logged)
        for n in numbers:
            report.end_epoch(EpochStats(epoch=n, loss=1.0 / n, accuracy=0.5, examples=10, seconds=1.0, steps=2))
        tracker.flush()

    first = tracking.Tracker(cfg)
    run_id = first.start({})
    epochs(first, [1, 2], first.logged_steps(EPOCH_METRIC))
    first.end("FAILED")  # killed before epoch 2's checkpoint was committed
    resumed = tracking.Tracker(cfg)
    assert resumed.start({}, resume_run_id=run_id) == run_id
    epochs(resumed, [2, 3], resumed.logged_steps(EPOCH_METRIC))  # the resumed try redoes epoch 2's end
    resumed.end()
    import mlflow

    history = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_metric_history(run_id, EPOCH_METRIC)
    assert sorted(m.step for m in history) == [1, 2, 3], [(m.step, m.value) for m in history]
