"""Horovod's timeline on demand, and a summary of one.

``train.timeline: {start_step: S, steps: K}`` records Horovod's timeline
(:func:`hvdtrain.runtime.distributed.start_timeline`) from global step S through
step S+K-1 (:class:`TimelineHook`); rank 0 then attaches the file to the
MLflow run. ``hvdtrain timeline summarize FILE`` (:func:`summarize`) reads it.

The file is Chrome-trace JSON (``chrome://tracing``, Perfetto): one
"process" per tensor (a ``process_name`` metadata event), and for each
collective a begin/end pair (``ph`` ``B``/``E``) per activity: the
negotiation (``NEGOTIATE_ALLREDUCE``: ranks agreeing the tensor is ready
everywhere), then the operation (``ALLREDUCE``) with nested activities:
``QUEUE``, ``WAIT_FOR_DATA`` / ``WAIT_FOR_OTHER_TENSOR_DATA`` (the framework
has not produced the tensor yet), ``MEMCPY_IN_FUSION_BUFFER``, the transfer
itself (``GLOO_ALLREDUCE``, ``MPI_ALLREDUCE``, ``NCCL_ALLREDUCE``, ...),
``MEMCPY_OUT_FUSION_BUFFER``. Horovod may leave the final ``]`` off a file it
was still writing; the reader accepts that.

Fused tensors share one transfer, so each activity shows on every tensor in
the fusion: the summary gives, per phase, the wall time covered by the union
of its intervals (what the phase cost the job) and the time summed over
tensors.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from hvdtrain.core.errors import DataError
from hvdtrain.observe.events import Hook, StepInfo
from hvdtrain.runtime import distributed

log = logging.getLogger("hvdtrain.training.train")
FILENAME = "horovod_timeline.json"

# The phases the summary names, each from Horovod's activity names (horovod/common/common.h).
PHASES = {
    "negotiation": lambda name: name.startswith("NEGOTIATE_"),
    "wait for data": lambda name: name in ("WAIT_FOR_DATA", "WAIT_FOR_OTHER_TENSOR_DATA"),
    "memcpy into fusion buffer": lambda name: name == "MEMCPY_IN_FUSION_BUFFER",
    "all-reduce": lambda name: name.endswith("_ALLREDUCE") and not name.startswith("NEGOTIATE_"),
}


@dataclass(frozen=True)
class PhaseTime:
    phase: str
    wall_seconds: float  # union of the phase's intervals over all tensors
    summed_seconds: float  # sum over tensors
    count: int  # intervals


def load_events(text: str, where: str) -> list[dict[str, Any]]:
    """The trace's events; accepts a file Horovod did not close (no final ``]``) (pure)."""
    body = text.strip()
    if not body:
        raise DataError(f"{where} is empty: the timeline recorded nothing (was Horovod's timeline started?)")
    if body.startswith("["):
        body = body.rstrip().rstrip(",")
        if not body.endswith("]"):
            body += "]"
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        raise DataError(f"{where} is not a Chrome-trace JSON timeline ({exc}); pass the file "
                        "train.timeline wrote (or HOROVOD_TIMELINE)") from None
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    return [e for e in events if isinstance(e, dict)]


