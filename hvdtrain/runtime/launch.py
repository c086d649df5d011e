"""The launcher's child commands (pure): the ETL, training or a user's script (under ``horovodrun`` for
N > 1) and scoring.

Used by :mod:`hvdtrain.cli` and by :mod:`hvdtrain.tune`, whose trials are ordinary training runs.
"""
from __future__ import annotations

import os
import re
import socket
import sys
from typing import Mapping, Optional, Sequence

import hvdtrain
from hvdtrain.core import secrets

# Where a Spark/YARN launch writes every rank's record: train.output/<this> (it is hvdtrain's own: a later run may
# replace a folder holding only it, e.g. after a failed try)
LAUNCHER_RECORD = "yarn_result.json"


def _bin(name: str) -> str:
    """A console script installed beside this interpreter (the project venv)."""
    candidate = os.path.join(os.path.dirname(sys.executable), name)
    return candidate if os.path.exists(candidate) else name


def horovodrun() -> str:
    """The horovodrun of this environment."""
    return _bin("horovodrun")


# glibc's malloc gives the free memory at the top of an arena back to the kernel as soon as it passes a small
# threshold. A training step frees its activations and allocates them again in the next step, so every step faults
# the same pages back in: on the benchmark host that was 7.6 million page faults and about half of a step's time.
# Keeping 64 MB of free memory per arena stops it (benchmarks/README.md, "Malloc and the step"). Only glibc reads it.
MALLOC_TOP_PAD = str(64 << 20)


def malloc_env(env: Mapping[str, str]) -> dict[str, str]:
    """``MALLOC_TOP_PAD_`` for the processes that train or score, unless ``env`` already sets glibc's top pad
    (``MALLOC_TOP_PAD_`` or ``glibc.malloc.top_pad`` in ``GLIBC_TUNABLES``): the user's choice wins (pure)."""
    if "MALLOC_TOP_PAD_" in env or "glibc.malloc.top_pad" in env.get("GLIBC_TUNABLES", ""):
        return {}
    return {"MALLOC_TOP_PAD_": MALLOC_TOP_PAD}


def spark_malloc_env(env: Mapping[str, str], spark_conf: Mapping[str, str]) -> dict[str, str]:
    """``env`` (yarn.env) plus :func:`malloc_env` for a Spark job's executors and ranks: a top pad in ``env`` or among
    the ``spark.executorEnv.*`` entries of ``spark_conf`` is the user's and wins (pure)."""
    executor_env = {key[len("spark.executorEnv."):]: value for key, value in spark_conf.items()
                    if key.startswith("spark.executorEnv.")}
    return {**malloc_env({**executor_env, **env}), **env}


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(malloc_env(env))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    # The repo root on the path, so `-m etl.job` works from a source checkout too (the root, never a package's
    # own folder: with hvdtrain/ itself there, `import data` or `import model` would be hvdtrain's modules).
    env["PYTHONPATH"] = os.pathsep.join(p for p in (hvdtrain.code_root(), env.get("PYTHONPATH")) if p)
    return env


def etl_command(config_path: str, overrides: Sequence[str], master: Optional[str], overwrite: bool,
                create_sample_table: bool = False, verbose: bool = False) -> list[str]:
    cmd = [sys.executable, "-m", "etl.job", "--config", config_path]
    if master:
        cmd += ["--master", master]
    if overwrite:
        cmd.append("--overwrite")
    if create_sample_table:
        cmd.append("--create-sample-table")
    if verbose:
        cmd.append("--verbose")
    return cmd + list(overrides)


def train_command(config_path: str, overrides: Sequence[str], np: int, start_timeout: int = 120,
                  hosts: Optional[str] = None) -> list[str]:
    """``horovodrun -np N -H localhost:N --gloo --start-timeout S python -m hvdtrain.training.train ...``
    (or plain python for N=1 on this host); ``hosts`` (``h1:2,h2:2``) runs the ranks there."""
    return horovod_command([sys.executable, "-m", "hvdtrain.training.train", config_path, *overrides], np, start_timeout,
                           hosts)


