"""Kill drill: SIGKILL a rank at random steps under automatic restart, and compare with an uninterrupted run.

    python -m benchmarks.kill_drill [--kills 5] [--seed S] [--out benchmarks/results/kill_drill.json]

One job (2 local Gloo ranks under ``horovodrun``, a tiny Transformer with
dropout, checkpoints every few steps, every batch's record keys traced) is run
twice from the same seed:

* uninterrupted;
* interrupted: ONE command, ``hvdtrain train CONFIG --np 2 --max-restarts
  K``; a random rank is SIGKILLed at a random step after a checkpoint,
  ``--kills`` times, and the supervisor relaunches the job each time
  (``checkpoint.resume: auto``) until it finishes.

Figures: resumes that succeeded, seconds from each kill to the job's teardown
(the lost rank named) and to the resumed job's first step (median and max),
the final weight difference between the two runs, and the records lost or
repeated (the interrupted run's batches, segment by segment up to where the
next run resumed, against the uninterrupted run's batches).
``tests/multiprocess/test_resume_mp.py`` runs the same drill with one kill.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_MODEL = {"embed_dim": 16, "num_heads": 2, "ff_dim": 32, "num_layers": 1, "dropout": 0.1}
NP = 2


@dataclass(frozen=True)
class Launch:
    """How horovodrun starts the ranks: one host by default; the multihost tests pass ssh hosts."""

    np: int = NP
    hosts: str = f"localhost:{NP}"
    args: tuple[str, ...] = ()  # more horovodrun arguments, e.g. ("-p", "2222", "--network-interfaces", "lo")
    kill_ranks: tuple[int, ...] = ()  # ranks a kill may hit (all when empty)
    env: dict[str, str] = field(default_factory=dict)  # launcher environment on top of the drill's
    timeout: float = 300  # seconds one job may take
    supervised: bool = True  # relaunch through `hvdtrain train --max-restarts` (one host only)


@dataclass
class Drill:
    """The job both runs share."""

    workdir: str
    data_dir: str
    launch: Launch = field(default_factory=Launch)
    epochs: int = 4
    batch_size: int = 16
    every_steps: int = 7
    train_records: int = 960
    steps_per_epoch: int = 0

    @property
    def total_steps(self) -> int:
        return self.epochs * self.steps_per_epoch


@dataclass
class Kill:
    rank: int
    target_step: int
    killed_after_batch: int = -1  # the dead rank's last traced batch (0-based)
    resumed_from_step: Optional[int] = None  # the step the next run continued from
    seconds_to_exit: float = 0.0  # from the kill to the job's teardown (the supervisor's restart line)
    seconds_to_resumed_step: float = 0.0  # from the kill to the relaunched job's first traced batch
    exit_code: Optional[int] = None  # the lost rank's, as horovodrun reports it
    lost_rank_named: bool = False
    run_id: Optional[str] = None  # the MLflow run the killed job logged to


@dataclass
class Report:
    kills: list[Kill] = field(default_factory=list)
    resumes_ok: int = 0
    final_weight_max_abs_diff: float = float("nan")
    optimizer_max_abs_diff: float = float("nan")
    records_lost: int = -1
    records_repeated: int = -1
    batches_equal: bool = False
    same_mlflow_run: bool = False
    restarts_reported: int = -1  # result.json's count
    seconds_to_resumed_step: dict[str, float] = field(default_factory=dict)  # median and max over kills
    test_accuracy: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def make_dataset(drill: Drill) -> None:
    from hvdtrain.data.synthetic import Layout, TextSpec, make_text_dataset

    layout = Layout(n_per_split={"train": drill.train_records, "validation": 64, "test": 64}, shards_per_split=4)
    make_text_dataset(drill.data_dir, TextSpec(layout=layout, class_rate=0.35, seed=21))
    drill.steps_per_epoch = drill.train_records // (drill.batch_size * drill.launch.np)


def allreduce_mode(np: int) -> str:
    """The all-reduce mode a drill of ``np`` ranks checks exact resume in.

    At 2 ranks, the non-default overlap mode (grouped and overlap give bit-identical updates there,
    tests/multiprocess/test_fp16_safety_mp.py). Beyond 2, only grouped is bit-reproducible: a ring all-reduce sums a fused
    buffer in an order set by its layout, and in overlap mode which gradients Horovod fuses in a cycle depends
    on timing (a 4-rank drill in overlap mode ended 7e-6 away from its uninterrupted run).
    """
    return "overlap" if np <= 2 else "grouped"


def write_config(drill: Drill, name: str, tracking: bool = True, **fault: int) -> str:
    from hvdtrain.core import config

    cfg = config.from_dict({
        "name": name, "workdir": drill.workdir, "source": {"table": "demo.reviews"},
        "etl": {"output": drill.data_dir}, "model": TINY_MODEL,
        "train": {"epochs": drill.epochs, "batch_size": drill.batch_size, "learning_rate": 0.003,
                  "shuffle_buffer": 64, "progress": "log", "record_trace": os.path.join(drill.workdir, name, "trace"),
                  "allreduce": allreduce_mode(drill.launch.np)},
        "checkpoint": {"every_steps": drill.every_steps, "keep_last": 2},
        "fault": {"peer_timeout": 30, "stall_timeout": 120, "restart_backoff": 1, **fault},
        "tracking": {"enabled": tracking},
    }, base_dir=drill.workdir)
    path = os.path.join(drill.workdir, f"{name}.yaml")
    with open(path, "w") as fh:
        fh.write(cfg.to_yaml())
    return path


def _env(launch: Launch = Launch()) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HOROVOD_", "OMPI_", "PMI_")) and k != "MLFLOW_TRACKING_URI"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT, MLFLOW_DISABLE_TELEMETRY="true", PYTHONUNBUFFERED="1")
    env.update(launch.env)
    return env


def command(config_path: str, launch: Launch = Launch()) -> list[str]:
    hr = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    return [hr, "-np", str(launch.np), "-H", launch.hosts, "--gloo", *launch.args, sys.executable, "-m",
            "hvdtrain.training.train", config_path]


def supervised_command(config_path: str, max_restarts: int, np: int = NP) -> list[str]:
    """The one command a user runs: ``hvdtrain train CONFIG --np 2 --max-restarts K``."""
    return [sys.executable, "-m", "hvdtrain.cli", "train", config_path, "--np", str(np),
            "--max-restarts", str(max_restarts)]


def run_to_end(config_path: str, launch: Launch = Launch()) -> subprocess.CompletedProcess:
    proc = subprocess.run(command(config_path, launch), cwd=ROOT, env=_env(launch), capture_output=True, text=True,
                          timeout=launch.timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"training failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return proc


def trace_path(drill: Drill, name: str, rank: int) -> str:
    return os.path.join(drill.workdir, name, "trace", f"rank{rank}.keys")


Segments = list[tuple[int, int, dict[int, list[str]]]]


def segments(path: str) -> Segments:
    """The trace of each run, in order: (pid, first batch, {batch: keys})."""
    out: Segments = []
    if not os.path.exists(path):
        return out
    with open(path) as fh:
        for line in fh:
            add_trace_line(out, line)
    return out


def read_to(segment: tuple[int, int, dict[int, list[str]]]) -> int:
    """The batch a run's segment had read up to (exclusive): its last batch + 1, or where it began when it read
    none."""
    _, first, batches = segment
    return max(batches) + 1 if batches else first


def add_trace_line(out: Segments, line: str) -> None:
    """Add one line of a trace file to its segments (a line still being written, without its newline, is not
    a batch yet)."""
    head = re.match(r"# pid (\d+) from (\d+)", line)
    if head:
        out.append((int(head.group(1)), int(head.group(2)), {}))
    elif "\t" in line and out and line.endswith("\n"):
        number, keys = line.rstrip("\n").split("\t", 1)
        out[-1][2][int(number)] = keys.split(",")


def stitched(path: str) -> dict[int, list[str]]:
    """The batches the finished model was trained on: each run's, up to where the next one resumed."""
    runs = segments(path)
    out: dict[int, list[str]] = {}
    for i, (_, first, batches) in enumerate(runs):
        end = runs[i + 1][1] if i + 1 < len(runs) else None
        missing = [b for b in range(first, end) if b not in batches] if end is not None else []
        if missing:
            raise AssertionError(f"{path}: run {i} resumed at batch {first} but never read batches {missing[:5]} "
                                 f"before the next run resumed at {end}")
        out.update({b: keys for b, keys in batches.items() if end is None or b < end})
    return out


