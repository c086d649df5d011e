"""The epoch loop every rank runs, and what happens around each step and epoch.

:func:`fit` runs ``epochs`` x ``steps`` optimizer steps on the rank's endless
batch stream; each step takes ``accum_steps`` batches (gradient
accumulation), and the time blocked in ``next(batches)`` is measured apart
from the step. Per-epoch loss and accuracy are sums all-reduced over ranks.
Everything else goes through :class:`LoopHooks`, called on every rank:

* ``start_epoch(epoch)``;
* ``on_step(epoch, step, data_seconds, loss_sum, examples)`` after each
  optimizer step (progress, per-step metrics; no collectives here: rank 0's
  reporting is timed by the clock, which differs between ranks);
* ``end_epoch(stats) -> stop`` after each epoch (validation, early
  stopping). It may run collectives, and must return the same decision on
  every rank.

:class:`EpochMonitor` is the hooks object training uses.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator, Mapping, Optional, Protocol, Sequence

import numpy as np

from hvdtrain import distributed, early_stopping
from hvdtrain.config import EarlyStoppingConfig
from hvdtrain.evaluation import scalar_metrics

log = logging.getLogger("hvdtrain.train")


@dataclass
class EpochStats:
    epoch: int
    steps: int
    examples: int
    loss: float
    accuracy: float
    seconds: float
    learning_rate: float = 0.0  # at the end of the epoch
    validation: Optional[dict[str, Any]] = None  # the validation split's report, when validated this epoch

    @property
    def samples_per_sec(self) -> float:
        return self.examples / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "samples_per_sec": self.samples_per_sec}

    def metrics(self) -> dict[str, float]:
        """Per-epoch MLflow metrics (validation ones prefixed ``val_``)."""
        out = {"train_loss": self.loss, "train_accuracy": self.accuracy, "samples_per_sec": self.samples_per_sec,
               "epoch_seconds": self.seconds, "learning_rate": self.learning_rate}
        if self.validation is not None:
            out.update(scalar_metrics(self.validation, "val"))
        return out


def epoch_stats(epoch: int, steps: int, totals: np.ndarray, seconds: float) -> EpochStats:
    """From rank-summed [loss sum, correct, examples]: exact means, not a mean of means."""
    loss_sum, correct, examples = (float(x) for x in totals)
    return EpochStats(epoch, steps, int(examples), loss_sum / max(examples, 1), correct / max(examples, 1), seconds)


class LoopHooks(Protocol):
    def start_epoch(self, epoch: int) -> None: ...

    def on_step(self, epoch: int, step: int, data_seconds: float, loss_sum: Any, examples: int) -> None: ...

    def end_epoch(self, stats: EpochStats) -> bool: ...


def take_batches(batches: Iterator[Any], count: int,
                 clock: Callable[[], float] = time.perf_counter) -> tuple[list[Any], float]:
    """The next ``count`` batches, and the seconds spent waiting for them."""
    start = clock()
    taken = [next(batches) for _ in range(count)]
    return taken, clock() - start


def fit(step_fn: Callable[[Sequence[Any]], tuple[Any, Any]], batches: Iterator[Any], *, epochs: int, steps: int,
        accum_steps: int, batch_size: int, hooks: LoopHooks) -> list[EpochStats]:
    """Run up to ``epochs`` x ``steps`` optimizer steps; stops early when ``hooks.end_epoch`` says so."""
    history = []
    examples = accum_steps * batch_size  # this rank's examples per optimizer step
    for epoch in range(1, epochs + 1):
        hooks.start_epoch(epoch)
        start = time.perf_counter()
        loss_sums, corrects = [], []
        for step in range(1, steps + 1):
            micro, waited = take_batches(batches, accum_steps)
            loss_sum, correct = step_fn(micro)
            loss_sums.append(loss_sum)
            corrects.append(correct)
            hooks.on_step(epoch, step, waited, loss_sum, examples)
        local = np.array([sum(float(x) for x in loss_sums), sum(float(x) for x in corrects), steps * examples],
                         np.float64)
        totals = distributed.allreduce_sum(local, name=f"hvdtrain.epoch{epoch}")
        stats = epoch_stats(epoch, steps, totals, time.perf_counter() - start)
        history.append(stats)
        if hooks.end_epoch(stats):
            break
    return history


class EarlyStopper:
    """Tracks the validation metric, keeps the best epoch's weights, decides when to stop."""

    def __init__(self, cfg: EarlyStoppingConfig, get_weights: Callable[[], list[np.ndarray]]):
        self.cfg, self._get_weights = cfg, get_weights
        self.values: list[float] = []
        self.best_weights: Optional[list[np.ndarray]] = None
        self.decision: Optional[early_stopping.StopDecision] = None

    def update(self, validation: Mapping[str, Any]) -> bool:
        """Record this epoch's value; returns True to stop."""
        value = float(validation[self.cfg.metric])
        self.values.append(value)
        self.decision = early_stopping.decide(self.values, self.cfg.direction, self.cfg.patience, self.cfg.min_delta)
        if self.decision.improved and self.cfg.restore_best:
            self.best_weights = [np.array(w, copy=True) for w in self._get_weights()]
        return self.decision.stop

    def summary(self, restored: bool, epochs: int) -> dict[str, Any]:
        """The report's early-stopping section; ``epochs`` is the configured maximum."""
        d = self.decision
        best = d.best_value if d is not None and not math.isnan(d.best_value) else None
        return {"metric": self.cfg.metric, "mode": self.cfg.direction, "patience": self.cfg.patience,
                "min_delta": self.cfg.min_delta, "values": self.values, "best_epoch": d.best_epoch if d else 0,
                "best_value": best, "stopped_early": bool(d and d.stop) and len(self.values) < epochs,
                "restored_best": restored}


