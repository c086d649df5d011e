"""The launcher's child commands (pure): the ETL, training (under ``horovodrun`` for N > 1) and scoring.

Used by :mod:`hvdtrain.cli` and by :mod:`hvdtrain.tune`, whose trials are ordinary training runs.
"""
from __future__ import annotations

import os
import sys
from typing import Optional, Sequence


def _bin(name: str) -> str:
    """A console script installed beside this interpreter (the project venv)."""
    candidate = os.path.join(os.path.dirname(sys.executable), name)
    return candidate if os.path.exists(candidate) else name


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    # The repo root on the path, so `-m etl.job` works from a source checkout too.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
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
    """``horovodrun -np N -H localhost:N --gloo --start-timeout S python -m hvdtrain.train ...``
    (or plain python for N=1 on this host); ``hosts`` (``h1:2,h2:2``) runs the ranks there."""
    train = [sys.executable, "-m", "hvdtrain.train", config_path, *overrides]
    if np == 1 and hosts is None:
        return train
    return [_bin("horovodrun"), "-np", str(np), "-H", hosts or f"localhost:{np}", "--gloo",
            "--start-timeout", str(start_timeout), *train]


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