def assert_resumed_once_exactly(trace_dir: str, ranks: int, epochs: int, steps: int, batch: int,
                                every: int) -> None:
    """Each rank's trace holds two runs, the second resumed at a checkpoint (at least ``every`` steps in, and no
    further than the first had read); stitched, they cover every batch of ``epochs`` epochs of ``steps``, each
    record of an epoch read once. Raises AssertionError naming what is wrong."""
    for rank in range(ranks):
        path = os.path.join(trace_dir, f"rank{rank}.keys")
        runs = segments(path)
        assert len(runs) == 2 and every <= runs[1][1] <= read_to(runs[0]), (path, [r[:2] for r in runs])
        batches = stitched(path)  # raises on a batch never read between the two runs
        assert sorted(batches) == list(range(epochs * steps)), (path, sorted(batches)[-3:])
        for epoch in range(epochs):
            keys = [k for b in range(epoch * steps, (epoch + 1) * steps) for k in batches[b]]
            assert len(keys) == len(set(keys)) == steps * batch, (path, epoch, len(keys), len(set(keys)))


def _current_pid(path: str, runs_before: int) -> Optional[tuple[int, int]]:
    """(pid, batches traced) of the run after the first ``runs_before`` ones, once it has started."""
    runs = segments(path)
    if len(runs) <= runs_before:
        return None
    return runs[runs_before][0], read_to(runs[runs_before])


