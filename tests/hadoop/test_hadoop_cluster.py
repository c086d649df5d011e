"""On a real Hadoop: the one-machine cluster of ``hvdtrain cluster`` (Apache Hadoop's minicluster, one JVM).

tests/hadoop/conftest.py starts it once per session and always stops it. What runs here meets a real NameNode,
DataNode, ResourceManager and two NodeManagers: the cluster on loopback with two NodeManagers, hdfs:// from
Python, safe mode during a checkpoint write (waited out), an unreachable ResourceManager and an oversized
container request (refused in seconds, naming why), and four YARN applications, each a step of a team's loop:

1. ``hvdtrain yarn etl --master yarn``: a Hive table, in the cluster's Hive metastore service (``cluster up
   --hive``) with its warehouse on HDFS, to TFRecords published on HDFS;
   the first job, so it packs the env archive, uploads it to the env cache on HDFS, and the NodeManagers
   localize it;
2. ``hvdtrain yarn submit --num-workers 2`` on that dataset: the archive reused (no second upload), two
   executors on two NodeManagers, the active NameNode failed over mid-training (HDFS is an HA nameservice,
   ``hdfs://hvdtrain``), then one executor's container killed and the job resumed exactly from an HDFS checkpoint
   written through the new active NameNode, the export on HDFS; then every rank's log, the killed container's included, read back
   with ``yarn logs -applicationId`` from the cluster's aggregated logs;
3. ``hvdtrain yarn score --master yarn`` with that export: the ETL's table read, and the predictions table
   written, through the same metastore service (two jobs share it; neither has a metastore of its own);
4. Ctrl-C on a cluster-mode submission: the application KILLED, no container left;
5. an elastic ``hvdtrain yarn submit`` that loses a container, goes on at one rank and grows back in a new one;
6. ``hvdtrain yarn run`` of a user's Horovod script in cluster mode, to FINISHED/SUCCEEDED, and of a script whose
   rank outgrows its container: the NodeManagers enforce container memory, as a production cluster's do, and the
   command names the kill in one line.

Every application carries a planted secret (yarn.env, a Spark setting); the module's last test sweeps the
command lines seen while they ran, the ResourceManager's records, the aggregated logs, HDFS and this host's
files for it (#54).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tarfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import psutil
import pytest
import yaml

from benchmarks import kill_drill
from hvdtrain.core import config
from hvdtrain.core.errors import ANY_FAILURE, DataError
from hvdtrain.data import manifest
from hvdtrain.hadoop import fs, ledger
from hvdtrain.hadoop.minicluster import cluster
from hvdtrain.runtime import startup
from hvdtrain.training import checkpoint
from tests.hadoop.conftest import cluster_env, packed_env
from tests.multiprocess.test_yarn_local import REPO, read_records, run_submit, submit_command, submit_env, write_job
from tests.support.proc_watch import ProcessWatcher

pytestmark = pytest.mark.hadoop

SAMPLE = {"rows": 1200, "num_classes": 4, "words_per_class": 40, "filler_words": 300, "class_word_rate": 0.5,
          "min_words": 12, "max_words": 30, "label_noise": 0.0, "seed": 7}
PYSPARK_JARS = cluster.pyspark_jars_dir()
APP_ID = re.compile(r"application_\d+_\d+")


def hadoop_cli(*argv: str, timeout: float = 120) -> str:
    """Hadoop's own ``yarn`` / ``hdfs`` CLI from the cluster's bin/ (on PATH while the session runs)."""
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{argv}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    return proc.stdout


# Two cores per executor: a NodeManager (3 vcores, cores counted) holds the application master and one such
# executor, never two, so the two ranks run on two NodeManagers, and a relaunched one where its container was.
SPREAD = {"executor_cores": 2}
# In cluster mode the driver's application master (1 GB heap + 384 MB: 1,536 MB) and a rank's executor share a
# 4,096 MB NodeManager only with a rank of 1 GB (1 GB + 384 MB + 1 GB: 2,560 MB), not the fitting 1.5 GB.
CLUSTER_MODE_RANK = "1024m"


# #54: a secret planted in every job's yarn: block, as a user's database password and a Spark setting: it must
# reach the ranks and executors, and no command line, ResourceManager record, log or output but the owner-only
# files that must carry it (test_the_planted_secret_... at the end of this module sweeps them all).
SECRET = "Pl4nted-Y4rn-S3cret-9c2f"
PLANTED_ENV = {"PGPASSWORD": SECRET}
PLANTED_CONF = {"spark.hadoop.fs.s3a.secret.key": SECRET}


def yarn_block(hdfs_root: str, **extra: Any) -> dict[str, Any]:
    """The yarn: block that fits the cluster (``hvdtrain cluster``'s own), with the env cache under ``hdfs_root``
    and the planted secret in its environment and Spark settings."""
    env = {**PLANTED_ENV, **extra.pop("env", {})}
    block = cluster.yarn_settings(f"{hdfs_root}/envs", PYSPARK_JARS, **extra)
    return {**block, "env": {**block["env"], **env}, "spark_conf": {**block["spark_conf"], **PLANTED_CONF}}


@pytest.fixture(scope="module", autouse=True)
def processes() -> Iterator[ProcessWatcher]:
    """Every command line on this host while the module's jobs run, and the environment of every Horovod rank that
    a Spark task starts (``horovod.spark.task.gloo_exec_fn``)."""
    watcher = ProcessWatcher("horovod.spark.task.gloo_exec_fn")
    watcher.start()
    yield watcher
    watcher.stop()


# -- the cluster itself ---------------------------------------------------------------------------

def test_cluster_is_up_on_loopback_with_two_nodemanagers(hadoop_cluster: dict) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cli = [sys.executable, "-m", "hvdtrain.cli", "cluster"]
    status = json.loads(subprocess.run([*cli, "status", "--json"], capture_output=True, text=True, env=env,
                                       check=True).stdout)
    for key in ("hadoop_conf_dir", "resourcemanager_web", "namenode_web", "hadoop_version", "pid"):
        assert status[key], key
    assert status["hadoop_version"] == "3.4.1" and status["pid"] == hadoop_cluster["pid"]
    again = subprocess.run([*cli, "up"], capture_output=True, text=True, env=env)  # up twice is harmless
    assert again.returncode == 0 and f"already running (pid {status['pid']})" in again.stdout
    # ... and what a job may ask for there (test_requests_that_cannot_fit_... runs the docs' commands with it)
    assert ("settings that fit its containers: yarn.executor_memory=1g yarn.executor_cores=1 yarn.rank_memory=1536m"
            in again.stdout)
    fetch = subprocess.run([*cli, "fetch"], capture_output=True, text=True, env=env)  # what make env runs: cached
    assert fetch.returncode == 0 and "hvdtrain cluster: Hadoop 3.4.1 jars and launcher ready in" in fetch.stdout, \
        fetch.stdout + fetch.stderr
    nodes = hadoop_cli("yarn", "node", "-list")
    assert "Total Nodes:2" in nodes and nodes.count("RUNNING") == 2
    listening = [c.laddr for c in psutil.Process(status["pid"]).net_connections("inet")
                 if c.status == psutil.CONN_LISTEN]
    assert len(listening) >= 10 and {a.ip.replace("::ffff:", "") for a in listening} == {"127.0.0.1"}
    # The NodeManagers' java.nio local filesystem is the cluster JVM's own: a client (spark-submit) reading
    # core-site.xml must not be sent to a class it does not have.
    sites = "".join(p.read_text() for p in Path(status["hadoop_conf_dir"]).glob("*-site.xml"))
    assert "fs.defaultFS" in sites and "HvdtrainMiniCluster" not in sites


def test_hdfs_paths_reach_the_namenode_from_python(hadoop_cluster: dict, hdfs_root: str) -> None:
    """hdfs:// (mapped to the NameNode's WebHDFS through HADOOP_CONF_DIR) and webhdfs:// reach the same files."""
    base = f"{hdfs_root}/fs"
    fs.write_bytes_atomic(f"{base}/a.json", b"one")
    fs.write_bytes_atomic(f"{base}/a.json", b"two")  # rename over: the NameNode's rename2 with OVERWRITE
    web = hadoop_cluster["namenode_web"].replace("http://", "webhdfs://")
    assert fs.read_bytes(f"{web}/user/hvdtrain-test/fs/a.json") == b"two"
    fs.move(f"{base}/a.json", f"{base}/b.json")
    assert fs.listdir(base) == ["b.json"]
    assert "b.json" in hadoop_cli("hdfs", "dfs", "-ls", base)  # Hadoop's own client sees what Python wrote
    with pytest.raises(FileNotFoundError):
        fs.read_bytes(f"{base}/missing")
    fs.delete(base)
    assert not fs.exists(base)


def test_viewfs_paths_reach_the_nameservice_through_the_clusters_mount_table(hadoop_cluster: dict, hdfs_root: str,
                                                                             tmp_path: Path) -> None:
    """#56: a federated cluster's ``viewfs://`` paths, resolved by its mount table (XIncluded by core-site.xml, as
    clusters keep it) to the HA nameservice: what Python writes there, Hadoop's own ViewFileSystem reads."""
    conf = tmp_path / "conf"
    shutil.copytree(hadoop_cluster["hadoop_conf_dir"], conf)
    link = f"{hdfs_root}/viewfs-data"
    (conf / "mountTable.xml").write_text(
        '<configuration><property><name>fs.viewfs.mounttable.warehouse.link./data</name>'
        f'<value>{link}</value></property></configuration>')
    core = (conf / "core-site.xml").read_text()
    (conf / "core-site.xml").write_text(core.replace("<configuration>", '<configuration xmlns:xi='
                                                     '"http://www.w3.org/2001/XInclude"><xi:include href="mountTable.xml"/>', 1))
    os.environ["HADOOP_CONF_DIR"] = str(conf)  # restored after the test (conftest.cluster_env)
    fs.write_bytes_atomic("viewfs://warehouse/data/part-0.json", b"through the mount table")
    assert fs.read_bytes(f"{link}/part-0.json") == b"through the mount table"
    assert fs.listdir("viewfs://warehouse/data") == ["part-0.json"]
    shown = hadoop_cli("hdfs", "dfs", f"-Dfs.viewfs.mounttable.warehouse.link./data={link}", "-cat",
                       "viewfs://warehouse/data/part-0.json")
    assert shown.strip().endswith("through the mount table"), shown
    with pytest.raises(DataError, match="no link of the ViewFs mount table 'warehouse' covers /elsewhere"):
        fs.exists("viewfs://warehouse/elsewhere")


def test_what_hvdtrain_replaces_on_hdfs_goes_to_the_trash_and_what_it_did_not_write_stays(hdfs_root: str) -> None:
    """#54: pyarrow's deletes bypass HDFS's trash, so an overwrite by mistake was unrecoverable. With the cluster's
    trash on (fs.trash.interval in core-site.xml, as ``cluster up`` and most clusters set it), the files a ledger
    names move to the user's ``.Trash/Current`` under their own path, as ``hdfs dfs -rm`` moves them, and Hadoop's
    own client finds them there with their bytes; a file no ledger names stays where it was; a second removal of
    the same path gets a timestamped name beside the first, as Hadoop's does."""
    assert fs.trash_minutes(hdfs_root) == 1440
    out = f"{hdfs_root}/trash/out"
    trash = None
    for attempt in (b"v1", b"v2"):
        fs.write_bytes_atomic(f"{out}/train/part-0.tfrecord", attempt)
        fs.write_bytes_atomic(f"{out}/notes.txt", b"the user's own")
        ledger.write(out, ledger.Ledger("hvdtrain etl", ("train/*",)))
        left = ledger.delete_owned(out, ledger.Ledger("hvdtrain etl", ("train/*",)).owns)
        assert left == ["notes.txt"] and fs.read_bytes(f"{out}/notes.txt") == b"the user's own"
        assert not fs.exists(f"{out}/train")
        listing = hadoop_cli("hdfs", "dfs", "-ls", "-R", "/user")
        trash = sorted(set(re.findall(r"(/user/[^/\s]+/\.Trash/Current/user/hvdtrain-test/trash/out/train/"
                                      r"part-0\.tfrecord\d*)$", listing, re.M)))
        assert len(trash) == (1 if attempt == b"v1" else 2), listing[-3000:]
    assert trash is not None  # both kept, neither overwritten (the last line: Hadoop's CLI may warn first)
    assert {hadoop_cli("hdfs", "dfs", "-cat", t).splitlines()[-1] for t in trash} == {"v1", "v2"}
    fs.delete(f"{hdfs_root}/trash")


def test_safe_mode_during_a_checkpoint_write_is_waited_out(hadoop_cluster: dict, hdfs_root: str,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    root = f"{hdfs_root}/safemode-ckpt"
    writer = checkpoint.CheckpointWriter(root, background=False)
    arrays = {"w": np.arange(1000, dtype=np.float32)}
    errors: list[BaseException] = []
    hadoop_cli("hdfs", "dfsadmin", "-safemode", "enter")
    try:
        with caplog.at_level(logging.WARNING, logger="hvdtrain.hadoop.fs"):
            thread = threading.Thread(target=lambda: _record(errors, writer.save, 7, arrays, {"epoch": 1}))
            thread.start()
            deadline = time.monotonic() + 120
            while "safe mode" not in caplog.text and thread.is_alive() and time.monotonic() < deadline:
                time.sleep(0.5)
            assert "the NameNode is in safe mode; waiting" in caplog.text, "the write did not meet safe mode"
    finally:
        hadoop_cli("hdfs", "dfsadmin", "-safemode", "leave")
    thread.join(timeout=300)
    assert not thread.is_alive() and errors == []
    restored = checkpoint.restore_latest(root)
    assert restored is not None and restored[0].step == 7
    np.testing.assert_array_equal(restored[1]["w"], arrays["w"])


def _record(errors: list[BaseException], fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except ANY_FAILURE as exc:  # reported by the test
        errors.append(exc)


# -- submissions refused in seconds ------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_archive(hadoop_cluster: dict, hdfs_root: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A stand-in env archive for submissions the cluster must refuse before any container runs."""
    folder = tmp_path_factory.mktemp("tiny-env")
    (folder / "bin").mkdir()
    path = folder / "env.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        tar.add(folder / "bin", arcname="bin")
    uri = f"{hdfs_root}/envs/tiny.tar.gz"
    with cluster_env(hadoop_cluster):  # module fixtures run before the per-test environment is set
        fs.copy_from_local(str(path), uri)
    return uri


def test_unreachable_resourcemanager_fails_fast_naming_it(hadoop_cluster: dict, tmp_path: Path,
                                                          tiny_archive: str) -> None:
    conf = tmp_path / "conf"
    shutil.copytree(hadoop_cluster["hadoop_conf_dir"], conf)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    site = conf / "yarn-site.xml"
    site.write_text(re.sub(r"(<name>yarn\.resourcemanager\.address</name><value>)[^<]*", rf"\g<1>127.0.0.1:{dead}",
                           site.read_text()))
    job = write_job(tmp_path, "norm", "hdfs:///none", str(tmp_path / "out"),
                    yarn={"env_archive": tiny_archive, "start_timeout": 60})
    start = time.monotonic()
    proc = subprocess.run(submit_command(job, "--num-workers", "2"), cwd=REPO, capture_output=True, text=True,
                          env=submit_env(HADOOP_CONF_DIR=str(conf)), timeout=120)
    elapsed = time.monotonic() - start
    assert proc.returncode == 4, proc.stderr[-3000:]
    assert f"cannot reach the ResourceManager at 127.0.0.1:{dead}" in proc.stderr.strip().splitlines()[-1]
    assert elapsed < 30, f"took {elapsed:.0f}s"


def _applications() -> dict[str, tuple[str, str]]:
    """Every application the ResourceManager has accepted: id -> (name, queue), from Hadoop's own CLI (the REST
    API's /ws/v1/cluster/apps JSON is malformed in 3.4.1 once an application exists: applicationId's protobuf)."""
    out = {}
    for line in hadoop_cli("yarn", "application", "-list", "-appStates", "ALL").splitlines():
        fields = [f.strip() for f in line.split("\t")]
        if len(fields) > 4 and fields[0].startswith("application_"):
            out[fields[0]] = (fields[1], fields[4])
    return out


def _hvdtrain(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hvdtrain.cli", *args, f"workdir={tmp_path}"], cwd=REPO,
                          env=submit_env(), capture_output=True, text=True, timeout=600)


def test_requests_that_cannot_fit_are_one_line_before_anything_is_packed_or_submitted(hadoop_cluster: dict,
                                                                                      tmp_path: Path) -> None:
    """docs/hadoop.md's own command on the demo config's defaults (8 GB, 4-core executors), an unknown queue and
    a ring the queue can never hold at once: each refused with one line from the ResourceManager's limits
    (4096 MB and 3 vcores per container, 8192 MB and 6 vcores in all), before the env is packed; the
    ResourceManager never sees an application. (spark-submit used to refuse the first with a Java stack trace,
    and accept the 4-core request for the ResourceManager to FAIL it.)"""
    before = _applications()
    docs = ["yarn", "etl", "configs/demo.yaml", "--master", "yarn", "--create-sample-table",
            "etl.output=hdfs:///user/hvdtrain-test/docs-demo"]
    fitting = [f"yarn.{k}={v}" for k, v in cluster.FITTING_YARN.items()]  # what `hvdtrain cluster up` prints
    cases = {
        "demo defaults": (docs, "hvdtrain: error: yarn.executor_memory does not fit: each executor container asks "
                                "YARN for 8,192 MB + 819 MB overhead = 9,011 MB, and queue root.default"),
        "4 cores": ([*docs, "yarn.executor_memory=1g"], "hvdtrain: error: yarn.executor_cores does not fit: each "
                                                        "executor container asks YARN for 4 vcores"),
        "unknown queue": ([*docs, *fitting, "yarn.queue=etl"], "hvdtrain: error: yarn.queue names no queue of the "
                                                                "ResourceManager at"),
        "ring": (["yarn", "submit", "configs/demo.yaml", "--master", "yarn", "--num-workers", "5", *fitting],
                 "hvdtrain: error: yarn.num_workers can never run at once: 5 executors"),
        # within the queue's 8,192 MB, but no NodeManager holds the cluster-mode driver's master and a rank's executor
        "nodes": (["yarn", "submit", "configs/demo.yaml", "--master", "yarn", "--num-workers", "2", *fitting,
                   "yarn.deploy_mode=cluster", "yarn.driver_memory=1g"],
                  "hvdtrain: error: yarn.num_workers can never run at once: 2 executors"),
    }
    errors = {}
    for name, (args, expected) in cases.items():
        proc = _hvdtrain(tmp_path, *args)
        errors[name] = last = proc.stderr.strip().splitlines()[-1]
        assert proc.returncode == 2 and last.startswith(expected), f"{name}: {proc.stderr[-3000:]}"
        assert "Traceback" not in proc.stderr and "env archive" not in proc.stderr + proc.stdout, name
        assert not any(line.startswith("$ ") for line in proc.stdout.splitlines()), name  # spark-submit never ran
    assert "grants at most 4,096 MB per container; set yarn.executor_memory=3712m or less" in errors["demo defaults"]
    assert "(its queues: root.default, root.ml)" in errors["unknown queue"]
    assert "(4,096 MB and 3 vcores, 4,096 MB and 3 vcores) hold at most 1 of them at once" in errors["nodes"]
    assert _applications() == before


def test_a_gateway_without_nccl_submits_gpu_jobs_by_the_archive_it_ships(hadoop_cluster: dict, hdfs_dataset: str,
                                                                        hdfs_root: str, tmp_path: Path) -> None:
    """#56 item 8: this host's Horovod has no NCCL, like a gateway's. ``yarn submit --gpus-per-worker 1`` with
    ``yarn.env_archive`` checks the archive's Horovod on HDFS instead: the session's archive (its build record,
    written when the ETL's submission packed this environment, says no NCCL) is refused in one line; a CUDA
    host's archive without a record is read as a stream from HDFS up to its Horovod library, and the dry-run
    passes with the GPU settings and that archive shipped."""
    from tests.unit.test_gateway_gpu_submit import LIBRARY, _archive, _installed_library
    from yarn import packaging

    envs = f"{hdfs_root}/envs"
    session = next(f"{envs}/{n}" for n in fs.listdir(envs)
                   if n.endswith(".tar.gz") and fs.exists(f"{envs}/{n}{packaging.IDENTITY_SUFFIX}"))
    cuda = f"{envs}/cuda-host-env.tar.gz"
    fs.copy_from_local(_archive(tmp_path / "cuda.tar.gz", _installed_library() + packaging._NCCL_SYMBOL), cuda)
    job = write_job(tmp_path, "gateway", hdfs_dataset, f"{hdfs_root}/gateway-out", yarn=yarn_block(hdfs_root))

    def dry_run(archive: str) -> subprocess.CompletedProcess:
        return subprocess.run(submit_command(job, "--num-workers", "2", "--gpus-per-worker", "1", "--dry-run",
                                             f"yarn.env_archive={archive}"),
                              cwd=REPO, capture_output=True, text=True, env=submit_env(), timeout=300)

    refused = dry_run(session)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert refused.stderr.strip().splitlines()[-1].startswith(
        f"hvdtrain: error: yarn.env_archive ships Horovod without NCCL (its build record {session}.txt)")
    passed = dry_run(cuda)
    assert passed.returncode == 0, passed.stderr[-3000:]
    assert "spark.executor.resource.gpu.amount=1" in passed.stdout and f"{cuda}#env" in passed.stdout
    assert not fs.exists(cuda + packaging.IDENTITY_SUFFIX) and LIBRARY  # decided from the library itself


# -- YARN jobs end to end ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def etl_job(hadoop_cluster: dict, hdfs_root: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ETL's config: the cluster's Hive metastore service (hive.embedded: false; hive-site.xml in
    HADOOP_CONF_DIR names it, as on a gateway), whose warehouse is on HDFS; output on HDFS."""
    folder = tmp_path_factory.mktemp("hadoop-etl")
    cfg = config.from_dict({
        "name": "clusteretl", "workdir": str(folder),
        "source": {"table": "hvdtrain_test.reviews", "sample": SAMPLE},
        "hive": {"embedded": False},
        "etl": {"output": f"{hdfs_root}/data", "max_length": 32, "vocab_size": 600, "min_shards_per_split": 2,
                "min_shard_mb": 0},
        "yarn": yarn_block(hdfs_root),
    }, base_dir=str(folder))
    path = folder / "etl.yaml"
    path.write_text(cfg.to_yaml())
    return path


@pytest.fixture(scope="module")
def hdfs_dataset(hadoop_cluster: dict, etl_job: Path) -> str:
    """``hvdtrain yarn etl --master yarn``: TFRecords published to hdfs:// (the publish rename done by the
    NameNode). The first YARN job: it packs the env archive and uploads it to the env cache on HDFS. It goes to
    the cluster's second queue (yarn.queue=ml: spark-submit's --queue)."""
    cmd = [sys.executable, "-m", "hvdtrain.cli", "yarn", "etl", str(etl_job), "--master", "yarn",
           "--create-sample-table", "--overwrite", "--num-executors", "2", "yarn.queue=ml"]
    packed_env(hadoop_cluster)
    with cluster_env(hadoop_cluster):
        proc = run_submit(cmd, timeout=1500)
    assert "env archive: uploading" in proc.stdout + proc.stderr
    return config.load(str(etl_job)).etl.output


@pytest.mark.timeout(1800)
def test_yarn_etl_publishes_a_dataset_on_hdfs(hadoop_cluster: dict, hdfs_dataset: str, hdfs_root: str) -> None:
    queues = {queue for name, queue in _applications().values() if name == "hvdtrain-etl-clusteretl"}
    assert queues and queues <= {"ml", "root.ml"}, _applications()  # it ran in the queue it asked for
    m = manifest.read(hdfs_dataset)
    assert sum(m.split(s).records for s in m.splits) == SAMPLE["rows"]
    assert all(len(m.split(s).shards) >= 2 for s in m.splits)
    assert fs.exists(m.shard_uri(m.split("train").shards[0]))
    assert any(n.endswith(".tar.gz") for n in fs.listdir(f"{hdfs_root}/envs"))
    table = f"{hadoop_cluster['hive_warehouse']}/hvdtrain_test.db/reviews"
    assert fs.listdir(table)  # the Hive table's files, on HDFS
    # #54: what hvdtrain writes withholds HVDTRAIN_HDFS_UMASK (027), not the cluster's 022: shards by the
    # executors' Python, the manifest by the driver's, the Hive table by Spark's JVM; rejected raw rows: 700.
    shard = m.shard_uri(m.split("train").shards[0])
    table_file = next(f for f in fs.walk(table) if not f.startswith(("_", ".")))
    modes = {"shard": fs.permission(shard), "its folder": fs.permission(shard.rsplit("/", 1)[0]),
             "manifest": fs.permission(f"{hdfs_dataset}/{manifest.MANIFEST_NAME}"),
             "table file": fs.permission(f"{table}/{table_file}")}
    assert modes == {"shard": 0o640, "its folder": 0o750, "manifest": 0o640, "table file": 0o640}, \
        {k: oct(v) for k, v in modes.items()}
    if fs.exists(f"{hdfs_dataset}/rejects"):
        assert fs.permission(f"{hdfs_dataset}/rejects") == 0o700
    # the packed environment carried the compiled encoder to the executors (hvdtrain-native, not the code zip)
    report = json.loads(fs.read_bytes(f"{hdfs_dataset}/etl_report.json"))
    assert report["shards_by_encoder"] == {"native": sum(len(m.split(s).shards) for s in m.splits)}, report


# -- a container lost mid-training -------------------------------------------------------------------------

KILL_EVERY, KILL_EPOCHS = 4, 2  # checkpoint.every_steps and epochs of the killed run (29 steps an epoch)


def _executor_jvms(app_id: str) -> list[psutil.Process]:
    """The executor JVMs of an application (YARN containers on this host, children of the cluster's JVM)."""
    out = []
    for proc in psutil.process_iter(["cmdline"]):
        argv = proc.info["cmdline"] or []
        cmd = " ".join(argv)  # the JVM itself, not the container's launch script (bash -c "java ...")
        if argv and argv[0].endswith("java") and "YarnCoarseGrainedExecutorBackend" in cmd and app_id in cmd:
            out.append(proc)
    return out


@pytest.fixture(scope="module")
def killed(hadoop_cluster: dict, hdfs_dataset: str, hdfs_root: str, tmp_path_factory: pytest.TempPathFactory,
           request: pytest.FixtureRequest) -> dict[str, Any]:
    """``hvdtrain yarn submit --num-workers 2 --max-restarts 1`` on the ETL's dataset. Once its first checkpoint is
    committed on HDFS, the active NameNode is failed over (``hdfs haadmin -failover nn1 nn2``: the first NameNode
    of the nameservice is now the standby); once a checkpoint written through the new active one is committed, the
    first executor's JVM is SIGKILLed (its container lost), and the driver relaunches the ranks in the same
    application, which resume from that checkpoint. The second YARN job of the session: it reuses the archive the
    ETL uploaded. The rest of this module runs with nn2 active; nn1 is made active again at its end."""
    folder = tmp_path_factory.mktemp("hadoop-kill")
    output = f"{hdfs_root}/train-killed"
    job = write_job(folder, "clusterkill", hdfs_dataset, output, epochs=KILL_EPOCHS, tracking=True,
                    record_trace=str(folder / "trace"),
                    yarn=yarn_block(hdfs_root, **SPREAD,
                                    env={"SPARK_LOCAL_IP": "127.0.0.1",
                                         "MLFLOW_TRACKING_URI": f"sqlite:///{folder}/mlflow.db"}))
    doc = yaml.safe_load(job.read_text())
    doc["checkpoint"].update({"dir": f"{output}-checkpoints", "every_steps": KILL_EVERY, "keep_last": 2})
    doc["fault"].update({"peer_timeout": 30, "restart_backoff": 1})
    job.write_text(yaml.safe_dump(doc, sort_keys=False))
    log = folder / "submit.log"
    failover: dict[str, Any] = {}
    request.addfinalizer(lambda: _fail_back(hadoop_cluster))

    def fail_over_then_kill(app: str, proc: subprocess.Popen) -> str:
        trace, checkpoints = folder / "trace" / "rank0.keys", f"{output}-checkpoints"
        failover["before"] = _wait_for_checkpoint(trace, checkpoints, KILL_EVERY, proc, log)
        failover["said"] = hadoop_cli("hdfs", "haadmin", "-failover", "nn1", "nn2")
        failover["states"] = [_ha_state(nn) for nn in ("nn1", "nn2")]
        # A checkpoint of a later step than rank 0 had reached then: begun, written and committed through nn2.
        failover["at_step"] = kill_drill._current_pid(str(trace), 0)[1]
        failover["after"] = _wait_for_checkpoint(trace, checkpoints, failover["at_step"] + 1, proc, log)
        return _kill_an_executor(app)

    with cluster_env(hadoop_cluster):
        app_id, killed_container = _submit_and_kill(job, log, fail_over_then_kill, "--max-restarts", "1")
        text = log.read_text()
        return {"doc": read_records(f"{output}/yarn_result.json"), "trace": folder / "trace", "app_id": app_id,
                "killed_container": killed_container, "failover": failover,
                "report": json.loads(fs.read_bytes(f"{output}/eval_report.json")), "log": text,
                "output": output, "mlflow": f"sqlite:///{folder}/mlflow.db", "mlflow_folder": folder}


def _ha_state(namenode: str) -> str:
    """``active`` or ``standby`` (``hdfs haadmin -getServiceState``; its output may start with a WARN line)."""
    return hadoop_cli("hdfs", "haadmin", "-getServiceState", namenode).split()[-1]


def _fail_back(hadoop_cluster: dict) -> None:
    """nn1 active again (the later modules' webhdfs:// paths name it), whichever NameNode is active now."""
    with cluster_env(hadoop_cluster):
        if _ha_state("nn1") != "active":
            hadoop_cli("hdfs", "haadmin", "-failover", "nn2", "nn1")


def _submit_and_kill(job: Path, log: Path, kill: Callable[[str, subprocess.Popen], str],
                     *args: str) -> tuple[str, str]:
    """``yarn submit --num-workers 2`` of ``job`` (output to ``log``), ``kill(app_id, proc)`` once the application
    exists (its lost container's id), then the launcher's end, which must be exit 0: (app id, lost container). The
    application is released (Ctrl-C) if the launcher is still running when the test fails."""
    with open(log, "w") as out:
        proc = subprocess.Popen(submit_command(job, "--num-workers", "2", *args), cwd=REPO, env=submit_env(),
                                stdout=out, stderr=subprocess.STDOUT, text=True)
        try:
            app_id = _wait_for_app(log, proc, timeout=600)
            lost = kill(app_id, proc)
            code = proc.wait(timeout=900)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)  # releases the application
                proc.wait(timeout=120)
    assert code == 0, log.read_text()[-6000:]
    return app_id, lost