class EpochMonitor:
    """The hooks training uses: progress, per-step and per-epoch metrics, validation, early stopping."""

    def __init__(self, epochs: int, steps: int, world_size: int, progress: Any, step_metrics: Any,
                 log_metrics: Callable[[Mapping[str, float], int], None], learning_rate: Callable[[], float],
                 validate: Optional[Callable[[], dict[str, Any]]] = None, stopper: Optional[EarlyStopper] = None):
        self.epochs, self.steps, self.world_size = epochs, steps, world_size
        self.progress, self.step_metrics, self._log_metrics = progress, step_metrics, log_metrics
        self._learning_rate, self._validate, self.stopper = learning_rate, validate, stopper

    def start_epoch(self, epoch: int) -> None:
        self.progress.start_epoch(epoch)
        self.step_metrics.start_epoch(epoch)

    def on_step(self, epoch: int, step: int, data_seconds: float, loss_sum: Any, examples: int) -> None:
        self.progress.on_step(step, data_seconds, loss_sum, examples, self.world_size)
        global_step = (epoch - 1) * self.steps + step
        self.step_metrics.on_step(global_step, data_seconds, loss_sum, examples, self.world_size)

    def end_epoch(self, stats: EpochStats) -> bool:
        self.progress.end_epoch()
        stats.learning_rate = self._learning_rate()
        if self._validate is not None:
            stats.validation = self._validate()  # a collective: every rank evaluates its part
        log.info(epoch_line(stats, self.epochs))
        self._log_metrics(stats.metrics(), stats.epoch)
        return self.stopper.update(stats.validation) if self.stopper is not None else False


def epoch_line(stats: EpochStats, epochs: int) -> str:
    """The per-epoch log line (pure)."""
    line = (f"epoch {stats.epoch}/{epochs}: loss {stats.loss:.4f}, accuracy {stats.accuracy:.4f}, "
            f"{stats.examples} samples in {stats.seconds:.1f}s ({stats.samples_per_sec:.0f} samples/s), "
            f"lr {stats.learning_rate:.3g}")
    if stats.validation is not None:
        v = stats.validation
        line += f"; validation loss {v['loss']:.4f}, accuracy {v['accuracy']:.4f}, macro F1 {v['macro_f1']:.4f}"
        if v.get("roc_auc") is not None:
            line += f", ROC-AUC {v['roc_auc']:.4f}"
    return line
