"""Horovod elastic mode on this project's build: horovodrun with host discovery, real ranks, a lost rank.

Patch 0003 (scripts/patches/) fixes the start: with a discovery script that prints only this
host, elastic horovodrun used to wait for a second host until --elastic-timeout and launch no
worker. The job is tests/multiprocess/elastic_worker.py: hvd.elastic.run over a Keras 3 model in
a TensorFlowKerasState (patch 0002), committing every 2 steps.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from tests.support import mp

pytestmark = pytest.mark.multiprocess

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parent / "elastic_worker.py"


def run_elastic(tmp: Path, hosts: list[str], np_: int, *worker_args: str, timeout: float = 900) -> list[dict]:
    discover = tmp / "discover.sh"
    discover.write_text("#!/bin/sh\n" + "".join(f"echo {h}\n" for h in hosts))
    discover.chmod(0o755)
    out = tmp / "events"
    out.mkdir()
    cmd = [str(mp.horovodrun()), "-np", str(np_), "--min-np", "1", "--max-np", str(np_), "--host-discovery-script",
           str(discover), "--gloo", "--blacklist-cooldown-range", "1", "2", sys.executable, str(WORKER), str(out),
           *worker_args]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "OMPI_", "PMI_"))}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO), HOROVOD_ELASTIC_TIMEOUT="60")
    try:
        proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"elastic horovodrun did not finish in {timeout}s (no worker?)\n{(exc.stderr or b'')[-3000:]!r}")
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return [json.loads(line) for f in sorted(out.glob("*.jsonl")) for line in f.read_text().splitlines()]


def test_discovery_of_this_host_only_starts_the_workers(tmp_path: Path) -> None:
    """The reported hang: a discovery script printing `localhost:2`."""
    events = run_elastic(tmp_path, ["localhost:2"], 2, "4")
    ends = [e for e in events if e["event"] == "end"]
    assert sorted(e["rank"] for e in ends) == [0, 1] and {e["size"] for e in ends} == {2}, events
    assert len({e["weights"] for e in ends}) == 1  # the ranks agree


def test_a_lost_rank_leaves_the_survivor_training_at_the_smaller_size(tmp_path: Path) -> None:
    """Two local "hosts" (localhost and 127.0.0.1), one slot each; the rank on 127.0.0.1 dies at step 5.

    The survivor rolls back to the last commit (step 4), goes on alone in the same process, and every step
    after the commit is trained once at size 1; the lost host returns after its blacklist cooldown.
    """
    events = run_elastic(tmp_path, ["localhost:1", "127.0.0.1:1"], 2, "12", "127.0.0.1", "5")
    by_pid = defaultdict(list)
    for e in events:
        by_pid[e["pid"]].append(e)
    survivor = next(p for p, es in by_pid.items() if es[0]["host"] == "localhost" and es[0]["event"] == "start")
    mine = by_pid[survivor]
    assert any(e["event"] == "exit" for e in events), events  # the other rank did die
    assert any(e["event"] == "reset" for e in mine), mine  # the survivor was reset, not restarted
    steps = [(e["step"], e["size"]) for e in mine if e["event"] == "step"]
    assert steps[:5] == [(s, 2) for s in range(1, 6)] or steps[:4] == [(s, 2) for s in range(1, 5)], steps
    after = steps[steps.index(next(s for s in steps if s[1] == 1)):]
    assert after[0][0] == 5, steps  # rolled back to the commit at step 4: step 5 is redone, no step skipped
    assert [s for s, _ in after] == list(range(5, 5 + len(after))), steps
    assert mine[-1]["event"] == "end" and mine[-1]["step"] == 12, mine