def _kill_an_executor_past_a_checkpoint(app_id: str, trace: Path, checkpoints: str, proc: subprocess.Popen,
                                        log: Path) -> str:
    """SIGKILL one executor JVM once a checkpoint is committed on HDFS (the writes are asynchronous: a step
    count alone can come before the commit); returns its container's id."""
    _wait_for_checkpoint(trace, checkpoints, KILL_EVERY, proc, log)
    return _kill_an_executor(app_id)


def _wait_for_checkpoint(trace: Path, checkpoints: str, step: int, proc: subprocess.Popen, log: Path) -> int:
    """The newest committed checkpoint's step once it is ``step`` or later (rank 0 past it too)."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"training ended (exit {proc.returncode}) before step {step}'s checkpoint:\n" \
                                    f"{log.read_text()[-4000:]}"
        now = kill_drill._current_pid(str(trace), 0)
        newest = checkpoint.newest_step(checkpoints) or 0
        if now is not None and now[1] >= step and newest >= step:
            return newest
        time.sleep(0.05)
    pytest.fail(f"training did not commit step {step}'s checkpoint in time:\n{log.read_text()[-4000:]}")


def _kill_an_executor(app_id: str) -> str:
    """SIGKILL the first of the application's two executor JVMs; returns its container's id."""
    jvms = _executor_jvms(app_id)
    assert len(jvms) == 2, [j.pid for j in jvms]
    container = jvms[0].environ()["CONTAINER_ID"]  # the NodeManager sets it for every container
    jvms[0].kill()
    return container


@pytest.mark.timeout(1800)
def test_yarn_submit_on_two_nodemanagers_resumes_a_killed_container_exactly(killed: dict[str, Any],
                                                                           hdfs_dataset: str,
                                                                           hdfs_root: str) -> None:
    """``hvdtrain yarn submit``: the env archive cached on HDFS (the ETL uploaded it; no second upload) and
    localized by the NodeManagers, two executors on two NodeManagers, input, checkpoints and the export on HDFS,
    the MLflow run, a lost container resumed exactly, and the command's closing lines (the result's path; the
    application's id, final state and where its logs are)."""
    doc, app_id, output, log = killed["doc"], killed["app_id"], killed["output"], killed["log"]
    assert "env archive: reusing" in log and "env archive: uploading" not in log, log[-3000:]
    assert doc["ok"] and doc["world_size"] == 2 and len(doc["restarts"]) == 1, doc
    result = doc["result"]
    assert result["ranks_agree"] is True and result["world_size"] == 2, result
    assert result["test_accuracy"] >= 0.5, result
    assert all(r["container"].startswith("container_") for r in doc["ranks"]), doc["ranks"]
    assert len({r["nodemanager"] for r in doc["ranks"]}) == 2, doc["ranks"]  # two executors, two NodeManagers
    assert killed["report"]["resumed_from"], killed["report"]  # the relaunch continued from the HDFS checkpoint
    # #56 item 1: the active NameNode failed over mid-job (nn1, the nameservice's first, standby from then on); the
    # job went on, wrote checkpoints through nn2, and its relaunch resumed from one of those, exactly (below).
    failover = killed["failover"]
    assert "Failover from nn1 to nn2 successful" in failover["said"] and failover["states"] == ["standby", "active"]
    assert failover["after"] > failover["at_step"] >= failover["before"], failover
    resumed_step = int(re.search(r"ckpt-(\d+)/?$", killed["report"]["resumed_from"]).group(1))
    assert resumed_step >= failover["after"], (resumed_step, failover)
    assert _final_state(app_id) == ("FINISHED", "SUCCEEDED")
    assert f"hvdtrain: {app_id} ended FINISHED/SUCCEEDED; logs: yarn logs -applicationId {app_id}" in log
    assert f"result: {output}/yarn_result.json" in log
    assert any(n.endswith(".tar.gz") for n in fs.listdir(f"{hdfs_root}/envs"))  # the archive the containers ran
    assert fs.exists(f"{output}/model.keras") and checkpoint.latest_valid(f"{output}-checkpoints") is not None
    # The ranks' start-up clock starts at the launcher: for this report (the relaunch's try) a new container's
    # allocation, its localization and the executor JVM's start are its "launcher" phase. That is seconds, but how
    # many depends on the machine (4.9 s on an idle CI host), so the bound is only one no JVM start can beat; a
    # clock started in the Python process would have no launcher phase at all.
    phases = killed["report"]["startup"]
    assert list(phases)[0] == "launcher" and phases["launcher"] > 1, phases
    print(f"hvdtrain yarn submit (archive cached on HDFS): {startup.describe(phases)}")
    steps = manifest.read(hdfs_dataset).split("train").records // (16 * 2)
    kill_drill.assert_resumed_once_exactly(str(killed["trace"]), 2, KILL_EPOCHS, steps, 16, KILL_EVERY)
    import mlflow

    client, run_id = mlflow.MlflowClient(killed["mlflow"]), doc["result"]["run_id"]
    # Every epoch logged into the one run across the restart, once: when the kill lands after an epoch's end was
    # logged but before its checkpoint was committed, the resumed try redoes that end without logging it again.
    history = client.get_metric_history(run_id, "train_loss")
    assert sorted(m.step for m in history) == list(range(1, KILL_EPOCHS + 1)), history
    assert client.get_run(run_id).data.metrics["restarts"] == 1 and client.get_run(run_id).info.status == "FINISHED"
    # The run's artifacts beside its SQLite database, not in ./mlruns of whichever process created the experiment
    assert client.get_run(run_id).info.artifact_uri.startswith(f"file://{killed['mlflow_folder']}/artifacts/")
    assert any((killed["mlflow_folder"] / "artifacts").rglob("*.keras")), "the model was not logged beside the store"


