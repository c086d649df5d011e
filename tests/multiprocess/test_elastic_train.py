"""hvdtrain's own loop under Horovod elastic mode (``train.elastic``): a rank or a host is lost mid-training.

Two local "hosts" (``localhost`` and ``127.0.0.1``, one slot each; Horovod treats them as two
hosts) come from a discovery script that prints the lines of a file the test edits. The rank
on 127.0.0.1 is SIGKILLed once its trace passes a step; the survivor must roll back to the last
commit and go on at size 1 in the same process, then grow back when the host returns. Every
virtual rank's batch trace must cover every step (no record lost within an epoch), and the steps
trained twice must be at most one commit interval.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import pytest

from benchmarks import kill_drill
from hvdtrain import config
from hvdtrain.synthetic import Layout, TextSpec, make_text_dataset
from tests.support import mp

pytestmark = pytest.mark.multiprocess

REPO = Path(__file__).resolve().parents[2]
TINY_MODEL = {"embed_dim": 16, "num_heads": 2, "ff_dim": 32, "num_layers": 1, "dropout": 0.1}
BATCH, EPOCHS, EVERY, VIRTUAL = 8, 2, 3, 2
GROW_EPOCHS = 30  # 600 steps: the grow-back test's job
KILL_AFTER = 7  # the lost rank dies once its trace has read this many steps


def _job(tmp: Path, epochs: int) -> tuple[Path, int, object]:
    m = make_text_dataset(str(tmp / "data"), TextSpec(layout=Layout(
        n_per_split={"train": 320, "validation": 32, "test": 48}, shards_per_split=4), class_rate=0.35, seed=5))
    hosts = tmp / "hosts"
    hosts.write_text("localhost:1\n127.0.0.1:1\n")
    discover = tmp / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts}\n")
    discover.chmod(0o755)
    cfg = config.from_dict({
        "name": "elastic", "workdir": str(tmp), "source": {"table": "demo.reviews"},
        "etl": {"output": str(tmp / "data")}, "model": TINY_MODEL,
        "train": {"epochs": epochs, "batch_size": BATCH, "learning_rate": 0.003, "shuffle_buffer": 64,
                  "record_trace": str(tmp / "trace"),
                  "elastic": {"min_ranks": 1, "max_ranks": VIRTUAL, "commit_every_steps": EVERY,
                              "discovery": str(discover), "blacklist_cooldown": [1, 2]}},
        "tracking": {"enabled": False},
    }, base_dir=str(tmp))
    path = tmp / "job.yaml"
    path.write_text(cfg.to_yaml())
    return path, m.split("train").records // (BATCH * VIRTUAL), m


def _owner(trace: Path) -> Optional[tuple[int, int]]:
    """(pid, steps read) of the process now running a virtual rank."""
    runs = kill_drill.segments(str(trace))
    if not runs:
        return None
    pid, first, batches = runs[-1]
    return pid, (max(batches) + 1 if batches else first)


def _host_of(pid: int) -> str:
    """HOROVOD_HOSTNAME of a rank process: which "host" it runs on."""
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return next(v.split(b"=", 1)[1].decode() for v in env if v.startswith(b"HOROVOD_HOSTNAME="))


def _lose(tmp: Path, proc: subprocess.Popen, drop_host: bool) -> int:
    """SIGKILL the rank that runs virtual rank 1 after KILL_AFTER steps; with ``drop_host`` its host also leaves
    discovery first (a preempted host) and returns after the survivor went on alone. Which host that rank is on
    varies from run to run: Horovod orders the first hosts it discovers by iterating a set (hash randomization)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        now = _owner(tmp / "trace" / "rank1.keys")
        if now is not None and now[1] >= KILL_AFTER:
            if drop_host:
                lost = _host_of(now[0])
                (tmp / "hosts").write_text("".join(f"{h}\n" for h in ("localhost:1", "127.0.0.1:1")
                                                   if h.split(":")[0] != lost))
            os.kill(now[0], signal.SIGKILL)
            return now[1]
        time.sleep(0.02)
    pytest.fail(f"the job did not reach step {KILL_AFTER} (exit {proc.poll()})")