def intervals(events: Iterable[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """Activity name -> (start, end) microseconds, from B/E pairs per tensor and X events (pure)."""
    out: dict[str, list[tuple[float, float]]] = {}
    open_: dict[Any, list[tuple[str, float]]] = {}
    for e in sorted(events, key=lambda e: float(e.get("ts", 0))):
        ph, ts = e.get("ph"), float(e.get("ts", 0))
        if ph == "X":
            if not str(e.get("name", "")).isdigit():  # digits: negotiation's "rank R is ready" markers
                out.setdefault(e.get("name", ""), []).append((ts, ts + float(e.get("dur", 0))))
        elif ph == "B":
            open_.setdefault((e.get("pid"), e.get("tid")), []).append((e.get("name", ""), ts))
        elif ph == "E":
            stack = open_.get((e.get("pid"), e.get("tid")))
            if stack:
                name, begin = stack.pop()
                out.setdefault(name, []).append((begin, ts))
    return out


def union_length(spans: list[tuple[float, float]]) -> float:
    """Length covered by the union of intervals (pure)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def summarize_events(events: list[dict[str, Any]]) -> tuple[list[PhaseTime], dict[str, float]]:
    """The named phases' times, and every activity's summed seconds (pure)."""
    spans = intervals(events)
    phases = []
    for phase, matches in PHASES.items():
        chosen = [s for name, ss in spans.items() if matches(name) for s in ss]
        phases.append(PhaseTime(phase, union_length(chosen) / 1e6, sum(b - a for a, b in chosen) / 1e6,
                                len(chosen)))
    activities = {name: sum(b - a for a, b in ss) / 1e6 for name, ss in sorted(spans.items())}
    return phases, activities


def summarize(path: str) -> str:
    """The table ``hvdtrain timeline summarize FILE`` prints."""
    try:
        with open(path) as fh:
            text = fh.read()
    except OSError as exc:
        raise DataError(f"cannot read timeline {path}: {exc.strerror}; pass the JSON file train.timeline "
                        f"wrote ({FILENAME} in train.output, or the MLflow run's timeline/ artifact)") from None
    phases, activities = summarize_events(load_events(text, path))
    if not activities:
        raise DataError(f"{path} holds no Horovod activities: the timeline covered no collective")
    rows = [f"{'phase':<28}{'wall s':>10}{'summed s':>12}{'count':>8}"]
    rows += [f"{p.phase:<28}{p.wall_seconds:>10.4f}{p.summed_seconds:>12.4f}{p.count:>8}" for p in phases]
    rows += ["", "every activity (seconds summed over tensors):"]
    rows += [f"  {name:<34}{seconds:>10.4f}" for name, seconds in activities.items()]
    return "\n".join(rows)


@dataclass(frozen=True)
class StepQueue:
    """One step's all-reduces as rank 0's timeline shows them (microseconds)."""

    first_tensor: str  # the first to enter Horovod's queue (its negotiation began first)
    last_tensor: str  # the last to enter it: its gradient was the last one computed
    spread_us: float  # from the first tensor entering the queue to the last
    lead_us: float  # how long before the last tensor entered the queue a transfer had already started (<0: none)


def per_tensor(events: list[dict[str, Any]], activity: str) -> dict[str, list[tuple[float, float]]]:
    """Tensor name -> its (start, end) intervals of ``activity``, in time order (pure)."""
    names = {e.get("pid"): e.get("args", {}).get("name") for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    out: dict[str, list[tuple[float, float]]] = {}
    for pid, name in names.items():
        if name:
            spans = intervals(e for e in events if e.get("pid") == pid)
            out[name] = sorted(spans.get(activity, []))
    return {k: v for k, v in out.items() if v}


def step_queues(events: list[dict[str, Any]], op: str = "ALLREDUCE") -> list[StepQueue]:
    """When each step's tensors entered Horovod's queue, and whether a transfer began before the last did (pure).

    A step all-reduces every gradient once, so the k-th negotiation of each
    tensor belongs to step k. A tensor enters the queue when a rank submits it,
    i.e. when that rank has computed the gradient: its ``NEGOTIATE_<op>`` begins.
    One grouped all-reduce submits all tensors at once (spread ~0); per-tensor
    all-reduces inside the backward pass submit them as backprop produces them.
    """
    negotiations = per_tensor(events, f"NEGOTIATE_{op}")
    transfers = {name: spans for name, spans in per_tensor(events, op).items() if name in negotiations}
    if not negotiations:
        return []
    steps = min(len(spans) for spans in negotiations.values())
    out = []
    for k in range(steps):
        starts = {name: spans[k][0] for name, spans in negotiations.items()}
        first, last = min(starts, key=starts.__getitem__), max(starts, key=starts.__getitem__)
        began = [spans[k][0] for spans in transfers.values() if len(spans) > k]
        lead = starts[last] - min(began) if began else float("-inf")
        out.append(StepQueue(first, last, starts[last] - starts[first], lead))
    return out


class TimelineHook(Hook):
    """Records Horovod's timeline over global steps ``start_step`` .. ``start_step + steps - 1``; rank 0
    attaches the file (``attach``) at the next epoch end after it stopped, or at :meth:`close`."""

    def __init__(self, cfg: Any, path: str, first_step: int, attach: Callable[[str], None], is_chief: bool):
        self.cfg, self.path, self._attach, self.is_chief = cfg, path, attach, is_chief
        self.done = first_step  # global steps finished
        self.recording, self.stopped, self.attached = False, False, False
        if first_step >= cfg.start_step:
            log.warning("train.timeline.start_step=%d: this run starts after global step %d (resumed), so no "
                        "timeline is recorded; set a later start_step", cfg.start_step, first_step)
            self.stopped = True

    def _start_if_due(self) -> None:
        if not self.recording and not self.stopped and self.done == self.cfg.start_step - 1:
            if self.is_chief:
                os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            self.recording = distributed.start_timeline(self.path)
            if not self.recording:
                log.info("train.timeline: a single process has no Horovod timeline to record")
                self.stopped = True

    def start_epoch(self, epoch: int) -> None:
        self._start_if_due()

    def pause_after(self, global_step: int, layout_step: int) -> bool:
        """A multi-step call ends where recording starts or stops."""
        first = self.cfg.start_step
        return not self.stopped and global_step in (first - 1, first + self.cfg.steps - 1)

    def on_step(self, info: StepInfo) -> None:
        self.done = info.global_step
        if self.recording and self.done >= self.cfg.start_step + self.cfg.steps - 1:
            self._stop()
        self._start_if_due()

    def _stop(self) -> None:
        distributed.stop_timeline()
        self.recording, self.stopped = False, True
        log.info("recorded Horovod's timeline of steps %d-%d to %s", self.cfg.start_step, self.done, self.path)

    def end_epoch(self, stats: Any) -> bool:
        self._attach_once()
        return False

    def _attach_once(self) -> None:
        if self.stopped and not self.attached and self.is_chief and os.path.isfile(self.path):
            self._attach(self.path)
            self.attached = True

    def close(self) -> Optional[str]:
        """Stop if still recording (training ended first), attach; the file's path on rank 0."""
        if self.recording:
            self._stop()
        self._attach_once()
        return self.path if self.attached else None