def kill_once(drill: Drill, name: str, config_path: str, kill: Kill, runs_before: int,
              timeout: Optional[float] = None, sig: int = signal.SIGKILL) -> str:
    """Start the job, send ``sig`` (SIGKILL; SIGSTOP freezes the rank instead) to ``kill.rank`` once its
    trace reaches ``kill.target_step``, wait for the job's exit; returns its output."""
    proc = subprocess.Popen(command(config_path, drill.launch), cwd=ROOT, env=_env(drill.launch), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    timeout = timeout or drill.launch.timeout
    path = trace_path(drill, name, kill.rank)
    deadline = time.monotonic() + timeout
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the job ended (exit {proc.returncode}) before step {kill.target_step}:\n"
                                   f"{proc.stdout.read()[-4000:]}")
            now = _current_pid(path, runs_before)
            if now is not None and now[1] >= kill.target_step:
                os.kill(now[0], sig)
                killed_at = time.monotonic()
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"step {kill.target_step} not reached in {timeout}s")
            time.sleep(0.01)
        out, _ = proc.communicate(timeout=timeout)
        kill.seconds_to_exit = time.monotonic() - killed_at
        kill.exit_code = proc.returncode
        kill.lost_rank_named = bool(re.search(rf"Process name: {kill.rank}\b", out))  # horovodrun's verdict
        found = re.search(r"MLflow run ([0-9a-f]{32})", out)
        kill.run_id = found.group(1) if found else None
        runs = segments(path)
        kill.killed_after_batch = max(runs[runs_before][2]) if runs[runs_before][2] else -1
        return out
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _final_state(drill: Drill, name: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    from hvdtrain.training import checkpoint

    loaded = checkpoint.restore_latest(os.path.join(drill.workdir, "checkpoints", name))
    if loaded is None:
        raise RuntimeError(f"no checkpoint of {name}")
    _, arrays, meta = loaded
    return arrays, meta


def _max_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray], prefix: str) -> float:
    keys = [k for k in a if k.startswith(prefix)]
    assert keys and sorted(keys) == sorted(k for k in b if k.startswith(prefix)), prefix
    return max(float(np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)))) if a[k].size else 0.0
               for k in keys)


