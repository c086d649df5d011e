"""#56 item 1: HDFS whose web servers speak TLS only (``dfs.http.policy=HTTPS_ONLY``), on an HA nameservice.

A second throwaway cluster (``hvdtrain cluster up --ha --https``, one NodeManager, no YARN job): the NameNodes'
WebHDFS answers on their https-addresses only, with a key made for the cluster. hvdtrain's Python client reaches
``hdfs://hvdtrain`` through the ``https-address`` of each NameNode, verifies the certificate against the CA bundle
the cluster prints (REQUESTS_CA_BUNDLE), writes and restores checkpoints across a NameNode failover, and, on a host
that does not trust the certificate, stops with one line naming the fix.
"""
from __future__ import annotations

import http.client
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from typing import Iterator

import numpy as np
import pytest

from hvdtrain.hadoop import hadoop_conf
from hvdtrain.hadoop.minicluster import cluster
from hvdtrain.training import checkpoint
from tests.hadoop.conftest import cluster_env

pytestmark = pytest.mark.hadoop

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def tls_cluster() -> Iterator[dict]:
    home = tempfile.mkdtemp(prefix="hvdtrain-https-")
    spec = cluster.ClusterSpec(home=home, start_timeout=600, owner_pid=os.getpid(), ha=True, https=True,
                               nodemanagers=1)
    try:
        details = cluster.up(spec)
        details["env"] = {**cluster.client_env(details), "PATH": f"{spec.bin_dir}{os.pathsep}{os.environ['PATH']}"}
        yield details
    finally:
        cluster.down(spec, quiet=True)
        shutil.rmtree(home, ignore_errors=True)


def _cli(*argv: str) -> str:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{argv}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    return proc.stdout


def test_webhdfs_answers_over_tls_only_and_the_export_line_names_the_ca_bundle(tls_cluster: dict) -> None:
    props = hadoop_conf.load(tls_cluster["hadoop_conf_dir"])
    assert props["dfs.http.policy"] == "HTTPS_ONLY"
    urls = hadoop_conf.webhdfs_urls("hvdtrain", props)
    assert urls == list(tls_cluster["namenodes"].values()) and all(u.startswith("https://") for u in urls), urls
    assert tls_cluster["env"]["REQUESTS_CA_BUNDLE"] == tls_cluster["ca_bundle"]
    assert f"REQUESTS_CA_BUNDLE={tls_cluster['ca_bundle']}" in cluster.describe(tls_cluster)
    # The ssl-server.xml beside the clients' configs holds the keystore's password: the owner's only.
    assert os.stat(os.path.join(tls_cluster["hadoop_conf_dir"], "ssl-server.xml")).st_mode & 0o077 == 0
    # Plain HTTP gets no WebHDFS answer there: the port speaks TLS (its answer is a TLS alert, no HTTP status).
    plain = urls[0].replace("https://", "http://") + "/webhdfs/v1/?op=GETFILESTATUS"
    with pytest.raises((http.client.HTTPException, urllib.error.URLError, OSError)):
        urllib.request.urlopen(plain, timeout=10).read()


def test_checkpoints_go_through_a_failover_over_verified_tls(tls_cluster: dict) -> None:
    root = "hdfs://hvdtrain/tmp/tls-ckpt"
    arrays = {"w": np.arange(64, dtype=np.float32)}
    with cluster_env(tls_cluster):
        writer = checkpoint.CheckpointWriter(root, background=False)
        writer.save(3, arrays, {"epoch": 1})
        said = _cli("hdfs", "haadmin", "-failover", "nn1", "nn2")
        assert "Failover from nn1 to nn2 successful" in said
        try:
            writer.save(6, {"w": arrays["w"] * 2}, {"epoch": 2})  # nn1, the first one asked, is the standby now
            restored = checkpoint.restore_latest(root)
        finally:
            _cli("hdfs", "haadmin", "-failover", "nn2", "nn1")
    assert restored is not None and restored[0].step == 6
    np.testing.assert_array_equal(restored[1]["w"], arrays["w"] * 2)


def test_a_host_that_does_not_trust_the_certificate_gets_one_line(tls_cluster: dict) -> None:
    import certifi

    env = {**os.environ, **tls_cluster["env"], "REQUESTS_CA_BUNDLE": certifi.where(), "PYTHONPATH": REPO}
    proc = subprocess.run([sys.executable, "-m", "hvdtrain.cli", "checkpoints", "list", "hdfs://hvdtrain/tmp"],
                          capture_output=True, text=True, env=env, timeout=300)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and len(err) == 1, proc.stderr
    assert "the server's TLS certificate is not trusted here" in err[0] and "REQUESTS_CA_BUNDLE" in err[0], err