@pytest.mark.timeout(600)
def test_every_ranks_log_survives_the_application_the_killed_containers_too(killed: dict[str, Any]) -> None:
    """Log aggregation: once the killed-and-resumed application has ended, Hadoop's ``yarn logs -applicationId``
    reads every container's logs from HDFS. Each rank's process begins with a line naming its rank and container
    (``yarn.executor.rank_banner``), forwarded as it is written to its executor's stderr: every rank of the last try
    is in the container its record names, and the SIGKILLed executor's rank is in that container's logs, written
    before the kill (nothing waits for the end of the run to be kept)."""
    app_id, doc, lost = killed["app_id"], killed["doc"], killed["killed_container"]
    _wait_for_log_aggregation(app_id, timeout=120)
    logs = _aggregated_logs(hadoop_cli("yarn", "logs", "-applicationId", app_id))
    assert lost in logs, f"no aggregated logs of the killed container {lost}: {sorted(logs)}"
    assert re.search(rf"hvdtrain: rank [01] of 2 starts in {lost}", logs[lost]), logs[lost][-3000:]
    for rank in doc["ranks"]:  # the try that finished, in its containers
        banner = f"hvdtrain: rank {rank['rank']} of 2 starts in {rank['container']}"
        assert banner in logs.get(rank["container"], ""), (banner, sorted(logs))
    banners = re.findall(r"hvdtrain: rank (\d) of 2 starts in (container_\w+)", "".join(logs.values()))
    assert len(banners) == 4 and {r for r, _ in banners} == {"0", "1"}, banners  # two tries of two ranks
    assert all(f"starts in {c}" in logs[c] for _, c in banners)  # each in its own container's logs
    assert len(logs) >= 4, sorted(logs)  # the application master and three executors, the killed one included


