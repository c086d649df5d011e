"""Launch a benchmark worker under horovodrun and read its JSON result."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def horovodrun(np: int, module: str, args: list[str], env: Optional[dict[str, str]] = None,
               timeout: int = 900) -> dict:
    """Run ``python -m module args`` on np local Gloo ranks; the line 'BENCH {json}' is the result."""
    hr = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    cmd = [hr, "-np", str(np), "-H", f"localhost:{np}", "--gloo", sys.executable, "-m", module, *args]
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": ROOT, **(env or {})}
    out = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    for line in out.stdout.splitlines():
        if "BENCH " in line:
            return json.loads(line.split("BENCH ", 1)[1])
    raise RuntimeError(f"{module} {args} printed no result (exit {out.returncode}):\n{out.stdout[-2000:]}\n"
                       f"{out.stderr[-3000:]}")


def tf_workers(n: int, module: str, args: list[str], timeout: int = 900) -> dict:
    """Run ``python -m module args`` as n local TensorFlow workers (TF_CONFIG); worker 0's 'BENCH {json}'."""
    ports = free_ports(n)
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    procs = []
    for index in range(n):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": ROOT, "TF_CONFIG": tf_config}
        procs.append(subprocess.Popen([sys.executable, "-m", module, *args], env=env, cwd=ROOT, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outs = []
    try:
        for proc in procs:
            outs.append(proc.communicate(timeout=timeout))
    finally:
        for proc in procs:  # a worker left waiting on a dead peer's collective would never exit
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for line in outs[0][0].splitlines():
        if line.startswith("BENCH "):
            return json.loads(line[6:])
    raise RuntimeError(f"{module} {args} printed no result (exits {[p.returncode for p in procs]}):\n"
                       f"{outs[0][0][-2000:]}\n{outs[0][1][-3000:]}")


def free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on localhost (held open together so they differ)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