def horovod_command(program: Sequence[str], np: int, start_timeout: int = 120,
                    hosts: Optional[str] = None) -> list[str]:
    """``program`` on ``np`` Gloo ranks under horovodrun, or as is for one rank on this host (pure):
    hvdtrain's training, or a user's own script (``hvdtrain run``)."""
    if np == 1 and hosts is None:
        return list(program)
    return [_bin("horovodrun"), "-np", str(np), "-H", hosts or f"localhost:{np}", "--gloo",
            "--start-timeout", str(start_timeout), *RANK_ENV, *program]


# Every rank starts through hvdtrain.runtime.rank_env, which puts back the secrets sealed_env() kept off its command line.
RANK_ENV = (sys.executable, "-m", "hvdtrain.runtime.rank_env")
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


def discovery_script(hosts: str) -> str:
    """A host discovery script that prints ``hosts`` (``h1:2,h2:2``), one ``host:slots`` a line."""
    return "#!/bin/sh\n" + "".join(f"echo {h}\n" for h in hosts.split(","))


def static_hosts(script: str) -> Optional[list[str]]:
    """The hosts a script made by :func:`discovery_script` always prints; None for any other script (a user's
    discovery may print any host at any time)."""
    lines = script.splitlines()
    if not lines or lines[0] != "#!/bin/sh":
        return None
    hosts = [re.fullmatch(r"echo ([\w.:-]+):\d+", line) for line in lines[1:]]
    return [m.group(1) for m in hosts if m] if hosts and all(hosts) else None


def sealed_env(cmd: Sequence[str], env: Mapping[str, str]) -> dict[str, str]:
    """The environment to start ``cmd`` with: for horovodrun on this host only, its secret variables sealed in a
    0600 file (:func:`hvdtrain.core.secrets.seal_env`; horovodrun writes a rank's environment into its command line).
    An elastic launch counts as on this host when its discovery script is one :func:`discovery_script` wrote for
    this host only (a user's script may print any host at any time). Ranks on other hosts
    could not read that file, so there the environment goes as it is (docs/safety.md)."""
    if len(cmd) < 2 or os.path.basename(cmd[0]) != "horovodrun":
        return dict(env)
    if "-H" in cmd:
        hosts: Optional[list[str]] = [h.rsplit(":", 1)[0] for h in cmd[cmd.index("-H") + 1].split(",")]
    elif "--host-discovery-script" in cmd:
        try:
            with open(cmd[cmd.index("--host-discovery-script") + 1], encoding="utf-8") as fh:
                hosts = static_hosts(fh.read())
        except (OSError, UnicodeDecodeError, IndexError):
            hosts = None
    else:
        return dict(env)
    if hosts is None or not set(hosts) <= {*LOCAL_HOSTS, socket.gethostname()}:
        return dict(env)
    return secrets.seal_env(env)


def score_flags(model: Optional[str], output_table: Optional[str], partition: Optional[str] = None,
                master: Optional[str] = None, overwrite: bool = False, split: Optional[str] = None,
                evaluate: bool = False) -> list[str]:
    """The scoring job's flags (pure)."""
    out: list[str] = []
    for flag, value in (("--model", model), ("--output-table", output_table), ("--partition", partition),
                        ("--master", master), ("--split", split)):
        if value:
            out += [flag, value]
    return out + (["--overwrite"] if overwrite else []) + (["--evaluate"] if evaluate else [])


def score_command(config_path: str, overrides: Sequence[str], flags: Sequence[str]) -> list[str]:
    """``python -m etl.score_job ...``: the scoring job, the same entry point spark-submit runs (pure)."""
    return [sys.executable, "-m", "etl.score_job", "--config", config_path, *flags, *overrides]