def _wait_for_log_aggregation(app_id: str, timeout: float) -> None:
    """Until the ResourceManager reports the application's logs uploaded by every NodeManager it ran on."""
    deadline, status = time.monotonic() + timeout, "unknown"
    while time.monotonic() < deadline:
        match = re.search(r"Log Aggregation Status\s*:\s*(\w+)", hadoop_cli("yarn", "application", "-status", app_id))
        status = match.group(1) if match else status
        if status in ("SUCCEEDED", "FAILED", "TIME_OUT"):
            break
        time.sleep(2)
    assert status == "SUCCEEDED", f"log aggregation of {app_id}: {status}"


def _aggregated_logs(text: str) -> dict[str, str]:
    """``yarn logs`` output by container: every log file of a container (stdout, stderr, ...) joined (pure)."""
    out: dict[str, str] = {}
    for section in re.split(r"^Container: ", text, flags=re.M)[1:]:
        container = section.split(None, 1)[0]
        out[container] = out.get(container, "") + section
    return out


def _final_state(app_id: str) -> tuple[str, str]:
    out = hadoop_cli("yarn", "application", "-status", app_id)
    state = re.search(r"^\s*State\s*:\s*(\w+)", out, re.M)
    final = re.search(r"Final-State\s*:\s*(\w+)", out)
    return (state.group(1) if state else "?", final.group(1) if final else "?")


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