def compare(drill: Drill, report: Report, baseline: str, interrupted: str) -> None:
    """Weights, optimizer state and the batch sequence of both runs."""
    a, meta_a = _final_state(drill, baseline)
    b, meta_b = _final_state(drill, interrupted)
    assert meta_a["step"] == meta_b["step"] == drill.total_steps, (meta_a["step"], meta_b["step"])
    report.final_weight_max_abs_diff = _max_diff(a, b, "model/")
    report.optimizer_max_abs_diff = _max_diff(a, b, "optimizer/")
    lost = repeated = 0
    equal = True
    for rank in range(drill.launch.np):
        want = stitched(trace_path(drill, baseline, rank))
        got = stitched(trace_path(drill, interrupted, rank))
        equal &= got == want
        diff = collections.Counter(k for ks in want.values() for k in ks)
        diff.subtract(k for ks in got.values() for k in ks)
        lost += sum(v for v in diff.values() if v > 0)
        repeated += -sum(v for v in diff.values() if v < 0)
    report.records_lost, report.records_repeated, report.batches_equal = lost, repeated, equal
    for name in (baseline, interrupted):
        with open(os.path.join(drill.workdir, "runs", name, "result.json")) as fh:
            report.test_accuracy[name] = json.load(fh)["test_accuracy"]


def kill_targets(drill: Drill, kills: int, rng: random.Random) -> list[Kill]:
    """Random (rank, step) pairs, each after the previous kill's checkpoint and before the end."""
    out, low = [], drill.every_steps + 1
    span = (drill.total_steps - 6 - low) // kills
    for i in range(kills):
        lo = low + i * span
        ranks = drill.launch.kill_ranks or tuple(range(drill.launch.np))
        out.append(Kill(rank=rng.choice(ranks), target_step=rng.randint(lo, lo + max(0, span - drill.every_steps))))
    return out


class _Lines:
    """A process's output lines with their arrival times, read in the background (the pipe never fills)."""

    def __init__(self, stream: Any):
        self.lines: list[tuple[float, str]] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self.lines.append((time.monotonic(), line))

    def after(self, t: float, pattern: str) -> Optional[tuple[float, re.Match]]:
        for at, line in list(self.lines):
            found = re.search(pattern, line)
            if at >= t and found:
                return at, found
        return None

    def text_since(self, t: float) -> str:
        return "".join(line for at, line in list(self.lines) if at >= t)

    def text(self) -> str:
        self._thread.join(timeout=5)
        return "".join(line for _, line in self.lines)


def _wait_for(what: str, check: Any, proc: subprocess.Popen, lines: _Lines, deadline: float) -> Any:
    while True:
        found = check()
        if found is not None:
            return found
        if proc.poll() is not None:
            raise RuntimeError(f"the job ended (exit {proc.returncode}) before {what}:\n{lines.text()[-4000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not reached in time")
        time.sleep(0.01)


