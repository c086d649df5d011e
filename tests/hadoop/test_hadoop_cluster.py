"""On a real Hadoop cluster: the ETL writes a dataset to HDFS, then training runs as a YARN job.

Runs only where a cluster is configured (tests/conftest.py skips the ``hadoop`` tier otherwise):

    HVDTRAIN_TEST_HDFS=hdfs://namenode:8020/tmp/hvdtrain-test   # a folder this user may write
    HVDTRAIN_TEST_YARN=1                                        # also submit to YARN
    HVDTRAIN_TEST_QUEUE=...                                     # optional YARN queue
    HVDTRAIN_TEST_PRINCIPAL=... HVDTRAIN_TEST_KEYTAB=...        # optional Kerberos login

on a host with the Hadoop client (HADOOP_HOME, HADOOP_CONF_DIR,
``CLASSPATH=$(hadoop classpath --glob)``; see ``hvdtrain env check``), from the project venv.
Without HVDTRAIN_TEST_YARN the ETL runs on local Spark, still writing to HDFS, and the YARN
tests skip. The packed environment is cached under ``$HVDTRAIN_TEST_HDFS/envs`` across runs;
each run's data and outputs go to a fresh folder that is deleted at the end.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from hvdtrain import config, fs, manifest
from tests.multiprocess.test_yarn_local import (
    REPO,
    assert_trained,
    read_records,
    records_uri,
    run_submit,
    submit_command,
    submit_env,
    write_job,
)

pytestmark = pytest.mark.hadoop

HDFS = os.environ.get("HVDTRAIN_TEST_HDFS", "")
YARN = bool(os.environ.get("HVDTRAIN_TEST_YARN"))
needs_yarn = pytest.mark.skipif(not YARN, reason="needs YARN: set HVDTRAIN_TEST_YARN=1 (with HADOOP_CONF_DIR)")
SAMPLE = {"rows": 3000, "num_classes": 4, "words_per_class": 40, "filler_words": 300, "class_word_rate": 0.5,
          "min_words": 12, "max_words": 30, "label_noise": 0.0, "seed": 7}


def kerberos_flags() -> list[str]:
    principal, keytab = os.environ.get("HVDTRAIN_TEST_PRINCIPAL"), os.environ.get("HVDTRAIN_TEST_KEYTAB")
    return ["--principal", principal, "--keytab", keytab] if principal and keytab else []


def queue_flags() -> list[str]:
    queue = os.environ.get("HVDTRAIN_TEST_QUEUE")
    return ["--queue", queue] if queue else []


def small_yarn_block(**extra: object) -> dict[str, object]:
    """Modest containers, the env cache on HDFS."""
    return {"executor_cores": 1, "executor_memory": "3g", "driver_memory": "2g", "start_timeout": 900,
            "env_cache": f"{HDFS}/envs", **extra}


@pytest.fixture(scope="module")
def run_root() -> Iterator[str]:
    root = fs.join(HDFS, f"run-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}")
    fs.makedirs(root)
    yield root
    fs.delete(root)


def etl_command(config_path: Path, master: str) -> list[str]:
    """``hvdtrain yarn etl``: spark-submit of etl/job.py, shipping code and (on YARN) the packed environment."""
    flags = (queue_flags() + kerberos_flags() + ["--num-executors", "2"]) if master == "yarn" else []
    return [sys.executable, "-m", "yarn.etl_submit", str(config_path), "--master", master, "--create-sample-table",
            "--overwrite", *flags]


@pytest.fixture(scope="module")
def hdfs_dataset(run_root: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Run the ETL (on YARN when configured, else local Spark) into HDFS; returns the dataset URI."""
    folder = tmp_path_factory.mktemp("hadoop-etl")
    data = fs.join(run_root, "data")
    cfg = config.from_dict({
        "name": "clusteretl", "workdir": str(folder),
        "source": {"table": "hvdtrain_test.reviews", "sample": SAMPLE},
        # Embedded Derby metastore on this host; on YARN the table's files go to HDFS, where
        # every executor can write and read them.
        "hive": {"embedded": True, "metastore_dir": str(folder / "metastore"),
                 "warehouse_dir": fs.join(run_root, "warehouse") if YARN else str(folder / "warehouse")},
        "etl": {"output": data, "max_length": 32, "vocab_size": 600, "min_shards_per_split": 2, "min_shard_mb": 0},
        "yarn": small_yarn_block(executor_memory="2g"),
    }, base_dir=str(folder))
    path = folder / "etl.yaml"
    path.write_text(cfg.to_yaml())
    cmd = etl_command(path, "yarn" if YARN else "local[2]")
    run_submit(cmd, timeout=1800, env=submit_env(PYSPARK_PYTHON=sys.executable))
    return data


