"""The ``hadoop`` tier's cluster: one real one-machine Hadoop per test session, always stopped at the end.

``hvdtrain cluster`` (hvdtrain/minicluster) starts Apache Hadoop's MiniDFSCluster and MiniYARNCluster in one
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
import tempfile
from typing import Iterator

import pytest

from hvdtrain.minicluster import cluster
from yarn.packaging import PACK_CACHE_ENV


@pytest.fixture(scope="session")
def hadoop_cluster() -> Iterator[dict]:
    home = tempfile.mkdtemp(prefix="hvdtrain-hadoop-")
    # Container logs are not kept past their application: the cluster (home and all) is deleted at the end,
    # and a NodeManager holding finished applications' logs takes 16 s to stop.
    spec = cluster.ClusterSpec(home=home, start_timeout=600, container_log_seconds=0)
    try:
        details = cluster.up(spec)
        # SPARK_LOCAL_IP: the drivers spark-submit starts here bind to loopback, as the cluster does.
        # The pack cache: the venv is packed once per environment, not once per session (HDFS starts empty).
        details["env"] = {"HADOOP_CONF_DIR": spec.conf_dir, "PATH": f"{spec.bin_dir}{os.pathsep}{os.environ['PATH']}",
                          "HVDTRAIN_CLUSTER_HOME": home, "SPARK_LOCAL_IP": "127.0.0.1",
                          PACK_CACHE_ENV: os.environ.get(PACK_CACHE_ENV)
                          or os.path.join(cluster.cache_root(), "env-archives")}
        yield details
    finally:
        cluster.down(spec, quiet=True)
        _delete_in_background(home)  # the cluster's HDFS blocks and container folders


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


@pytest.fixture(scope="session")
def hdfs_root(hadoop_cluster: dict) -> str:
    """A folder on the cluster's HDFS for this session's data."""
    return f"{hadoop_cluster['fs_default']}/user/hvdtrain-test"
