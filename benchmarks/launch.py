"""Launch a benchmark worker under horovodrun and read its JSON result."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from typing import Optional

from hvdtrain.runtime.launch import malloc_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def horovodrun(np: int, module: str, args: list[str], env: Optional[dict[str, str]] = None,
               timeout: int = 900) -> dict:
    """Run ``python -m module args`` on np local Gloo ranks, with the malloc setting hvdtrain's launcher gives its
    ranks (:func:`hvdtrain.runtime.launch.malloc_env`); the line 'BENCH {json}' is the result."""
    hr = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    cmd = [hr, "-np", str(np), "-H", f"localhost:{np}", "--gloo", sys.executable, "-m", module, *args]
    full_env = {**os.environ, **malloc_env(os.environ), "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": ROOT,
                **(env or {})}
    out = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    return result(f"{module} {args}", out.stdout, out.stderr, out.returncode)


def plain(module: str, args: list[str], timeout: int = 900) -> dict:
    """Run ``python -m module args`` as one plain process (no launcher, so no Horovod); its 'BENCH {json}'."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-m", module, *args], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=timeout)
    return result(f"{module} {args}", out.stdout, out.stderr, out.returncode)


def result(what: str, stdout: str, stderr: str, code: object) -> dict:
    """The JSON of a worker's 'BENCH {json}' line (horovodrun prefixes lines with the rank), else an error
    carrying the ends of its output."""
    for line in stdout.splitlines():
        if "BENCH " in line:
            return json.loads(line.split("BENCH ", 1)[1])
    raise RuntimeError(f"{what} printed no result (exit {code}):\n{stdout[-2000:]}\n{stderr[-3000:]}")


def tf_workers(n: int, module: str, args: list[str], timeout: int = 900,
               env: Optional[dict[str, str]] = None) -> dict:
    """Run ``python -m module args`` as n local TensorFlow workers (TF_CONFIG), each with ``env`` added to this
    process's environment; worker 0's 'BENCH {json}'."""
    ports = free_ports(n)
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    envs = [{**(env or {}), "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})}
            for index in range(n)]
    outs, codes = concurrent(envs, module, args, timeout)
    return result(f"{module} {args}", outs[0][0], outs[0][1], codes)


def plain_many(n: int, module: str, args: list[str], timeout: int = 900,
               env: Optional[dict[str, str]] = None) -> list[dict]:
    """n plain processes of ``python -m module args`` at once (no launcher, no Horovod), each with ``env`` added to
    this process's environment; each one's result."""
    outs, codes = concurrent([dict(env or {}) for _ in range(n)], module, args, timeout)
    return [result(f"{module} {args}", out, err, code) for (out, err), code in zip(outs, codes)]


def concurrent(envs: list[dict[str, str]], module: str, args: list[str],
               timeout: int = 900) -> tuple[list[tuple[str, str]], list[object]]:
    """One process of ``python -m module args`` per extra environment in ``envs``, all at once; each one's
    (stdout, stderr), and the exit codes."""
    procs = []
    for extra in envs:
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": ROOT, **extra}
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
    return outs, [p.returncode for p in procs]


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
