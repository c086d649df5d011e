"""A planted secret never leaks, end to end (#28 item 7): ETL, ``train --np 2`` (fixed and elastic: #54 item 5),
``tune`` (1 trial) and a YARN dry-run, run as a user runs them, against a real ``mlflow server`` whose URL carries
the secret as its password.

The secret sits in ``tracking.uri`` (a URL password, which every rank and trial needs to reach MLflow),
``spark.conf`` (``spark.hadoop.fs.s3a.secret.key``, ``spark.ssl.keyStorePassword``), ``yarn.env``
(``PGPASSWORD`` too) and the commands' own environment
(``MLFLOW_TRACKING_TOKEN``, which every rank must still receive: horovodrun would write it into the ranks'
``sh -c env ...`` command lines). While the
commands run, a thread reads every process's command line from ``/proc`` (horovodrun, ranks, trials, Spark's JVM);
afterwards every output stream, every file written (outputs, checkpoints, logs, MLflow's SQLite store and
artifacts, the tuning study) and MLflow's params and tags are searched. The only file allowed to hold the secret
is the YARN properties file hvdtrain writes with mode 0600 to hand it to spark-submit.
"""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.support.mlflow_server import free_port, start_server, stop_server

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
HVDTRAIN = Path(sys.executable).parent / "hvdtrain"
SECRET = "Pl4nted-S3cret-7d1e"
TOKEN_VAR = "MLFLOW_TRACKING_TOKEN"  # also in the environment of every command: ranks must get it, ps must not


