"""Exact resume after a SIGKILL, and no silent hangs: real horovodrun jobs, killed and stalled on purpose.

The kill test is the drill of ``benchmarks/kill_drill.py`` with one kill: a
random rank is SIGKILLed at a random step after a checkpoint, the same command
is started again (``checkpoint.resume: auto``), and the finished run must
equal an uninterrupted run from the same seed: weights, optimizer state, and
every batch each rank trained on. Set HVDTRAIN_DRILL_SEED to replay a draw.
"""
from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from benchmarks import kill_drill
from hvdtrain.core import config
from hvdtrain.data.synthetic import Layout, TextSpec, make_text_dataset
from hvdtrain.runtime import watchdog
from tests.support import mp

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.multiprocess
def test_sigkill_a_rank_under_max_restarts_equals_the_uninterrupted_run(tmp_path: Path) -> None:
    mp.horovodrun()
    seed = int(os.environ.get("HVDTRAIN_DRILL_SEED", random.randrange(10_000)))
    report = kill_drill.drill_run(str(tmp_path), kills=1, seed=seed, log=lambda msg: None)
    kill = report.kills[0]
    where = f"(HVDTRAIN_DRILL_SEED={seed}: {report.to_dict()})"
    assert kill.exit_code not in (0, None), where  # the job failed instead of hanging
    assert kill.seconds_to_exit < 60, where  # the surviving rank was torn down within the bound
    assert kill.lost_rank_named, where  # the supervisor names the dead rank and why it restarted
    assert report.restarts_reported == 1 and 0 < kill.seconds_to_resumed_step, where  # one command, one restart
    assert report.resumes_ok == 1 and 0 < kill.resumed_from_step <= kill.killed_after_batch + 1, where
    assert report.batches_equal and report.records_lost == 0 and report.records_repeated == 0, where
    assert report.final_weight_max_abs_diff <= 1e-6 and report.optimizer_max_abs_diff <= 1e-6, where
    assert report.same_mlflow_run, where  # the resumed job logged to the killed job's MLflow run


STALL_SCRIPT = textwrap.dedent("""
    import sys
    from tests.support import faulty_fs
    from hvdtrain.core import config
    from hvdtrain.training import train
    faulty_fs.install(faulty_fs.FaultyHandler(hang=("part-",)))  # shard reads never return
    train.run(config.load(sys.argv[1]))
""")


def test_a_stalled_input_pipeline_dumps_stacks_and_exits_naming_what_it_waited_for(tmp_path: Path) -> None:
    make_text_dataset(str(tmp_path / "data"), TextSpec(layout=Layout(n_per_split={"train": 64, "validation": 8,
                                                                                  "test": 8}, shards_per_split=2), max_length=8, seed=1))
    cfg = config.from_dict({
        "name": "stall", "workdir": str(tmp_path), "source": {"table": "demo.reviews"},
        "etl": {"output": f"faulty://{tmp_path / 'data'}"}, "model": kill_drill.TINY_MODEL,
        "train": {"epochs": 1, "batch_size": 8, "progress": "off"}, "tracking": {"enabled": False},
        "fault": {"stall_timeout": 4},
    }, base_dir=str(tmp_path))
    path = tmp_path / "stall.yaml"
    path.write_text(cfg.to_yaml())
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", STALL_SCRIPT, str(path)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == watchdog.EXIT_STALLED, proc.stderr[-3000:]
    assert "rank 0: no progress for" in proc.stderr and "waiting for input batches of step 1" in proc.stderr
    assert "in open_input_stream" in proc.stderr  # every thread's stack: the stuck shard read included
    assert time.monotonic() - start < 120
    assert not list((tmp_path / "checkpoints").rglob("COMMIT"))  # nothing half-done was published


@pytest.mark.multiprocess
def test_a_frozen_rank_makes_the_job_fail_within_the_stall_timeout(tmp_path: Path) -> None:
    """SIGSTOP (a hung host, not a dead process: the launcher sees nothing): the surviving rank's watchdog
    ends the job, saying which collective it was waiting in."""
    import signal

    mp.horovodrun()
    drill = kill_drill.Drill(workdir=str(tmp_path), data_dir=str(tmp_path / "data"))
    kill_drill.make_dataset(drill)
    path = kill_drill.write_config(drill, "frozen", tracking=False, stall_timeout=8, stall_check_warning=3)
    kill = kill_drill.Kill(rank=1, target_step=20)
    out = kill_drill.kill_once(drill, "frozen", path, kill, runs_before=0, sig=signal.SIGSTOP)
    assert kill.exit_code not in (0, None), out[-3000:]
    assert kill.seconds_to_exit < 8 + 30, out[-3000:]
    assert re.search(r"rank 0: no progress for \d+s while (computing and all-reducing step|saving the checkpoint "
                     r"of step) \d+", out), out[-3000:]


def test_a_finished_run_continues_with_a_new_batch_size_from_its_epoch_end(tmp_path: Path) -> None:
    """Run 1 epoch at batch 8, then ask for 2 epochs at batch 4: the job resumes at epoch 2 in the new layout,
    step numbers going on from 8, the optimizer's step counter (the schedule) at the new layout's step; a
    mid-epoch switch is refused (unit tests)."""
    from hvdtrain.training import checkpoint

    make_text_dataset(str(tmp_path / "data"), TextSpec(layout=Layout(n_per_split={"train": 64, "validation": 16,
                                                                                  "test": 16}, shards_per_split=2), max_length=8, seed=1))
    cfg = config.from_dict({
        "name": "relayout", "workdir": str(tmp_path), "source": {"table": "demo.reviews"},
        "etl": {"output": str(tmp_path / "data")}, "model": kill_drill.TINY_MODEL,
        "train": {"epochs": 1, "batch_size": 8, "progress": "off"}, "tracking": {"enabled": False},
    }, base_dir=str(tmp_path))
    path = tmp_path / "relayout.yaml"
    path.write_text(cfg.to_yaml())
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}

    def train(*overrides: str) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, "-m", "hvdtrain.training.train", str(path), *overrides], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc

    train()
    assert [i.step for i in checkpoint.scan(cfg.checkpoint.dir)] == [8]  # 64 records / batch 8
    proc = train("train.epochs=2", "train.batch_size=4")
    assert "batch_size 8 -> 4" in proc.stderr and "epoch 2 with 16 steps per epoch, step numbers going on from 8" \
        in proc.stderr, proc.stderr[-3000:]
    assert [i.step for i in checkpoint.scan(cfg.checkpoint.dir)] == [8, 8 + 16]  # the numbering only grows
    arrays, meta = checkpoint.load(checkpoint.scan(cfg.checkpoint.dir)[-1])
    iterations = [v for k, v in arrays.items() if k.startswith("optimizer/") and k.endswith("/iteration")]
    assert [int(v) for v in iterations] == [32]  # the schedule: epoch 1 counted as 16 steps of batch 4, then 16
    assert meta["step_offset"] == 8 - 16 and meta["epoch"] == 2
    assert [(h["epoch"], h["steps"]) for h in meta["history"]] == [(1, 8), (2, 16)]
