"""hvdtrain's own loop under Horovod elastic mode (``train.elastic``): a rank or a host is lost mid-training.

One loss of each kind from the elastic chaos drill (benchmarks/elastic_drill.py, which runs 20 of them in the
bench): two local "hosts" (``localhost`` and ``127.0.0.1``, one slot each; Horovod treats them as two hosts)
come from a discovery script that prints the lines of a file the drill edits. The rank running virtual rank 1
is SIGKILLed once its trace passes a step; the survivor must roll back to the last commit and go on at size 1
in the same process, then grow back when the host returns. Every virtual rank's batch trace must cover every
step (no record lost within an epoch), and the steps trained twice must be at most one commit interval.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from benchmarks import elastic_drill, kill_drill
from benchmarks.elastic_drill import BATCH, EVERY, VIRTUAL
from hvdtrain import manifest as manifest_lib
from tests.support import mp

pytestmark = pytest.mark.multiprocess

EPOCHS = 2  # 40 steps
# The grow-back test's job: 1,200 steps. A new worker joined 7-10 s after a loss on the idle machine, while the
# survivor ran about 70 steps/s: the job lasts several times that, under load too.
GROW_EPOCHS = 60
KILL_AFTER = 7  # the lost rank dies once its trace has read this many steps


def run_with_a_loss(tmp: Path, kind: str, epochs: int) -> tuple[dict, elastic_drill.ElasticJob, elastic_drill.Loss]:
    mp.horovodrun()
    job = elastic_drill.make_job(str(tmp), epochs)
    proc = elastic_drill.start(job, str(tmp / "job.log"))
    try:
        loss = elastic_drill.lose(job, proc, kind, KILL_AFTER, time.monotonic() + 600)
        code = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, (tmp / "job.log").read_text()[-8000:]
    # The process that ran virtual rank 0 at the kill, in the same process, went on with virtual rank 1.
    assert loss.recovery_s is not None, ("the survivor never read the lost virtual rank's next batch", loss)
    loss.repeated_steps = elastic_drill.repeated_steps(job, loss)
    return job.result(), job, loss


def assert_accounted(job: elastic_drill.ElasticJob, loss: elastic_drill.Loss) -> None:
    """No step of any virtual rank missing, every record once per epoch, at most one commit interval redone."""
    assert elastic_drill.records_lost(job) == 0
    for v in range(VIRTUAL):
        runs = kill_drill.segments(job.trace(v))
        for before, after in zip(runs, runs[1:]):
            assert 0 <= kill_drill.read_to(before) - after[1] <= EVERY, (v, [(r[0], r[1], len(r[2])) for r in runs])  # redone <= interval
    assert loss.step >= KILL_AFTER and 0 <= loss.repeated_steps <= EVERY, loss


def test_a_lost_rank_rolls_back_to_the_commit_and_the_job_grows_back(tmp_path: Path) -> None:
    result, job, loss = run_with_a_loss(tmp_path, "rank", GROW_EPOCHS)
    assert result["steps"] == job.total_steps and result["ranks_agree"], result
    sizes = result["sizes"]
    assert sizes[0] == 2 and 1 in sizes, result  # shrank without a restart of rank 0
    assert 2 in sizes[sizes.index(1):] and sizes[-1] == 2 and loss.regrown_s is not None, (result, loss)
    runs = kill_drill.segments(job.trace(1))
    assert runs[-1][0] not in (loss.killed_pid, loss.survivor_pid), runs[-1][:2]  # a new worker took it back
    test_records = manifest_lib.read(os.path.join(str(tmp_path), "data")).split("test").records
    assert result["global_batch"] == VIRTUAL * BATCH and result["test_records"] == test_records
    assert_accounted(job, loss)


def test_a_lost_host_leaves_the_survivor_alone_until_it_returns(tmp_path: Path) -> None:
    result, job, loss = run_with_a_loss(tmp_path, "host", EPOCHS)
    assert result["steps"] == job.total_steps and result["ranks_agree"], result
    assert result["sizes"][:2] == [2, 1], result
    # Alone until the host returned: right after the killed process, virtual rank 1 went to the survivor.
    runs = kill_drill.segments(job.trace(1))
    assert [r[0] for r in runs[loss.segment - 1:loss.segment + 1]] == [loss.killed_pid, loss.survivor_pid], runs
    assert_accounted(job, loss)
