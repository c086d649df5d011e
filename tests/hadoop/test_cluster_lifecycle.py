"""A throwaway cluster never outlives its owner: the test tier's cluster JVM exits once pytest is gone, killed or not."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hvdtrain.hadoop.minicluster import cluster

pytestmark = pytest.mark.hadoop


def test_a_cluster_whose_owner_is_gone_stops_by_itself(tmp_path: Path) -> None:
    """The launcher JVM given a finished process as its owner exits on its own, with the line saying why.

    Without the owner watch it would start HDFS and YARN and run until killed: the wait below would time out."""
    java, javac, mvn = cluster.require_tools()
    _, classpath = cluster.prepare(mvn, javac)
    owner = subprocess.Popen([sys.executable, "-c", "pass"])
    owner.wait()  # gone: as a pytest killed with SIGKILL would be
    spec = cluster.ClusterSpec(home=str(tmp_path), owner_pid=owner.pid)
    cmd = cluster.java_command(java, classpath, spec, cluster.choose_ports(spec.ports))
    assert f"{cluster.OWNER_PID}={owner.pid}" in cmd
    log_path = tmp_path / "cluster.log"
    with open(log_path, "w") as log:
        jvm = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp_path)
    try:
        code = jvm.wait(timeout=240)
    finally:
        if jvm.poll() is None:
            jvm.kill()
            jvm.wait()
    log_text = log_path.read_text()
    assert code == 0, log_text[-2000:]
    assert f"owner process {owner.pid} is gone; stopping" in log_text
    assert not (tmp_path / "conf" / "core-site.xml").exists()  # it stopped before serving anything
