"""hvdtrain's own loop under Horovod elastic mode (``train.elastic``): a rank or a host is lost mid-training.

One loss of each kind from the elastic chaos drill (benchmarks/elastic_drill.py, which runs 20 of them in the
bench): two local "hosts" (``localhost`` and ``127.0.0.1``, one slot each; Horovod treats them as two hosts)
come from a discovery script that prints the lines of a file the drill edits. The rank running virtual rank 1
is SIGKILLed once its trace passes a step; the survivor must roll back to the last commit and go on at size 1
in the same process, then grow back when the host returns. Every virtual rank's batch trace must cover every
step (no record lost within an epoch), and the steps trained twice must be at most one commit interval.

The elastic job is a job like any other: it ends with the outputs and the MLflow run of ``hvdtrain train``,
and a relaunch continues from its newest checkpoint.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import mlflow
import pytest

from benchmarks import elastic_drill, kill_drill
from benchmarks.elastic_drill import BATCH, EVERY, VIRTUAL
from tests.support import mp

pytestmark = pytest.mark.multiprocess

EPOCHS = 2  # 40 steps
# The grow-back test's job: 1,200 steps. A new worker joined 7-10 s after a loss on the idle machine, while the
# survivor ran about 70 steps/s: the job lasts several times that, under load too.
GROW_EPOCHS = 60
KILL_AFTER = 7  # the lost rank dies once its trace has read this many steps


def run_with_a_loss(tmp: Path, kind: str, epochs: int,
                    tracking: bool = False) -> tuple[dict, elastic_drill.ElasticJob, elastic_drill.Loss]:
    mp.horovodrun()
    job = elastic_drill.make_job(str(tmp), epochs, tracking=tracking)
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
    assert result["global_batch"] == VIRTUAL * BATCH
    assert_accounted(job, loss)


def test_a_lost_host_leaves_the_survivor_alone_until_it_returns(tmp_path: Path) -> None:
    result, job, loss = run_with_a_loss(tmp_path, "host", EPOCHS, tracking=True)
    assert result["steps"] == job.total_steps and result["ranks_agree"], result
    assert result["sizes"][:2] == [2, 1], result
    # Alone until the host returned: right after the killed process, virtual rank 1 went to the survivor.
    runs = kill_drill.segments(job.trace(1))
    assert [r[0] for r in runs[loss.segment - 1:loss.segment + 1]] == [loss.killed_pid, loss.survivor_pid], runs
    assert_accounted(job, loss)
    first = assert_a_whole_job(tmp_path, result, EPOCHS)

    # Relaunched with one more epoch: it continues from the last checkpoint, in the same MLflow run.
    proc = elastic_drill.start(job, str(tmp_path / "job2.log"), [f"train.epochs={EPOCHS + 1}"])
    assert proc.wait(timeout=600) == 0, (tmp_path / "job2.log").read_text()[-8000:]
    again = job.result()
    assert again["resumed_from"].endswith(f"ckpt-{job.total_steps:010d}") and again["run_id"] == result["run_id"]
    assert again["steps"] == job.total_steps + job.steps_per_epoch, again
    for v in range(VIRTUAL):  # the relaunch read each virtual rank's next epoch, from the next batch on
        last = kill_drill.segments(job.trace(v))[-1]
        assert (last[1], sorted(last[2])) == (job.total_steps, list(range(job.total_steps, again["steps"]))), v
    assert assert_a_whole_job(tmp_path, again, EPOCHS + 1)[:EPOCHS] == first  # the finished epochs carried over


def assert_a_whole_job(tmp: Path, result: dict, epochs: int) -> list[dict]:
    """What ``hvdtrain train`` leaves, left by an elastic job: exports, a complete exact evaluation, one epoch
    checkpoint per epoch, every epoch's exact stats in MLflow; returns the report's epoch history."""
    assert {"keras", "saved_model", "labels"} <= set(result["exports"]), result["exports"]
    assert all(os.path.exists(path) for path in result["exports"].values()), result["exports"]
    report = json.loads(Path(result["report"]).read_text())
    assert report["evaluation"]["test"]["complete"] and report["evaluation"]["validation"]["complete"], report
    history = report["training"]["history"]
    steps = result["steps_per_epoch"]
    assert [(h["epoch"], h["steps"], h["examples"]) for h in history] == [
        (e, steps, steps * VIRTUAL * BATCH) for e in range(1, epochs + 1)], history  # no step counted twice
    assert sorted(os.listdir(tmp / "checkpoints" / "elastic")) == [
        f"ckpt-{e * steps:010d}" for e in range(max(1, epochs - 2), epochs + 1)]  # keep_last 3
    client = mlflow.MlflowClient(f"sqlite:///{tmp}/mlflow/mlflow.db")
    run = client.get_run(result["run_id"])
    assert run.info.status == "FINISHED" and run.data.metrics["test_accuracy"] == result["test_accuracy"]
    logged = client.get_metric_history(result["run_id"], "train_loss")
    assert sorted((m.step, m.value) for m in logged) == [(h["epoch"], h["loss"]) for h in history]
    return [{k: h[k] for k in ("epoch", "examples", "loss", "accuracy")} for h in history]
