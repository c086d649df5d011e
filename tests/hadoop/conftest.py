"""The ``hadoop`` tier's cluster: one real one-machine Hadoop per test session, always stopped at the end.

``hvdtrain cluster`` (hvdtrain/minicluster) starts Apache Hadoop's MiniDFSCluster and MiniYARNCluster in one
JVM (Maven fetches the jars on first use). While the session runs, this process has HADOOP_CONF_DIR set to the
cluster's configs and its ``bin/`` (Hadoop's own ``yarn`` and ``hdfs`` CLIs) on PATH, as a user would after
``hvdtrain cluster up``.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Iterator

import pytest

from hvdtrain.minicluster import cluster
from yarn.packaging import PACK_CACHE_ENV


@pytest.fixture(scope="session")
def hadoop_cluster() -> Iterator[dict]:
    home = tempfile.mkdtemp(prefix="hvdtrain-hadoop-")
    spec = cluster.ClusterSpec(home=home, start_timeout=600)
    saved = {k: os.environ.get(k) for k in ("HADOOP_CONF_DIR", "PATH", "HVDTRAIN_CLUSTER_HOME", "SPARK_LOCAL_IP",
                                       PACK_CACHE_ENV)}
    try:
        details = cluster.up(spec)
        # SPARK_LOCAL_IP: the drivers spark-submit starts here bind to loopback, as the cluster does.
        os.environ.update(HADOOP_CONF_DIR=spec.conf_dir, PATH=f"{spec.bin_dir}{os.pathsep}{os.environ['PATH']}",
                          HVDTRAIN_CLUSTER_HOME=home, SPARK_LOCAL_IP="127.0.0.1")
        # Pack the venv once per environment, not once per session (each session's HDFS starts empty).
        os.environ.setdefault(PACK_CACHE_ENV, os.path.join(cluster.cache_root(), "env-archives"))
        yield details
    finally:
        cluster.down(spec, quiet=True)
        shutil.rmtree(home, ignore_errors=True)  # the cluster's HDFS blocks and container folders
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="session")
def hdfs_root(hadoop_cluster: dict) -> str:
    """A folder on the cluster's HDFS for this session's data."""
    return f"{hadoop_cluster['fs_default']}/user/hvdtrain-test"