@pytest.mark.timeout(1800)
def test_etl_publishes_a_dataset_on_hdfs(hdfs_dataset: str) -> None:
    m = manifest.read(hdfs_dataset)
    assert sum(m.split(s).records for s in m.splits) == SAMPLE["rows"]
    assert all(len(m.split(s).shards) >= 2 for s in m.splits)
    assert fs.exists(m.shard_uri(m.split("train").shards[0]))


@needs_yarn
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("deploy_mode", ["client", "cluster"])
def test_yarn_training_job(hdfs_dataset: str, run_root: str, tmp_path: Path, deploy_mode: str) -> None:
    output = fs.join(run_root, f"train-{deploy_mode}")
    job = write_job(tmp_path, f"cluster{deploy_mode}", hdfs_dataset, output, epochs=3,
                    yarn=small_yarn_block(deploy_mode=deploy_mode))
    proc = run_submit(submit_command(job, "--num-workers", "2", *queue_flags(), *kerberos_flags()), timeout=3300)
    uri = fs.join(output, "yarn_result.json")
    assert f"result: {uri}" in proc.stdout
    if deploy_mode == "client":  # the driver runs here, so its output is ours
        assert records_uri(proc.stdout) == uri
    doc = read_records(uri)
    assert_trained(doc, world_size=2, min_accuracy=0.8)
    assert len({r["pid"] for r in doc["ranks"]}) == 2


@needs_yarn
@pytest.mark.timeout(1800)
def test_ctrl_c_kills_a_cluster_mode_application(hdfs_dataset: str, run_root: str, tmp_path: Path) -> None:
    job = write_job(tmp_path, "clusterstop", hdfs_dataset, fs.join(run_root, "train-stop"), epochs=200,
                    yarn=small_yarn_block(deploy_mode="cluster"))
    log = tmp_path / "submit.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(submit_command(job, "--num-workers", "2", *queue_flags(), *kerberos_flags()),
                                cwd=REPO, env=submit_env(), stdout=out, stderr=subprocess.STDOUT, text=True)
        try:
            app_id = _wait_for_app(log, proc, timeout=1200)
            _wait_for_state(app_id, {"RUNNING"}, timeout=600)
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=300) == 130, log.read_text()[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
    assert _wait_for_state(app_id, {"KILLED", "FAILED", "FINISHED"}, timeout=300) == "KILLED"


def _wait_for_app(log: Path, proc: subprocess.Popen, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = re.search(r"application_\d+_\d+", log.read_text())
        if match:
            return match.group(0)
        assert proc.poll() is None, f"the launcher ended before submitting:\n{log.read_text()[-3000:]}"
        time.sleep(1)
    pytest.fail(f"no application id within {timeout}s:\n{log.read_text()[-3000:]}")


def _wait_for_state(app_id: str, states: set[str], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    state = "unknown"
    while time.monotonic() < deadline:
        out = subprocess.run(["yarn", "application", "-status", app_id], capture_output=True, text=True).stdout
        match = re.search(r"^\s*State\s*:\s*(\w+)", out, re.M)
        state = match.group(1) if match else state
        if state in states:
            return state
        time.sleep(3)
    pytest.fail(f"{app_id} stayed {state} for {timeout}s (waiting for {sorted(states)})")
