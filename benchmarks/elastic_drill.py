"""Elastic chaos drill: SIGKILL ranks and take whole hosts away from an elastic job, and time the recovery.

    python -m benchmarks.elastic_drill [--kills 20] [--seed S] [--out benchmarks/results/elastic_drill.json]

One job of hvdtrain's own elastic loop (``train.elastic``, ``--ranks`` virtual ranks, 2 by default, a commit every
3 steps) runs on two local "hosts", ``localhost`` and ``127.0.0.1`` (``ranks / 2`` slots each; Horovod treats them
as two hosts), found by a discovery script that prints the lines of a file the drill edits. Over one run,
``--kills`` times: once the job is at full size, the rank running the last virtual rank is SIGKILLed (a lost
rank; with 2 slots a host, Horovod blacklists its host for the cooldown, so its neighbour leaves too) or its host
first leaves discovery and every rank on it is killed (a lost host, which comes back once a survivor trains the
lost virtual rank). The survivors roll back to the last commit and go on in the same processes; Horovod starts
new workers when the host is back (and its blacklist cooldown has passed), and the job grows back to full size.

Figures: seconds from each kill until the survivor reads its first batch of the lost virtual rank (``recovery``;
the trace line is written as a batch is read, just before its step), seconds from the kill to the job being
at full size again (``regrown``), hangs (the job still running but no recovery or regrowth within
``HANG_SECONDS``) and failures (the job ended with an error), records lost (a step some virtual rank never
trained, or an epoch missing or repeating a record), whether every virtual rank trained on exactly the
uninterrupted run's batches, steps repeated per loss (at most one commit interval), and goodput: the same
job's wall time with no loss over the drill's wall time. The drill reads the traces incrementally, so that
its polling costs the job little CPU.
``tests/multiprocess/test_elastic_train.py`` runs one kill of each kind with the same functions.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Sequence

from benchmarks import kill_drill
from benchmarks.kill_drill import Segments, add_trace_line, stitched
from hvdtrain.core import config
from hvdtrain.data.synthetic import Layout, TextSpec, make_text_dataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_MODEL = {"embed_dim": 16, "num_heads": 2, "ff_dim": 32, "num_layers": 1, "dropout": 0.1}
HOSTS = ("localhost", "127.0.0.1")
BATCH, EVERY, VIRTUAL = 8, 3, 2
TRAIN_RECORDS = 320  # 20 steps per epoch at 2 virtual ranks of 8
HANG_SECONDS = 180.0


class Trace:
    """A virtual rank's trace file, read incrementally: the drill polls it every 20 ms while it grows to
    thousands of lines, and re-reading it whole each time cost the machine about half a core."""

    def __init__(self, path: str) -> None:
        self.path, self.offset, self.partial, self.runs = path, 0, b"", Segments()

    def poll(self) -> Segments:
        if os.path.exists(self.path):
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
            self.offset += len(chunk)
            *lines, self.partial = (self.partial + chunk).split(b"\n")
            for line in lines:
                add_trace_line(self.runs, line.decode() + "\n")
        return self.runs


@dataclass
class ElasticJob:
    folder: str
    config: str
    epochs: int
    steps_per_epoch: int
    virtual: int = VIRTUAL  # ranks at full size (= train.elastic.max_ranks)
    traces: dict[int, Trace] = field(default_factory=dict)

    @property
    def victim(self) -> int:
        """The virtual rank whose process the drill kills: the last one (rank 0's stays)."""
        return self.virtual - 1

    def runs(self, virtual_rank: int) -> Segments:
        """The segments of a virtual rank's trace so far (pid, first batch, {batch: keys})."""
        if virtual_rank not in self.traces:
            self.traces[virtual_rank] = Trace(self.trace(virtual_rank))
        return self.traces[virtual_rank].poll()

    @property
    def total_steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    def trace(self, virtual_rank: int) -> str:
        return os.path.join(self.folder, "trace", f"rank{virtual_rank}.keys")

    def result(self) -> dict[str, Any]:
        with open(os.path.join(self.folder, "runs", "elastic", "result.json")) as fh:
            return json.load(fh)


def make_job(folder: str, epochs: int, data: Optional[str] = None, tracking: bool = False,
             ranks: int = VIRTUAL) -> ElasticJob:
    """The drill's job in ``folder`` (its dataset made there unless ``data`` names one already made); with
    ``tracking``, logged to a local MLflow store in ``folder`` (the drill itself measures without). ``ranks``
    ranks at full size, on the two HOSTS with ``ranks // 2`` slots each."""
    os.makedirs(folder, exist_ok=True)
    if data is None:
        data = os.path.join(folder, "data")
        make_text_dataset(data, TextSpec(layout=Layout(n_per_split={"train": TRAIN_RECORDS, "validation": 32,
                                                                    "test": 48}, shards_per_split=4),
                                         class_rate=0.35, seed=5))
    set_hosts(folder, HOSTS, ranks // len(HOSTS))
    discover = os.path.join(folder, "discover.sh")
    with open(discover, "w") as fh:
        fh.write(f"#!/bin/sh\ncat {os.path.join(folder, 'hosts')}\n")
    os.chmod(discover, 0o755)
    cfg = config.from_dict({
        "name": "elastic", "workdir": folder, "source": {"table": "demo.reviews"},
        "etl": {"output": data}, "model": TINY_MODEL,
        "train": {"epochs": epochs, "batch_size": BATCH, "learning_rate": 0.003, "shuffle_buffer": 64,
                  "record_trace": os.path.join(folder, "trace"),
                  "elastic": {"min_ranks": 1, "max_ranks": ranks, "commit_every_steps": EVERY,
                              "discovery": discover, "blacklist_cooldown": [1, 2]}},
        "tracking": {"enabled": tracking},  # on: the default store, under the workdir
    }, base_dir=folder)
    path = os.path.join(folder, "job.yaml")
    with open(path, "w") as fh:
        fh.write(cfg.to_yaml())
    return ElasticJob(folder, path, epochs, TRAIN_RECORDS // (BATCH * ranks), ranks)


def set_hosts(folder: str, hosts: Any, slots: int = 1) -> None:
    """What the discovery script prints from now on: ``hosts``, ``slots`` each."""
    with open(os.path.join(folder, "hosts.part"), "w") as fh:
        fh.write("".join(f"{h}:{slots}\n" for h in hosts))
    os.replace(os.path.join(folder, "hosts.part"), os.path.join(folder, "hosts"))


def start(job: ElasticJob, log_path: str, overrides: Sequence[str] = ()) -> subprocess.Popen:
    """``hvdtrain train CONFIG --np 2``: the command a user runs (horovodrun in elastic mode underneath)."""
    env = kill_drill._env()
    env["PATH"] = f"{os.path.dirname(sys.executable)}{os.pathsep}{env.get('PATH', '')}"
    with open(log_path, "w") as out:
        return subprocess.Popen([sys.executable, "-m", "hvdtrain.cli", "train", job.config, "--np", str(job.virtual),
                                 *overrides],
                                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)


def owner(job: ElasticJob, virtual_rank: int) -> Optional[tuple[int, int]]:
    """(pid, steps read) of the process now running a virtual rank."""
    runs = job.runs(virtual_rank)
    if not runs:
        return None
    return runs[-1][0], kill_drill.read_to(runs[-1])


def host_of(pid: int) -> str:
    """HOROVOD_HOSTNAME of a rank process: which "host" it runs on."""
    with open(f"/proc/{pid}/environ", "rb") as fh:
        env = fh.read().split(b"\0")
    return next(v.split(b"=", 1)[1].decode() for v in env if v.startswith(b"HOROVOD_HOSTNAME="))


@dataclass
class Loss:
    kind: str  # "rank" or "host"
    step: int  # steps the killed rank had read when it was chosen
    recovery_s: Optional[float] = None  # kill -> a survivor reads its first batch of the lost virtual rank
    regrown_s: Optional[float] = None  # kill -> full size again
    repeated_steps: int = -1  # steps read again after the rollback (from the traces, once the job is over)
    killed_pid: int = 0  # the process of the job's victim virtual rank
    survivor_pid: int = 0  # virtual rank 0's process
    segment: int = 0  # index of the survivor's segment of the victim virtual rank that followed the kill
    killed_pids: list[int] = field(default_factory=list)  # every process killed (a host's: all of its ranks)
    survivor_pids: list[int] = field(default_factory=list)  # the processes left running


def _at_full_size(job: ElasticJob) -> Optional[tuple[int, int]]:
    """(pid, steps) of the victim virtual rank's process when each virtual rank has a process of its own,
    else None."""
    owners = [owner(job, v) for v in range(job.virtual)]
    if any(o is None for o in owners) or len({o[0] for o in owners if o is not None}) < job.virtual:
        return None
    return owners[job.victim]


def lose(job: ElasticJob, proc: subprocess.Popen, kind: str, after_step: int, deadline: float) -> Loss:
    """Once the job runs at full size and the victim virtual rank (the last) has read ``after_step`` steps,
    SIGKILL its process; for ``kind`` "host", its host leaves discovery first and every rank on it is killed.
    Returns when a survivor reads the lost virtual rank's next batch (the host, if taken, is given back then)
    and when the job is at full size again; either may stay None when ``deadline`` (time.monotonic) or
    HANG_SECONDS pass or the job ends. Raises RuntimeError when the job never gets there."""
    while proc.poll() is None and time.monotonic() < deadline:
        now = _at_full_size(job)
        if now is not None and now[1] >= after_step:
            break
        time.sleep(0.02)
    else:
        raise RuntimeError(f"the job did not reach step {after_step} at {job.virtual} ranks (exit {proc.poll()})")
    pid, step = now
    owners = [o[0] for o in (owner(job, v) for v in range(job.virtual)) if o is not None]
    killed = [pid]
    if kind == "host":
        host = host_of(pid)
        killed = [p for p in owners if _host_or_none(p) == host]
    slots = job.virtual // len(HOSTS)
    loss = Loss(kind, step, killed_pid=pid, survivor_pid=owners[0], segment=len(job.runs(job.victim)),
                killed_pids=killed, survivor_pids=[p for p in owners if p not in killed])
    if kind == "host":
        set_hosts(job.folder, [h for h in HOSTS if h != host], slots)
    killed_at = time.monotonic()
    for victim in killed:
        os.kill(victim, signal.SIGKILL)
    end = min(deadline, killed_at + HANG_SECONDS)
    while time.monotonic() < end and loss.regrown_s is None:
        running = proc.poll() is None  # read the traces once more after the job ended
        runs = job.runs(job.victim)
        if loss.recovery_s is None and _survivor_segment(loss, runs) is not None:
            loss.recovery_s = time.monotonic() - killed_at
            if kind == "host":
                set_hosts(job.folder, HOSTS, slots)  # the host is back
        if loss.recovery_s is not None and _at_full_size(job) is not None:
            loss.regrown_s = time.monotonic() - killed_at
        if not running:
            break
        time.sleep(0.02)
    return loss


def _host_or_none(pid: int) -> Optional[str]:
    try:
        return host_of(pid)
    except (OSError, StopIteration):  # the process has ended
        return None


def _survivor_segment(loss: Loss, runs: Segments) -> Optional[int]:
    """Index of a survivor's first segment of the victim virtual rank after the kill that has read a batch."""
    survivors = set(loss.survivor_pids) or {loss.survivor_pid}
    for i in range(loss.segment, len(runs)):
        if runs[i][0] in survivors and runs[i][2]:
            return i
    return None


def repeated_steps(job: ElasticJob, loss: Loss) -> int:
    """Steps of virtual rank 1 read again after the loss: where the killed process had read to (its last
    batch + 1, or where its segment began when it was killed right after a reset, before reading a batch),
    minus the batch the survivor resumed from (-1 when the traces do not show both)."""
    runs = kill_drill.segments(job.trace(job.victim))
    killed = [r for r in runs[:loss.segment] if r[0] == loss.killed_pid]
    resumed = _survivor_segment(loss, runs)
    if not killed or resumed is None:
        return -1
    return kill_drill.read_to(killed[-1]) - runs[resumed][1]


def records_lost(job: ElasticJob) -> int:
    """Records of steps some virtual rank never trained, plus records missing or read twice within an epoch
    (0 when every virtual rank's stitched trace covers every step, each epoch reading each record once); -1
    when a run resumed past a batch nobody read."""
    lost = 0
    for v in range(job.virtual):
        try:
            batches = stitched(job.trace(v))
        except AssertionError:
            return -1
        lost += sum(BATCH for step in range(job.total_steps) if step not in batches)
        for epoch in range(job.epochs):
            keys = [k for b in range(epoch * job.steps_per_epoch, (epoch + 1) * job.steps_per_epoch)
                    for k in batches.get(b, [])]
            lost += abs(job.steps_per_epoch * BATCH - len(set(keys))) + len(keys) - len(set(keys))
    return lost


def same_batches(job: ElasticJob, reference: ElasticJob) -> bool:
    """Whether every virtual rank trained on exactly the reference run's batches (same data, seed and plan)."""
    return all(stitched(job.trace(v)) == stitched(reference.trace(v)) for v in range(job.virtual))


def run_to_end(job: ElasticJob, timeout: float) -> float:
    """Wall seconds of the job with no loss."""
    began = time.monotonic()
    proc = start(job, os.path.join(job.folder, "job.log"))
    try:
        code = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    if code != 0:
        raise RuntimeError(f"the job failed (exit {code}); see {job.folder}/job.log")
    return time.monotonic() - began


@dataclass
class Report:
    losses: list[Loss] = field(default_factory=list)
    hangs: int = 0  # losses after which the job kept running but never went on or never grew back
    failed: int = 0  # losses after which the job ended with an error
    error: Optional[str] = None
    records_lost: int = -1
    same_batches: bool = False  # every virtual rank trained on the uninterrupted run's batches
    steps: int = 0
    sizes: list[int] = field(default_factory=list)
    ranks_agree: bool = False
    drill_s: float = 0.0
    uninterrupted_s: float = 0.0
    exit_code: Optional[int] = None

    @property
    def goodput(self) -> float:
        return self.uninterrupted_s / self.drill_s if self.drill_s else float("nan")

    def recovery(self) -> dict[str, float]:
        seconds = [loss.recovery_s for loss in self.losses if loss.recovery_s is not None]
        return {"median": statistics.median(seconds), "max": max(seconds)} if seconds else {}

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "goodput": self.goodput, "recovery_s": self.recovery()}


def drill(workdir: str, kills: int = 20, seed: int = 0, log: Any = print, ranks: int = VIRTUAL) -> Report:
    """The uninterrupted job, then the same job under ``kills`` losses, alternately a rank and a host, spread
    evenly over the run (loss i at step (i + 1) x steps / (kills + 1), give or take a commit interval, once the
    job is at full size): one loss per 400 steps, about the time a new worker needs to join here."""
    rng = random.Random(seed)
    epochs = 20 * (kills + 1) * ranks // VIRTUAL  # 400 steps between losses at any size (epochs shrink with it)
    baseline = make_job(os.path.join(workdir, "uninterrupted"), epochs, ranks=ranks)
    job = make_job(os.path.join(workdir, "drill"), epochs, data=os.path.join(baseline.folder, "data"), ranks=ranks)
    report = Report()
    report.uninterrupted_s = run_to_end(baseline, timeout=3600)
    log(f"elastic drill: {job.total_steps} steps at {ranks} ranks on {len(HOSTS)} hosts; uninterrupted "
        f"{report.uninterrupted_s:.1f}s")
    began = time.monotonic()
    proc = start(job, os.path.join(job.folder, "job.log"))
    try:
        _losses(job, proc, kills, rng, report, log)
        report.exit_code = proc.wait(timeout=3600) if not report.hangs else None
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        report.error = str(exc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    report.drill_s = time.monotonic() - began
    if report.exit_code == 0:
        result = job.result()
        report.steps, report.sizes, report.ranks_agree = result["steps"], result["sizes"], result["ranks_agree"]
        report.records_lost = records_lost(job)
        report.same_batches = same_batches(job, baseline)
        for loss in report.losses:
            loss.repeated_steps = repeated_steps(job, loss)
    return report


def _losses(job: ElasticJob, proc: subprocess.Popen, kills: int, rng: random.Random, report: Report,
            log: Any) -> None:
    """Cause the drill's losses, recording each in ``report``; stops at a hang or failure."""
    began = time.monotonic()
    for i in range(kills):
        kind = "rank" if i % 2 == 0 else "host"
        after = (i + 1) * job.total_steps // (kills + 1) + rng.randint(0, EVERY)
        if after >= job.total_steps - 2 * EVERY:
            log(f"elastic drill: the job is near its end after {i} losses")
            return
        loss = lose(job, proc, kind, after, began + 3600)
        report.losses.append(loss)
        log(f"elastic drill: lost a {kind} at step {loss.step}: the survivor read the lost rank's next batch "
            f"{_fmt(loss.recovery_s)} later, {job.virtual} ranks again after {_fmt(loss.regrown_s)}")
        if proc.poll() not in (None, 0):
            report.failed += 1
            return
        if loss.recovery_s is None or loss.regrown_s is None:
            if proc.poll() is None:
                report.hangs += 1  # still running, but the survivor never went on or the job never grew back
            return


def _fmt(seconds: Optional[float]) -> str:
    return "never" if seconds is None else f"{seconds:.1f}s"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--ranks", type=int, default=VIRTUAL, help="ranks at full size, on 2 hosts (even)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "elastic_drill.json"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hvdtrain-elastic-drill-") as workdir:
        report = drill(workdir, args.kills, args.seed, ranks=args.ranks)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(report.to_dict(), fh, indent=2)
    print(json.dumps({k: v for k, v in report.to_dict().items() if k != "losses"}, indent=2))
    return 0 if report.exit_code == 0 and report.records_lost == 0 and report.same_batches else 1


if __name__ == "__main__":
    sys.exit(main())