class CommandLines(threading.Thread):
    """Every process command line seen while it runs (polled from /proc every 50 ms)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.seen: set[str] = set()
        self.ranks_with_token: set[str] = set()  # pids of hvdtrain.training.train ranks whose environment held the token
        self.done = threading.Event()

    def run(self) -> None:
        token = f"{TOKEN_VAR}={SECRET}".encode()
        while not self.done.is_set():
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
                    rank = b"hvdtrain.training.train" in raw or b"hvdtrain.training.elastic" in raw
                    if rank and "HOROVOD_RANK" in (environ := Path(f"/proc/{pid}/environ")
                                                   .read_bytes().decode(errors="replace")):
                        if token in environ.encode():
                            self.ranks_with_token.add(pid)
                except OSError:
                    continue
                if raw:
                    self.seen.add(raw.replace(b"\0", b" ").decode(errors="replace"))
            time.sleep(0.05)


def _csv(path: Path, rows: int = 480) -> None:
    words = {"pos": "good great fine", "neg": "bad poor awful"}
    with open(path, "w") as fh:
        fh.write("id,text,label\n")
        for i in range(rows):
            label = ["pos", "neg"][i % 2]
            fh.write(f"r{i},the film was {words[label].split()[i % 3]} and long {i % 17},{label}\n")


@pytest.fixture(scope="module")
def leak_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("leak")
    server_root = tmp / "mlflow-server"
    server_root.mkdir()
    port = free_port()
    server = start_server(server_root, port)
    _csv(tmp / "rows.csv")
    job = tmp / "job.yaml"
    job.write_text(yaml.safe_dump({
        "name": "leak", "workdir": str(tmp / "work"),
        "source": {"path": str(tmp / "rows.csv"), "format": "csv"},
        # names beyond the first round's (#54 item 6): Spark's SSL password; inert here, as ssl is off
        "spark": {"master": "local[1]", "conf": {"spark.hadoop.fs.s3a.secret.key": SECRET,
                                                 "spark.ssl.keyStorePassword": SECRET}},
        "etl": {"output": str(tmp / "work" / "data"), "max_length": 16, "vocab_size": 200,
                "min_shards_per_split": 2, "min_shard_mb": 0},
        "model": {"embed_dim": 8, "num_heads": 1, "ff_dim": 16, "num_layers": 1, "dropout": 0.0},
        "train": {"epochs": 1, "batch_size": 32, "shuffle_buffer": 64, "progress": "log",
                  "output": str(tmp / "work" / "runs" / "leak")},
        "tracking": {"uri": f"http://hvd:{SECRET}@127.0.0.1:{port}", "experiment": "leak",
                     "registered_model_name": "leak_model", "log_every_steps": 0},
        "monitoring": {"enabled": False},
        "tune": {"heartbeat_seconds": 1},
        "yarn": {"env": {"MLFLOW_TRACKING_TOKEN": SECRET, "GLOO_SOCKET_IFNAME": "lo", "PGPASSWORD": SECRET}},
    }))
    space = tmp / "space.yaml"
    space.write_text("train.learning_rate: {loguniform: [1.0e-4, 3.0e-2]}\n")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HOROVOD_", "OMPI_", "PMI_", "MLFLOW_"))}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO), MLFLOW_DISABLE_TELEMETRY="true")
    env[TOKEN_VAR] = SECRET
    commands = {
        "etl": [str(HVDTRAIN), "etl", str(job)],
        "train": [str(HVDTRAIN), "train", str(job), "--np", "2"],
        # elastic horovodrun (a discovery script, no -H) used to write every rank's environment into its command line
        "train elastic": [str(HVDTRAIN), "train", str(job), "--np", "2", "name=leak_elastic",
                          f"train.output={tmp / 'work' / 'runs' / 'leak_elastic'}", "train.elastic.min_ranks=1",
                          "train.elastic.max_ranks=2", "train.validate_every_epoch=false"],
        "tune": [str(HVDTRAIN), "tune", str(job), "--space", str(space), "--trials", "1", "--np", "2",
                 "--parallel", "1"],
        "yarn dry-run": [str(HVDTRAIN), "yarn", "submit", str(job), "--num-workers", "2", "--dry-run"],
    }
    watcher = CommandLines()
    watcher.start()
    outputs = {}
    try:
        for name, cmd in commands.items():
            proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=900)
            assert proc.returncode == 0, f"{name}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
            outputs[name] = proc.stdout + proc.stderr
        runs = _mlflow_runs(f"http://127.0.0.1:{port}")  # read back while the server runs
    finally:
        watcher.done.set()
        watcher.join(timeout=10)
        stop_server(server)
    return {"tmp": tmp, "job": job, "outputs": outputs, "cmdlines": watcher.seen, "runs": runs,
            "ranks_with_token": watcher.ranks_with_token}


def _mlflow_runs(uri: str) -> list[dict[str, str]]:
    """Every run of the experiment as its params and tags."""
    import mlflow

    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("leak").experiment_id], max_results=100)
    return [{**r.data.params, **r.data.tags} for r in runs]


def test_no_command_line_carries_the_secret(leak_run):
    seen = leak_run["cmdlines"]
    # the watcher saw the processes that matter, so an empty finding means something
    assert any("horovodrun" in c for c in seen) and any("hvdtrain.training.train" in c for c in seen), sorted(seen)[:40]
    assert any("--host-discovery-script" in c for c in seen) and any("hvdtrain.training.elastic" in c for c in seen)
    assert any("tune.trial=0" in c for c in seen), "no trial process was seen"
    assert any("SparkSubmit" in c or "pyspark" in c for c in seen), "no Spark process was seen"
    # the environment's secret reached every rank (train: 2, elastic train: 2, the trial: 2) through the sealed file
    assert len(leak_run["ranks_with_token"]) >= 6, leak_run["ranks_with_token"]
    assert [c[max(0, c.index(SECRET) - 200):c.index(SECRET) + 40] for c in seen if SECRET in c] == []


def test_no_output_stream_carries_the_secret_and_the_dry_run_names_it_secret(leak_run):
    for name, text in leak_run["outputs"].items():
        assert SECRET not in text, f"{name} printed the secret"
    dry = leak_run["outputs"]["yarn dry-run"]
    assert "spark-submit" in dry and "hvdtrain-sealed-env.json" in dry  # shipped with --files
    # on a cluster the executors' secret variables travel in a shipped 0600 file, not their containers' environment
    named = [line for line in dry.splitlines() if "secret, written to a 0600 hvdtrain-sealed-env.json" in line]
    assert named and all(k in named[0] for k in (TOKEN_VAR, "PGPASSWORD")), named


def test_no_file_written_holds_the_secret_but_the_private_yarn_properties(leak_run):
    tmp, job = leak_run["tmp"], leak_run["job"]
    written = [p for p in tmp.rglob("*") if p.is_file() and p != job]
    assert any(p.name == "mlflow.db" for p in written) and any("checkpoint" in str(p) for p in written)
    assert any(p.suffix == ".log" for p in written) and any(p.suffix == ".db" and "tune" in str(p) for p in written)
    holders = [p for p in written if SECRET.encode() in p.read_bytes()]
    for p in holders:  # spark-submit reads yarn.env's secret values from a file only its owner may read
        assert p.name.endswith(".properties") and stat.S_IMODE(p.stat().st_mode) == 0o600, p
    assert [p for p in holders if not p.name.endswith(".properties")] == []


def test_mlflow_params_and_tags_hold_no_secret_and_the_runs_reached_the_server(leak_run):
    runs = leak_run["runs"]
    assert len(runs) >= 4  # the training runs (fixed, elastic), the study's parent run and its trial
    assert [(k, v) for run in runs for k, v in run.items() if SECRET in v] == []
