"""A real ``mlflow server`` for tests: SQLite backend and local artifacts under a folder, on a free 127.0.0.1 port,
awaited on ``/health``, stopped with its whole process group."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

MLFLOW = Path(sys.executable).parent / "mlflow"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"mlflow server exited with {proc.returncode} before answering {url}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"mlflow server did not answer {url} within {timeout}s")


def start_server(root: Path, port: int) -> subprocess.Popen:
    """``mlflow server`` on 127.0.0.1:port over a SQLite store in ``root``; returns once it answers /health."""
    if not MLFLOW.exists():
        pytest.fail(f"mlflow is not installed next to {sys.executable}: run `make env`")
    cmd = [str(MLFLOW), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
           "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
           "--artifacts-destination", str(root / "artifacts"), "--default-artifact-root", "mlflow-artifacts:/"]
    env = {**server_env(), "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no background job workers
    with open(root / "server.log", "a") as log:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", proc, timeout=120)
    except BaseException:
        stop_server(proc)
        raise
    return proc


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # the server's own group: uvicorn and its workers
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)


def server_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "OMPI_", "PMI_", "MLFLOW_"))}
    env.update(MLFLOW_DISABLE_TELEMETRY="true")
    return env