@pytest.mark.timeout(1800)
def test_yarn_score_writes_predictions_through_the_shared_metastore(hadoop_cluster: dict, killed: dict[str, Any],
                                                                   etl_job: Path) -> None:
    """``hvdtrain yarn score --master yarn`` with the model the killed-and-resumed job exported. #56 item 7: the
    ETL made its table, and scoring reads it and makes its predictions table, through the cluster's metastore
    service: its own audit log names each call."""
    run_submit([sys.executable, "-m", "hvdtrain.cli", "yarn", "score", str(etl_job), "--model", killed["output"],
                "--output-table", "hvdtrain_test.preds", "--partition", "ds=1"], timeout=1500)
    assert fs.listdir(f"{hadoop_cluster['hive_warehouse']}/hvdtrain_test.db/preds/ds=1")
    audit = Path(hadoop_cluster["home"], "hive-metastore.log").read_text(errors="replace")
    calls = {(m.group(1), m.group(2) or m.group(3)) for m in re.finditer(
        r"cmd=source:\S+ (\w+)\s*: (?:db=hvdtrain_test tbl=(\w+)|Table\(tableName:(\w+), dbName:hvdtrain_test)", audit)}
    assert {("create_table", "reviews"), ("get_table", "reviews"), ("create_table", "preds")} <= calls, \
        sorted(calls)
    assert not list(etl_job.parent.rglob("metastore_db"))  # no Derby of the job's own


