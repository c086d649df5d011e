"""The ``hadoop`` tier's cluster: one real one-machine Hadoop for the tier, stopped when the tier ends.

The cluster lives as long as this package's tests (``scope="package"``): the later tiers run without its JVM.
It is owned by the pytest process (``ClusterSpec.owner_pid``), so a killed pytest leaves no JVM behind either.

``hvdtrain cluster`` (hvdtrain/hadoop/minicluster) starts Apache Hadoop's MiniDFSCluster and MiniYARNCluster in one
JVM (Maven fetches the jars on first use). Each test that uses the cluster runs with HADOOP_CONF_DIR set to the
cluster's configs and its ``bin/`` (Hadoop's own ``yarn`` and ``hdfs`` CLIs) on PATH, as a user would after
``hvdtrain cluster up``; the environment is restored after every such test (and after every module fixture that
submits jobs), so no later test (a Spark session, a benchmark subprocess) finds hdfs:// as its default filesystem.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Iterator

import pytest

from hvdtrain.hadoop.minicluster import cluster
from yarn.packaging import PACK_CACHE_ENV

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="package")
def hadoop_cluster() -> Iterator[dict]:
    home = tempfile.mkdtemp(prefix="hvdtrain-hadoop-")
    # Log aggregation on (the default, as on a production cluster): test_hadoop_cluster.py reads every rank's log
    # back with `yarn logs`, and NodeManagers whose applications' logs are uploaded stop at once.
    # A Hive metastore service too (#56 item 7), as a cluster's: the ETL and scoring jobs share it. HDFS is an HA
    # nameservice (#56 item 1), as on a production cluster: every path of the tier is hdfs://hvdtrain/..., and
    # test_hadoop_cluster.py fails the active NameNode over while a YARN job writes its checkpoints.
    spec = cluster.ClusterSpec(home=home, start_timeout=600, owner_pid=os.getpid(), hive=True, ha=True)
    # The pack cache: the venv is packed once per environment, not once per session (HDFS starts empty).
    pack_cache = os.environ.get(PACK_CACHE_ENV) or os.path.join(cluster.cache_root(), "env-archives")
    prepack = _start_prepack(pack_cache)
    try:
        details = cluster.up(spec)
        # SPARK_LOCAL_IP: the drivers spark-submit starts here bind to loopback, as the cluster does.
        details["env"] = {"HADOOP_CONF_DIR": spec.conf_dir, "PATH": f"{spec.bin_dir}{os.pathsep}{os.environ['PATH']}",
                          "HVDTRAIN_CLUSTER_HOME": home, "SPARK_LOCAL_IP": "127.0.0.1", PACK_CACHE_ENV: pack_cache}
        details["prepack"] = prepack
        yield details
    finally:
        # Waited for, never killed: a killed venv-pack leaves its half-written archive in /tmp. In a session
        # without YARN jobs (one module run alone) that is up to a minute here, and the cache is filled for later.
        prepack[0].wait(timeout=900)
        cluster.down(spec, quiet=True)
        _delete_in_background(home)  # the cluster's HDFS blocks and container folders


# The first YARN job of a session packs this venv (3 GB) into the pack cache unless an earlier session did: a
# minute on 2 cores, on a fresh machine (CI). The packing starts with the session instead, in the background,
# while the cluster starts and the tier's first tests run (they wait on JVMs); the YARN jobs wait for it
# (``packed_env``). It runs the same code as a submission (the environment's hash from the Horovod build probe,
# then ``yarn.packaging``'s packing into the cache); a failure here only means the first job packs.
PREPACK = """
import tempfile
from hvdtrain.hadoop import envcheck
from yarn import packaging
digest = packaging.env_hash(packaging.current_identity(envcheck.probe_horovod_build()))
with tempfile.TemporaryDirectory(prefix="hvdtrain-prepack-") as tmp:
    packaging._packed(digest, None, packaging.venv_pack, print, tmp)
"""


def _start_prepack(pack_cache: str) -> tuple[subprocess.Popen, IO[str]]:
    """The packing process and its output (a file, not a pipe: nobody reads it until a YARN job waits)."""
    env = {**os.environ, PACK_CACHE_ENV: pack_cache, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen([sys.executable, "-c", PREPACK], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                            stdout=log, stderr=subprocess.STDOUT, text=True)
    return proc, log


def packed_env(details: dict) -> None:
    """Wait for the session's background packing (every YARN job of the tier calls this before submitting: two
    packings of one environment must not write the cache at once)."""
    proc, log = details["prepack"]
    if proc.wait(timeout=900) != 0:
        log.seek(0)
        print(f"background packing failed (exit {proc.returncode}); the first YARN job packs:\n{log.read()[-2000:]}")


def _delete_in_background(folder: str) -> None:
    """Delete a stopped cluster's home without waiting: two NodeManagers' unpacked env archives are over 100,000
    files (8 s of the suite); nothing reads the folder again. Moved aside first, so the name is free at once."""
    doomed = f"{folder}.deleting"
    try:
        os.rename(folder, doomed)
        subprocess.Popen(["rm", "-rf", doomed], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def cluster_env(details: dict) -> Iterator[None]:
    """This process's environment pointed at the cluster, restored on the way out."""
    saved = {k: os.environ.get(k) for k in details["env"]}
    os.environ.update(details["env"])
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(autouse=True)
def _cluster_env_per_test(request: pytest.FixtureRequest) -> Iterator[None]:
    if not {"hadoop_cluster", "hdfs_root"} & set(request.fixturenames):
        yield
        return
    with cluster_env(request.getfixturevalue("hadoop_cluster")):
        yield


@pytest.fixture(scope="package")
def hdfs_root(hadoop_cluster: dict) -> str:
    """A folder on the cluster's HDFS for this session's data."""
    return f"{hadoop_cluster['fs_default']}/user/hvdtrain-test"
