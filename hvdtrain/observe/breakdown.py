"""Where each epoch's wall time went, on every rank, and which rank is the straggler.

:class:`StepTimeBreakdown` (a hook, after the checkpointer in the list) adds
up, per epoch and rank, measured times:

* ``data_wait``: blocked in ``next(batches)`` (:func:`hvdtrain.training.loop.take_batches`);
* ``allreduce``: the grouped gradient all-reduce, timed around its own
  compiled call (:class:`hvdtrain.training.steps.TimedStep`); it includes waiting for
  the slowest rank to hand in its gradients;
* ``compute``: the rest of the step call (forward, backward, optimizer
  update); with the all-reduce not timed separately it includes it;
* ``checkpoint``: the training thread's part of checkpoint saves
  (:class:`hvdtrain.training.resume.Checkpointer`);
* ``other``: the epoch's wall time (from its first step's input wait to after
  its last checkpoint) minus all of the above: validation, the epoch's metric
  all-reduce, logging, hooks.

At the epoch's end the ranks' totals are gathered; rank 0 logs the fractions
(summed over ranks) and sends them to MLflow, with the slowest rank: the one
*busy* longest, where busy = wall - all-reduce, the time a rank was not
waiting for the others (in synchronous data parallelism a slow rank shows up
as every other rank's longer all-reduce, so busy time is what singles it out).
"""
from __future__ import annotations

import logging
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

from hvdtrain.observe.events import Hook, LoopState, StepInfo
from hvdtrain.runtime import distributed

log = logging.getLogger("hvdtrain.training.train")
PHASES = ("data_wait", "compute", "allreduce", "checkpoint", "other")


@dataclass
class RankTimes:
    """One rank's seconds in one epoch."""

    rank: int
    host: str
    wall: float = 0.0
    data_wait: float = 0.0
    compute: float = 0.0
    allreduce: Optional[float] = None  # None: not measured (included in compute)
    checkpoint: float = 0.0

    @property
    def other(self) -> float:
        return max(self.wall - self.data_wait - self.compute - (self.allreduce or 0.0) - self.checkpoint, 0.0)

    @property
    def busy(self) -> float:
        """Seconds not spent waiting for the other ranks in the all-reduce."""
        return self.wall - (self.allreduce or 0.0)


@dataclass(frozen=True)
class Straggler:
    rank: int
    host: str
    busy: float
    median_busy: float

    @property
    def lag(self) -> float:
        return self.busy - self.median_busy

    @property
    def lag_fraction(self) -> float:
        return self.lag / self.median_busy if self.median_busy > 0 else 0.0


def fractions(times: Sequence[RankTimes]) -> dict[str, Optional[float]]:
    """Each phase's share of the wall time, summed over ranks (pure); all-reduce None when unmeasured."""
    wall = sum(t.wall for t in times)
    measured = all(t.allreduce is not None for t in times)
    out: dict[str, Optional[float]] = {}
    for phase in PHASES:
        if phase == "allreduce" and not measured:
            out[phase] = None
            continue
        total = sum(getattr(t, phase) or 0.0 for t in times)
        out[phase] = total / wall if wall > 0 else 0.0
    return out


def straggler(times: Sequence[RankTimes]) -> Straggler:
    """The rank busy longest, and the median busy time of all ranks (pure)."""
    slow = max(times, key=lambda t: (t.busy, -t.rank))
    return Straggler(slow.rank, slow.host, slow.busy, statistics.median(t.busy for t in times))


def describe(epoch: int, times: Sequence[RankTimes]) -> str:
    """The log line (pure)."""
    f = fractions(times)
    names = {"data_wait": "input wait", "compute": "compute", "allreduce": "all-reduce", "checkpoint": "checkpoint",
             "other": "other"}
    if f["allreduce"] is None:
        names["compute"] = "compute incl. all-reduce"
    parts = [f"{names[p]} {f[p]:.0%}" for p in PHASES if f[p] is not None]
    slow = straggler(times)
    return (f"epoch {epoch} time over {len(times)} ranks: {', '.join(parts)}; slowest rank {slow.rank} "
            f"({slow.host}) busy {slow.busy:.2f}s, {slow.lag:.2f}s ({slow.lag_fraction:.0%}) behind the median")


def metrics(times: Sequence[RankTimes]) -> dict[str, float]:
    """MLflow metrics of one epoch (pure)."""
    out = {f"time_{p}_fraction": v for p, v in fractions(times).items() if v is not None}
    slow = straggler(times)
    out.update(slowest_rank=float(slow.rank), slowest_rank_busy_seconds=slow.busy,
               slowest_rank_lag_seconds=slow.lag, slowest_rank_lag_fraction=slow.lag_fraction)
    return out


class StepTimeBreakdown(Hook):
    """Measures each epoch's phases on this rank; at the epoch's end (after the checkpoint) gathers every
    rank's (a collective, at epoch ends only) and rank 0 logs them and sends them to ``log_metrics``."""

    def __init__(self, rank: Any, allreduce_seconds: Callable[[], Optional[float]],
                 checkpoint_seconds: Callable[[], float], log_metrics: Callable[[Mapping[str, float], int], None],
                 clock: Callable[[], float] = time.perf_counter):
        self.rank, self._allreduce, self._checkpoint = rank, allreduce_seconds, checkpoint_seconds
        self._log_metrics, self._clock = log_metrics, clock
        self.times = RankTimes(rank.rank, rank.hostname)
        self._begin, self._saved_before = 0.0, 0.0
        self.history: list[list[RankTimes]] = []  # every epoch's gathered times (every rank holds them)

    def start_epoch(self, epoch: int) -> None:
        self.times = RankTimes(self.rank.rank, self.rank.hostname)
        self._begin, self._saved_before = self._clock(), self._checkpoint()

    def on_step(self, info: StepInfo) -> None:
        t = self.times
        allreduce = self._allreduce()
        t.data_wait += info.data_seconds
        if allreduce is not None:
            t.allreduce = (t.allreduce or 0.0) + allreduce
        t.compute += max(info.step_seconds - (allreduce or 0.0), 0.0)

    def after_step(self, state: LoopState) -> None:
        if not state.epoch_end:
            return
        self.times.checkpoint = self._checkpoint() - self._saved_before
        self.times.wall = self._clock() - self._begin
        gathered = distributed.allgather_object(asdict(self.times), name=f"hvdtrain.observe.breakdown{state.step}")
        times = [RankTimes(**g) for g in gathered]
        self.history.append(times)
        if self.rank.is_chief:
            log.info(describe(state.epoch, times))
            self._log_metrics(metrics(times), state.epoch)