def test_a_user_the_permissions_refuse_gets_one_line_naming_the_path_the_user_and_the_mode(
        killed: dict[str, Any], hdfs_dataset: str, tmp_path: Path) -> None:
    """#56 item 2: HDFS checks permissions (dfs.permissions.enabled, as on every production cluster) and what
    hvdtrain writes withholds 027 from other users, so a second user (mallory; no Kerberos here, so
    HADOOP_USER_NAME) may read neither the ETL's dataset nor the killed job's checkpoints. Each refusal is one
    line with the NameNode's own words (the user, the access, the path's owner and mode) and the fix, exit 3,
    never a traceback; training never starts a step."""
    env = submit_env(HADOOP_USER_NAME="mallory")
    job = write_job(tmp_path, "mallory", hdfs_dataset, str(tmp_path / "out"))
    attempts = {
        "dataset": [sys.executable, "-m", "hvdtrain.cli", "train", str(job), "--np", "1", "--max-restarts", "0"],
        "checkpoints": [sys.executable, "-m", "hvdtrain.cli", "checkpoints", "list", f"{killed['output']}-checkpoints"],
    }
    for what, cmd in attempts.items():
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 3, f"{what}: {proc.returncode}\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}"
        assert "Traceback" not in proc.stderr, f"{what}: {proc.stderr[-4000:]}"
        assert re.search(r'Permission denied: user=mallory, access=\w+, inode="/user/hvdtrain-test[^"]*":root:'
                         r'supergroup:d?[-rwx]{3}r-x---; ask the owner of the path for access', lines[-1]), \
            f"{what}: {lines[-1]}"
        written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
        assert written == [job.name], f"{what}: {written}"  # no output claimed, no lease left behind


