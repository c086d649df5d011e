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
  every rank;
* ``after_step(state)`` after every optimizer step that does not end an
  epoch, and after ``end_epoch`` (``state.epoch_end``): checkpoints. It may
  run collectives; whether it does must depend on the step number only.

A resumed run passes ``start`` (:class:`Start`): the optimizer steps already
done, the finished epochs' stats, and the interrupted epoch's sums so far
(rank-summed, carried by rank 0 only, so the epoch's all-reduce stays exact).

:class:`EpochMonitor` is the hooks object training uses.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field
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

    def after_step(self, state: "LoopState") -> None: ...


@dataclass
class Start:
    """Where a (resumed) run starts: 0 steps, no history, nothing carried for a fresh one."""

    step: int = 0  # optimizer steps already done, over all epochs
    history: list[EpochStats] = field(default_factory=list)
    carried: Optional[np.ndarray] = None  # [loss sum, correct, examples] of the interrupted epoch, rank-summed
    carried_seconds: float = 0.0
    stopped: bool = False  # the run had already stopped (early stopping) when it was saved
    step_offset: int = 0  # step numbers are ``step_offset`` + steps of this layout (see resume.check_layout)


@dataclass
class LoopState:
    """What a checkpoint needs from the loop after a step."""

    step: int  # global optimizer step just finished (1-based)
    epoch: int
    epoch_end: bool
    partial: Callable[[], np.ndarray]  # this rank's [loss sum, correct, examples] of the epoch so far (a device
    # sync: call it only when saving); zeros at an epoch end
    epoch_seconds: float
    history: list[EpochStats]
    stopped: bool = False


def take_batches(batches: Iterator[Any], count: int,
                 clock: Callable[[], float] = time.perf_counter) -> tuple[list[Any], float]:
    """The next ``count`` batches, and the seconds spent waiting for them."""
    start = clock()
    taken = [next(batches) for _ in range(count)]
    return taken, clock() - start


def fit(step_fn: Callable[[Sequence[Any]], tuple[Any, Any]], batches: Iterator[Any], *, epochs: int, steps: int,
        accum_steps: int, batch_size: int, hooks: LoopHooks, start: Optional[Start] = None,
        phase: Callable[[str], None] = lambda what: None) -> list[EpochStats]:
    """Run up to ``epochs`` x ``steps`` optimizer steps; stops early when ``hooks.end_epoch`` says so.

    ``phase`` hears what the loop is about to wait for (the stall watchdog's message).
    Returns every epoch's stats, those of a resumed run's earlier epochs included.
    """
    start = start or Start()
    history = list(start.history)
    if start.stopped:
        return history
    examples = accum_steps * batch_size  # this rank's examples per optimizer step
    offset = start.step_offset
    first_epoch, done_in_epoch = divmod(start.step - offset, steps)
    for epoch in range(first_epoch + 1, epochs + 1):
        resumed = epoch == first_epoch + 1 and done_in_epoch > 0
        carried = start.carried if resumed and start.carried is not None else np.zeros(3)
        hooks.start_epoch(epoch)
        begin = time.perf_counter() - (start.carried_seconds if resumed else 0.0)
        loss_sums, corrects = [], []

        def partial() -> np.ndarray:
            done = len(loss_sums) * examples
            return carried + np.array([sum(float(x) for x in loss_sums), sum(float(x) for x in corrects), done],
                                      np.float64)

        for step in range(done_in_epoch + 1 if resumed else 1, steps + 1):
            global_step = offset + (epoch - 1) * steps + step
            phase(f"waiting for input batches of step {global_step}")
            micro, waited = take_batches(batches, accum_steps)
            phase(f"computing and all-reducing step {global_step}")
            loss_sum, correct = step_fn(micro)
            loss_sums.append(loss_sum)
            corrects.append(correct)
            hooks.on_step(epoch, step, waited, loss_sum, examples)
            if step < steps:
                hooks.after_step(LoopState(global_step, epoch, False, partial, time.perf_counter() - begin, history))
        phase(f"all-reducing the metrics of epoch {epoch}")
        totals = distributed.allreduce_sum(partial(), name=f"hvdtrain.epoch{epoch}")
        stats = epoch_stats(epoch, steps, totals, time.perf_counter() - begin)
        history.append(stats)
        phase(f"ending epoch {epoch} (validation, early stopping)")
        stop = hooks.end_epoch(stats)
        hooks.after_step(LoopState(offset + epoch * steps, epoch, True, lambda: np.zeros(3), 0.0, history, stopped=stop))
        if stop:
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

    def restore(self, values: Sequence[float], best_weights: Optional[list[np.ndarray]]) -> None:
        """Continue from a checkpoint: the values so far and (rank 0) the best epoch's weights."""
        self.values = [float(v) for v in values]
        if self.values:
            self.decision = early_stopping.decide(self.values, self.cfg.direction, self.cfg.patience,
                                                  self.cfg.min_delta)
        if best_weights is not None:
            self.best_weights = [np.array(w, copy=True) for w in best_weights]

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
        self.checkpointer: Any = None  # resume.Checkpointer, set once the MLflow run id is known
        self.step_offset = 0  # a resumed run's (see Start)

    def start_epoch(self, epoch: int) -> None:
        self.progress.start_epoch(epoch)
        self.step_metrics.start_epoch(epoch)

    def on_step(self, epoch: int, step: int, data_seconds: float, loss_sum: Any, examples: int) -> None:
        self.progress.on_step(step, data_seconds, loss_sum, examples, self.world_size)
        global_step = self.step_offset + (epoch - 1) * self.steps + step
        self.step_metrics.on_step(global_step, data_seconds, loss_sum, examples, self.world_size)

    def after_step(self, state: Any) -> None:
        if self.checkpointer is not None:
            self.checkpointer.after_step(state)

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
