"""The standalone tier's cluster: one Spark standalone cluster (scripts/standalone_cluster.sh) for the tier.

It lives as long as this package's tests (``scope="package"``) and is owned by the pytest process: the script's
watcher stops its daemons if pytest is killed, so no JVM outlives the run."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "standalone_cluster.sh"
HOSTS = ("host-a", "host-b")  # worker hostnames, on 127.0.0.2 and 127.0.0.3


@dataclass(frozen=True)
class StandaloneCluster:
    """A running master and two workers, each worker in its own UTS namespace with its own hostname."""

    folder: Path
    url: str  # spark://127.0.0.1:PORT

    def host_tmp(self, host: str) -> Path:
        """The worker's local disk (its executors' TMPDIR and Spark local dirs)."""
        return self.folder / host / "tmp"

    def executor_pids(self, host: str) -> list[int]:
        """The executor JVMs the worker on ``host`` runs now."""
        import psutil

        worker = psutil.Process(int((self.folder / f"{host}.pid").read_text()))
        out = []
        for child in worker.children(recursive=True):
            try:
                cmdline = child.cmdline()
            except psutil.Error:  # gone, or a zombie not yet reaped (e.g. a finished task's process)
                continue
            if "CoarseGrainedExecutorBackend" in " ".join(cmdline):
                out.append(child.pid)
        return out


def cannot_create_namespaces() -> str:
    """Why this machine cannot run the standalone tier ('' when it can)."""
    if shutil.which("unshare") is None:
        return "standalone tier: unshare (util-linux) not found, so the workers cannot get their own hostnames"
    proc = subprocess.run(["unshare", "--uts", "--mount", "true"], capture_output=True, text=True)
    if proc.returncode != 0:
        return (f"standalone tier: cannot create UTS and mount namespaces here ({proc.stderr.strip()}); it needs "
                "root or user namespaces")
    return ""


@pytest.fixture(scope="package")
def standalone_cluster() -> Iterator[StandaloneCluster]:
    reason = cannot_create_namespaces()
    if reason:
        pytest.skip(reason)
    folder = Path(tempfile.mkdtemp(prefix="hvdtrain-standalone-"))
    try:
        proc = subprocess.run(["bash", str(SCRIPT), "start", str(folder), sys.executable, str(os.getpid())], capture_output=True,
                              text=True, timeout=300)
        if proc.returncode != 0:
            pytest.fail(f"{SCRIPT} start failed (exit {proc.returncode}): {proc.stderr.strip()[-3000:]}")
        yield StandaloneCluster(folder, proc.stdout.strip().splitlines()[-1])
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop", str(folder)], capture_output=True, timeout=60)
        shutil.rmtree(folder, ignore_errors=True)