def _script_job(folder: Path, name: str, source: str, yarn: dict[str, Any]) -> tuple[Path, Path]:
    """(the script, in a folder of its own as ``yarn run`` ships it; the config of its ``yarn:`` and ``fault:``)."""
    script = folder / name / f"{name}.py"
    script.parent.mkdir()
    script.write_text(source)
    job = folder / f"{name}.yaml"
    job.write_text(yaml.safe_dump({"name": name, "workdir": str(folder), "tracking": {"enabled": False},
                                   "fault": {"max_restarts": 0}, "yarn": yarn}))
    return script, job


# A user's Horovod script (hvdtrain yarn run): one all-reduce over the ranks, and a digest of the database password
# the job's yarn.env planted (the value itself is never printed).
ALLREDUCE_SCRIPT = """
import hashlib, os, sys
import horovod.tensorflow as hvd
import tensorflow as tf
hvd.init()
total = hvd.allreduce(tf.constant(float(hvd.rank() + 1)), op=hvd.Sum)
digest = hashlib.sha256(os.environ.get("PGPASSWORD", "").encode()).hexdigest()
print(f"rank {hvd.rank()} of {hvd.size()}: sum {float(total):g}, password {digest}, args {sys.argv[1:]}", flush=True)
"""


@pytest.mark.timeout(1200)
def test_yarn_run_runs_a_users_horovod_script_on_two_containers(hadoop_cluster: dict, hdfs_root: str,
                                                               tmp_path: Path) -> None:
    """#56 item 4: ``hvdtrain yarn run`` of a user's own Horovod script in cluster mode (the driver in the
    application master's container), to the end on the ResourceManager: two ranks in two containers all-reduce,
    each gets the job's yarn.env (its secret through the sealed file the executors' daemon reads, #54), the
    command names the application's final state, and every rank's log is on HDFS."""
    packed_env(hadoop_cluster)
    script, job = _script_job(tmp_path, "allreduce", ALLREDUCE_SCRIPT,
                              yarn_block(hdfs_root, **SPREAD, deploy_mode="cluster", rank_memory=CLUSTER_MODE_RANK))
    output = f"{hdfs_root}/user-run"
    proc = run_submit([sys.executable, "-m", "hvdtrain.cli", "yarn", "run", "--config", str(job), "--num-workers",
                       "2", "--output", output, str(script), "--epochs", "3"], timeout=900)
    app_id = APP_ID.search(proc.stdout + proc.stderr).group(0)
    assert f"hvdtrain: {app_id} ended FINISHED/SUCCEEDED" in proc.stdout, proc.stdout[-3000:]
    assert _final_state(app_id) == ("FINISHED", "SUCCEEDED")
    digest = hashlib.sha256(SECRET.encode()).hexdigest()
    for rank in (0, 1):
        log = fs.read_bytes(f"{output}/logs/rank{rank}.log").decode()
        assert f"rank {rank} of 2: sum 3, password {digest}, args ['--epochs', '3']" in log, log[-2000:]
    ranks = read_records(f"{output}/yarn_result.json")["ranks"]
    assert len({r["container"] for r in ranks}) == 2 and all(r["exit_code"] == 0 for r in ranks), ranks


# A user's script whose rank holds 2 GB: resident (every page written), then waits to be measured.
MEMORY_HOG = """
import os, time
import numpy as np
held = np.ones(2048 << 20, dtype=np.uint8)
print("rank", os.environ["HOROVOD_RANK"], "holds", held.nbytes >> 20, "MB", flush=True)
time.sleep(120)  # then exits 0: a job that was not killed succeeds, and the test fails on its exit code
"""


@pytest.mark.timeout(1200)
def test_a_rank_over_its_container_s_memory_is_killed_by_yarn_and_named_in_one_line(hadoop_cluster: dict,
                                                                                    hdfs_root: str,
                                                                                    tmp_path: Path) -> None:
    """#56 item 6: the NodeManagers enforce each container's memory, as a production cluster's do. ``yarn run``
    of a script whose rank holds 2 GB, with ``yarn.rank_memory=512m`` (a 1 GB heap + 384 MB + 512 MB = 1,920 MB,
    which YARN rounds up to a 2 GB container): YARN kills the container, and the command ends in one line with YARN's own figures, what the
    container held and the setting to raise. (The tier's other jobs run with the cluster's fitting 1.5 GB for each
    rank, under the same enforcement.)"""
    packed_env(hadoop_cluster)
    script, job = _script_job(tmp_path, "hog", MEMORY_HOG, yarn_block(hdfs_root, rank_memory="512m"))
    proc = subprocess.run([sys.executable, "-m", "hvdtrain.cli", "yarn", "run", "--config", str(job),
                           "--num-workers", "1", "--output", f"{hdfs_root}/hog-run", str(script)], cwd=REPO,
                          env=submit_env(), capture_output=True, text=True, timeout=900)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 5, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "Traceback" not in last and re.search(
        r"^hvdtrain: error: spark-submit of \S+/hog\.py failed: YARN killed a rank's container for exceeding its physical memory "
        r"limit: [\d.]+ GB of 2 GB physical memory used; each executor container held yarn.executor_memory=1g "
        r"\(the JVM's heap\) \+ spark.executor.memoryOverhead=896m; raise yarn.rank_memory \(now 512m\)", last), last


# Long enough for a new container to join while the survivor trains alone: 1,500 steps took 105 s here, idle;
# with 1,600 the survivor finished before the new container's rank joined on a loaded host (load average 6-8).
ELASTIC_STEPS, ELASTIC_EVERY = 3000, 4


@pytest.mark.timeout(1800)
def test_an_elastic_job_on_yarn_goes_on_without_a_lost_container_and_grows_back_in_a_new_one(
        hadoop_cluster: dict, hdfs_dataset: str, hdfs_root: str, tmp_path: Path) -> None:
    """#56 item 4: ``train.elastic`` on the ResourceManager (``horovod.spark.run_elastic``, Spark's task retries):
    one executor's JVM is SIGKILLed (its container lost) mid-training; the surviving rank goes on alone, YARN
    allocates a new container for Spark's retry of the lost task, and its rank joins: the job ends
    FINISHED/SUCCEEDED at two ranks, every step of both virtual ranks trained, redone at most one commit interval."""
    steps_per_epoch = manifest.read(hdfs_dataset).split("train").records // (16 * 2)
    trace, output = tmp_path / "trace", f"{hdfs_root}/train-elastic"
    job = write_job(tmp_path, "clusterelastic", hdfs_dataset, output, epochs=-(-ELASTIC_STEPS // steps_per_epoch),
                    record_trace=str(trace), elastic={"min_ranks": 1, "max_ranks": 2,
                                                      "commit_every_steps": ELASTIC_EVERY},
                    yarn=yarn_block(hdfs_root, **SPREAD))
    log = tmp_path / "submit.log"

    def kill_mid_training(app_id: str, proc: subprocess.Popen) -> str:
        deadline = time.monotonic() + 900
        while not trace.joinpath("rank1.keys").exists() or \
                len(kill_drill.segments(str(trace / "rank1.keys"))[-1][2]) < ELASTIC_EVERY + 2:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.05)
        jvms = _executor_jvms(app_id)
        assert len(jvms) == 2, [j.pid for j in jvms]
        container = jvms[1].environ()["CONTAINER_ID"]
        jvms[1].kill()
        return container

    app_id, lost = _submit_and_kill(job, log, kill_mid_training)
    assert _final_state(app_id) == ("FINISHED", "SUCCEEDED")
    doc = read_records(f"{output}/yarn_result.json")
    result = doc["result"]
    assert result["sizes"][0] == 2 and 1 in result["sizes"] and result["sizes"][-1] == 2, result  # shrank, grew back
    assert result["ranks_agree"] and doc["world_size"] == 2, result
    containers = {r["container"] for r in doc["ranks"]}
    assert len(containers) == 2 and lost not in containers, (lost, doc["ranks"])  # the new rank in a new container
    total = result["steps"]
    for v in range(2):  # every step of both virtual ranks trained; redone at most one commit interval
        runs = kill_drill.segments(str(trace / f"rank{v}.keys"))
        assert set().union(*(r[2] for r in runs)) == set(range(total)), v
        assert all(0 <= kill_drill.read_to(a) - b[1] <= ELASTIC_EVERY for a, b in zip(runs, runs[1:])), v