def _return_host_when_alone(tmp: Path) -> None:
    """Give the host back once virtual rank 1 runs in the survivor (a new segment from the survivor's pid)."""
    for _ in range(6000):
        runs = kill_drill.segments(str(tmp / "trace" / "rank1.keys"))
        survivor = kill_drill.segments(str(tmp / "trace" / "rank0.keys"))
        if len(runs) >= 2 and survivor and runs[-1][0] == survivor[-1][0]:
            (tmp / "hosts").write_text("localhost:1\n127.0.0.1:1\n")
            return
        time.sleep(0.05)


def run_with_a_loss(tmp: Path, drop_host: bool, epochs: int = EPOCHS) -> tuple[dict, int, int, object]:
    config_path, steps, manifest = _job(tmp, epochs)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "OMPI_", "PMI_"))}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO), MLFLOW_DISABLE_TELEMETRY="true")
    mp.horovodrun()
    cmd = [sys.executable, "-m", "hvdtrain.cli", "train", str(config_path), "--np", str(VIRTUAL)]
    log = tmp / "job.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
        try:
            killed_at = _lose(tmp, proc, drop_host)
            if drop_host:
                threading.Thread(target=_return_host_when_alone, args=(tmp,), daemon=True).start()
            code = proc.wait(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert code == 0, log.read_text()[-8000:]
    result = json.loads((tmp / "runs" / "elastic" / "result.json").read_text())
    return result, steps, killed_at, manifest


def assert_accounted(tmp: Path, steps: int, killed_at: int, epochs: int = EPOCHS) -> None:
    """No step of any virtual rank missing, every record once per epoch, at most one commit interval redone."""
    for v in range(VIRTUAL):
        path = str(tmp / "trace" / f"rank{v}.keys")
        batches = kill_drill.stitched(path)  # raises when a run resumed past a batch nobody read
        assert sorted(batches) == list(range(epochs * steps)), v
        for epoch in range(epochs):
            keys = [k for b in range(epoch * steps, (epoch + 1) * steps) for k in batches[b]]
            assert len(keys) == len(set(keys)) == steps * BATCH, (v, epoch)
        runs = kill_drill.segments(path)
        for before, after in zip(runs, runs[1:]):
            read = max(before[2]) + 1 if before[2] else before[1]
            assert 0 <= read - after[1] <= EVERY, (v, [(r[0], r[1], len(r[2])) for r in runs])  # redone <= interval
    assert killed_at >= KILL_AFTER


def test_a_lost_rank_rolls_back_to_the_commit_and_the_job_grows_back(tmp_path: Path) -> None:
    """Long enough (GROW_EPOCHS) for Horovod to start a new worker on the host once its cooldown ends: that
    worker imports TensorFlow (seconds, more under load) while the survivor trains alone."""
    result, steps, killed_at, manifest = run_with_a_loss(tmp_path, drop_host=False, epochs=GROW_EPOCHS)
    assert result["steps"] == GROW_EPOCHS * steps and result["ranks_agree"], result
    sizes = result["sizes"]
    assert sizes[0] == 2 and 1 in sizes, result  # shrank without a restart of rank 0
    assert 2 in sizes[sizes.index(1):] and sizes[-1] == 2, result  # and grew back to two ranks
    assert result["global_batch"] == VIRTUAL * BATCH and result["test_records"] == manifest.split("test").records
    assert_accounted(tmp_path, steps, killed_at, GROW_EPOCHS)


def test_a_lost_host_leaves_the_survivor_alone_until_it_returns(tmp_path: Path) -> None:
    result, steps, killed_at, manifest = run_with_a_loss(tmp_path, drop_host=True)
    assert result["steps"] == EPOCHS * steps and result["ranks_agree"], result
    assert result["sizes"][:2] == [2, 1], result
    assert_accounted(tmp_path, steps, killed_at)