def kill_under_supervisor(drill: Drill, name: str, config_path: str, kills: list[Kill],
                          timeout: float = 1800) -> str:
    """One supervised command; each kill SIGKILLs its rank at its step, and the supervisor relaunches the job.
    Measures each kill's teardown and the time to the resumed job's first batch; returns the output."""
    proc = subprocess.Popen(supervised_command(config_path, len(kills), drill.launch.np), cwd=ROOT, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines, deadline = _Lines(proc.stdout), time.monotonic() + timeout
    try:
        for i, kill in enumerate(kills):
            path = trace_path(drill, name, kill.rank)
            pid, _ = _wait_for(f"step {kill.target_step} of try {i + 1}", lambda: (
                lambda now: now if now is not None and now[1] >= kill.target_step else None)(_current_pid(path, i)),
                proc, lines, deadline)
            os.kill(pid, signal.SIGKILL)
            killed_at = time.monotonic()
            at, found = _wait_for("the supervisor's restart", lambda: lines.after(
                killed_at, rf"restart {i + 1}/\d+ .*after (.+?)(?: on rank (\d+))?: resuming"), proc, lines, deadline)
            kill.seconds_to_exit = at - killed_at
            kill.lost_rank_named = found.group(2) == str(kill.rank) and "lost rank" in found.group(1)
            code = re.search(rf"Process name: {kill.rank}\s+Exit code: (-?\d+)", lines.text_since(killed_at))
            kill.exit_code = int(code.group(1)) if code else None
            runs = segments(path)
            kill.killed_after_batch = max(runs[i][2]) if runs[i][2] else -1
            _wait_for(f"the first step of try {i + 2}", lambda: (lambda r: True if len(r) > i + 1 and r[i + 1][2]
                                                                   else None)(segments(path)), proc, lines, deadline)
            kill.seconds_to_resumed_step = time.monotonic() - killed_at
            found_run = lines.after(0, r"MLflow run ([0-9a-f]{32})")
            kill.run_id = found_run[1].group(1) if found_run else None
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        out = lines.text()
        if proc.returncode != 0:
            raise RuntimeError(f"the supervised job failed (exit {proc.returncode}):\n{out[-4000:]}")
        return out
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def drill_run(workdir: str, kills: int = 5, seed: int = 0, log: Any = print, launch: Launch = Launch(),
              epochs: int = 4) -> Report:
    drill = Drill(workdir=workdir, data_dir=os.path.join(workdir, "data"), launch=launch, epochs=epochs)
    make_dataset(drill)
    report = Report(kills=kill_targets(drill, kills, random.Random(seed)))
    baseline = write_config(drill, "uninterrupted")
    interrupted = write_config(drill, "interrupted")
    log(f"drill: {drill.total_steps} steps, checkpoint every {drill.every_steps}; kills at "
        f"{[(k.rank, k.target_step) for k in report.kills]}")
    run_to_end(baseline, launch=launch)
    if launch.supervised:  # one host: the supervised command a user runs relaunches the job itself
        kill_under_supervisor(drill, "interrupted", interrupted, report.kills)
    else:  # ssh hosts: `hvdtrain train --np` launches on this host only, so relaunch the horovodrun command
        for i, kill in enumerate(report.kills):
            kill_once(drill, "interrupted", interrupted, kill, runs_before=i)
        run_to_end(interrupted, launch=launch)
    for i, kill in enumerate(report.kills):
        runs = segments(trace_path(drill, "interrupted", kill.rank))
        if i + 1 < len(runs):
            kill.resumed_from_step = runs[i + 1][1]  # batch number = step with accumulation 1
            report.resumes_ok += 1
        log(f"drill: killed rank {kill.rank} after batch {kill.killed_after_batch}; torn down "
            f"{kill.seconds_to_exit:.1f}s later (lost rank named: {kill.lost_rank_named}), resumed from step "
            f"{kill.resumed_from_step}, first step {kill.seconds_to_resumed_step:.1f}s after the kill")
    seconds = [k.seconds_to_resumed_step for k in report.kills]
    report.seconds_to_resumed_step = {"median": statistics.median(seconds), "max": max(seconds)}
    with open(os.path.join(drill.workdir, "runs", "interrupted", "result.json")) as fh:
        result = json.load(fh)
    report.restarts_reported = result.get("restarts", -1)
    report.same_mlflow_run = bool(result["run_id"]) and report.kills[0].run_id == result["run_id"]
    compare(drill, report, "uninterrupted", "interrupted")
    return report


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--seed", type=int, default=int(time.time()) % 10_000)
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "kill_drill.json"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hvdtrain-drill-") as workdir:
        report = drill_run(workdir, args.kills, args.seed)
    doc = {"seed": args.seed, **report.to_dict()}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(doc, fh, indent=2)
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