@pytest.mark.timeout(1800)
def test_ctrl_c_kills_a_cluster_mode_application(hdfs_dataset: str, hdfs_root: str, tmp_path: Path) -> None:
    job = write_job(tmp_path, "clusterstop", hdfs_dataset, f"{hdfs_root}/train-stop", epochs=200,
                    yarn=yarn_block(hdfs_root, deploy_mode="cluster", rank_memory=CLUSTER_MODE_RANK))
    log = tmp_path / "submit.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(submit_command(job, "--num-workers", "2"), cwd=REPO, env=submit_env(), stdout=out,
                                stderr=subprocess.STDOUT, text=True)
        try:
            app_id = _wait_for_app(log, proc, timeout=900)
            _wait_for_state(app_id, {"RUNNING"}, timeout=600)
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=300) == 130, log.read_text()[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
    assert f"{app_id} killed" in log.read_text()
    assert _wait_for_state(app_id, {"KILLED", "FAILED", "FINISHED"}, timeout=300) == "KILLED"
    nodes = hadoop_cli("yarn", "node", "-list")
    assert re.findall(r"RUNNING\s+\S+\s+(\d+)", nodes) == ["0", "0"], nodes  # no container left


# -- the planted secret, swept for (#54) ----------------------------------------------------------------

HDFS_SKIP = ("envs",)  # the env archives (the venv, packed): nothing a job wrote


@pytest.mark.timeout(1200)
def test_the_planted_secret_reached_the_ranks_and_no_command_line_record_log_or_output(
        hadoop_cluster: dict, hdfs_root: str, processes: ProcessWatcher, etl_job: Path, killed: dict[str, Any]) -> None:
    """Last in the module, after every YARN application of the tier (ETL, the killed-and-resumed training, scoring,
    yarn run, the memory kill, elastic training, Ctrl-C in cluster mode), each submitted with SECRET in yarn.env and a Spark setting:
    every rank had it in its environment, and it is in no process's command line (polled every 50 ms while they
    ran: spark-submit, drivers, executor JVMs, Python daemons, ranks), no ResourceManager record, none of the
    applications' aggregated logs (``yarn logs``: stdout, stderr, and the launch_container.sh YARN copies there),
    no file on HDFS, and no file on this host other than owner-only ones (the shipped 0600 files, as the
    NodeManagers localized them)."""
    processes.stop()  # every command line is in: the applications have ended
    seen = processes.cmdlines
    assert any("YarnCoarseGrainedExecutorBackend" in c for c in seen) and any("yarn.spark_daemon" in c for c in seen)
    assert [c[max(0, c.index(SECRET) - 300):c.index(SECRET) + 40] for c in seen if SECRET in c] == []
    # the ranks in this cluster's containers (the other pytest process may run ranks of local Spark meanwhile)
    ranks = {pid: env for pid, (_, env) in processes.matched.items() if env.get("CONTAINER_ID", "").startswith("container_")}
    assert len(ranks) >= 9, sorted(ranks)  # the killed job's two tries of two ranks, the elastic job's three, ...
    assert {pid: env.get("PGPASSWORD") == SECRET for pid, env in ranks.items()} == {pid: True for pid in ranks}
    apps = sorted(set(APP_ID.findall(hadoop_cli("yarn", "application", "-list", "-appStates", "ALL"))))
    assert len(apps) >= 7, apps
    web = hadoop_cluster["resourcemanager_web"]
    for app in apps:  # the ResourceManager's record: over RPC, and its web UI's page (the minicluster's REST API
        # answers without the records' fields: its shaded jars lack the JSON provider)
        report = hadoop_cli("yarn", "application", "-status", app)
        page = urllib.request.urlopen(f"{web}/cluster/app/{app}", timeout=60).read().decode(errors="replace")
        assert "hvdtrain-" in report and "hvdtrain-" in page and app in page, app  # the records are there
        assert SECRET not in report and SECRET not in page, app
        _wait_for_log_aggregation(app, timeout=300)
        logs = hadoop_cli("yarn", "logs", "-applicationId", app, timeout=600)
        assert "LogType:launch_container.sh" in logs, app  # the containers' environment is among what is read
        assert SECRET not in logs, (app, [line for line in logs.splitlines() if SECRET in line][:5])
    on_hdfs = [f"{root}/{name}" for root in (hdfs_root, hadoop_cluster["fs_default"] + "/user/hive/warehouse")
               for name in fs.walk(root, skip=HDFS_SKIP)]
    assert len(on_hdfs) > 20 and any(p.endswith("manifest.json") for p in on_hdfs)
    assert [p for p in on_hdfs if SECRET.encode() in fs.read_bytes(p)] == []
    # On this host: the NodeManagers' folders (launch scripts, localized files, container logs) and the jobs'
    # own folders (MLflow's store, traces, launcher logs), but not the configs this test wrote for the jobs.
    holders = _local_files_holding(SECRET.encode(), [Path(hadoop_cluster["home"]), etl_job.parent,
                                                     killed["mlflow_folder"]],
                                   written_by_test={etl_job, *killed["mlflow_folder"].glob("*.yaml")})
    shipped = {"hvdtrain-sealed-env.json", "hvdtrain-job.yaml", "__spark_conf__.properties", "__spark_hadoop_conf__.xml"}
    assert holders and all(name in shipped for name, _ in holders), holders  # the shipped files: the secret must reach the job
    assert [(name, oct(mode)) for name, mode in holders if mode & 0o077] == []  # ... and only its owner


def _local_files_holding(needle: bytes, roots: list[Path], written_by_test: set[Path]) -> list[tuple[str, int]]:
    """(name, mode) of every file under ``roots`` that holds ``needle``: the unpacked env archives (a venv: over
    100,000 files that no job writes) and the DataNode's block files (HDFS, swept above) are left out."""
    out = []
    for root in roots:
        for folder, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if not d.endswith(".tar.gz") and d != "dfs"]
            for name in files:
                path = Path(folder, name)
                try:
                    if path in written_by_test or path.is_symlink() or path.stat().st_size > 64 << 20:
                        continue
                    if needle in path.read_bytes():
                        out.append((name, stat.S_IMODE(path.stat().st_mode)))
                except OSError:  # a container's folder deleted meanwhile
                    continue
    return out
