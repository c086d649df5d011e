"""What happens around the loop's steps and epochs, one concern per hook.

:func:`hvdtrain.training.loop.fit` calls a list of hooks in order, the way Keras'
``CallbackList`` calls callbacks. Training uses, in this order (the list is built, and its
order written, in :func:`hvdtrain.training.assemble.training_hooks`):

* :class:`ProgressHook`: rank 0's progress bar or periodic lines;
* :class:`StepMetricsHook`: per-step metrics to MLflow every ``log_every_steps``;
* :class:`AverageStatistics`: the statistics each rank keeps on its own (BatchNormalization's
  moving mean and variance) averaged over ranks at each epoch end and before each mid-epoch
  checkpoint (a collective), so what is validated, kept as the best epoch and saved is the same
  on every rank;
* :class:`ValidationAndEarlyStopping`: evaluates the validation split after each
  epoch (a collective) and decides, from those all-reduced metrics, whether to
  stop; every rank gets the same answer;
* :class:`SkippedSteps` (with ``train.fp16_allreduce``): steps skipped for
  non-finite all-reduced gradients, counted and warned about;
* :class:`PruningHook` (a ``hvdtrain tune`` trial): reports the validation metric to the
  study and stops every rank together when the study prunes the trial;
* :class:`EpochReport`: the epoch's learning rate, log line and MLflow metrics
  (after validation, so they include it);
* :class:`hvdtrain.training.resume.Checkpointer`: saves when due (a collective);
* after it, when configured: :class:`hvdtrain.observe.tensorboard.TensorBoardHook` (rank 0's
  TensorBoard events, written in the background), :class:`hvdtrain.observe.monitoring.MetricsHook`
  (Prometheus metrics), :class:`hvdtrain.observe.breakdown.StepTimeBreakdown` (where
  each epoch's time went, gathered over ranks at epoch ends) and
  :class:`hvdtrain.observe.timeline.TimelineHook` (Horovod's timeline for a few steps).

Each hook is built complete: nothing is filled in after construction.
"""
from __future__ import annotations

import logging
import math
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from hvdtrain.core import tasks
from hvdtrain.core.config import EarlyStoppingConfig
from hvdtrain.model import early_stopping
from hvdtrain.observe.events import EpochStats, Hook, LoopState, StepInfo

log = logging.getLogger("hvdtrain.training.train")


class FirstStep(Hook):
    """Calls ``done`` after the first optimizer step (call) of this process: the end of its start-up."""

    def __init__(self, done: Callable[[], None]) -> None:
        self.done: Optional[Callable[[], None]] = done

    def on_step(self, info: StepInfo) -> None:
        if self.done is not None:
            done, self.done = self.done, None
            done()


class ProgressHook(Hook):
    """Drives a :class:`hvdtrain.observe.progress.Progress` display."""

    def __init__(self, progress: Any, world_size: int):
        self.progress, self.world_size = progress, world_size

    def start_epoch(self, epoch: int) -> None:
        self.progress.start_epoch(epoch)

    def on_step(self, info: StepInfo) -> None:
        self.progress.on_step(info.step, info.data_seconds, info.loss_sum, info.examples, self.world_size)

    def end_epoch(self, stats: EpochStats) -> bool:
        self.progress.end_epoch()
        return False


class StepMetricsHook(Hook):
    """Drives a :class:`hvdtrain.observe.progress.MetricsLogger` with global step numbers."""

    def __init__(self, logger: Any, world_size: int):
        self.logger, self.world_size = logger, world_size

    def start_epoch(self, epoch: int) -> None:
        self.logger.start_epoch(epoch)

    def on_step(self, info: StepInfo) -> None:
        self.logger.on_step(info.global_step, info.data_seconds, info.loss_sum, info.examples, self.world_size)


class EarlyStopper:
    """Tracks the validation metric, keeps the best epoch's weights, decides when to stop."""

    def __init__(self, cfg: EarlyStoppingConfig, get_weights: Callable[[], list[np.ndarray]]):
        self.cfg, self._get_weights = cfg, get_weights
        self.values: list[float] = []
        self.best_weights: Optional[list[np.ndarray]] = None
        self.decision: Optional[early_stopping.StopDecision] = None

    def update(self, validation: Mapping[str, Any]) -> bool:
        """Record this epoch's value; returns True to stop."""
        found = validation[self.cfg.metric]
        value = float("nan") if found is None else float(found)  # None: undefined here (an AUC with one class)
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

    def restore_best(self, model: Any, epochs_run: int) -> bool:
        """End a run on the best epoch's weights (``restore_best``) when that epoch was not the last.

        Returns whether the weights are to be restored: the same answer on every rank
        (the decision comes from all-reduced metrics); only rank 0 holds the best weights, so
        the caller broadcasts them after this.
        """
        d = self.decision
        restore = d is not None and self.cfg.restore_best and d.best_epoch != epochs_run
        if restore and self.best_weights is not None:
            model.set_weights(self.best_weights)
        return restore

    def summary(self, restored: bool, epochs: int) -> dict[str, Any]:
        """The report's early-stopping section; ``epochs`` is the configured maximum."""
        d = self.decision
        best = d.best_value if d is not None and not math.isnan(d.best_value) else None
        return {"metric": self.cfg.metric, "mode": self.cfg.direction, "patience": self.cfg.patience,
                "min_delta": self.cfg.min_delta, "values": self.values, "best_epoch": d.best_epoch if d else 0,
                "best_value": best, "stopped_early": bool(d and d.stop) and len(self.values) < epochs,
                "restored_best": restored}


class AverageStatistics(Hook):
    """Averages the rank-local statistics (``average``, a collective) at every epoch end, before validation,
    and after every other step ``checkpoint_due`` says a checkpoint follows."""

    def __init__(self, average: Callable[[], None], checkpoint_due: Callable[[LoopState], bool]):
        self._average, self._checkpoint_due = average, checkpoint_due

    def end_epoch(self, stats: EpochStats) -> bool:
        self._average()
        return False

    def after_step(self, state: LoopState) -> None:
        if not state.epoch_end and self._checkpoint_due(state):  # at an epoch end, end_epoch did it
            self._average()


class ValidationAndEarlyStopping(Hook):
    """Evaluates the validation split after each epoch (a collective: every rank evaluates its part)
    and, with a stopper, decides from those all-reduced metrics whether to stop."""

    def __init__(self, validate: Callable[[], dict[str, Any]], stopper: Optional[EarlyStopper] = None):
        self._validate, self.stopper = validate, stopper

    def end_epoch(self, stats: EpochStats) -> bool:
        stats.validation = self._validate()
        return self.stopper.update(stats.validation) if self.stopper is not None else False


class SkippedSteps(Hook):
    """Counts the epoch's skipped optimizer steps (:class:`hvdtrain.training.steps.FiniteGuard`) into its stats, and
    warns: the same count on every rank, since every rank skips the same steps."""

    def __init__(self, count: Callable[[], int]):
        self._count, self._seen = count, 0

    def end_epoch(self, stats: EpochStats) -> bool:
        total = self._count()
        stats.skipped_steps, self._seen = total - self._seen, total
        if stats.skipped_steps:
            log.warning("epoch %d: skipped %d of %d optimizer steps (%d in this run so far): non-finite gradients "
                        "after the float16 all-reduce (train.fp16_allreduce); the weights were left unchanged. "
                        "Many skips mean gradients beyond float16's range: lower the learning rate, set "
                        "train.clip_norm, or turn train.fp16_allreduce off", stats.epoch, stats.skipped_steps,
                        stats.steps, total)
        return False


class PruningHook(Hook):
    """A hyperparameter trial (``hvdtrain tune``): rank 0 reports the epoch's validation metric to the study
    (``report`` returns whether to prune; None on other ranks), and ``share`` gives rank 0's answer to every
    rank (a broadcast), so all ranks stop at the same epoch. Runs after validation, before the checkpointer:
    a pruned trial still saves its last epoch."""

    def __init__(self, metric: str, report: Optional[Callable[[int, float], bool]],
                 share: Callable[[bool, int], bool]):
        self.metric, self._report, self._share = metric, report, share
        self.pruned_at: Optional[int] = None

    def end_epoch(self, stats: EpochStats) -> bool:
        decision = False
        if self._report is not None:
            decision = bool(self._report(stats.epoch, float(stats.metrics()[self.metric])))
        if self._share(decision, stats.epoch):
            self.pruned_at = stats.epoch
            log.info("stopping after epoch %d: the study pruned this trial", stats.epoch)
        return self.pruned_at is not None


class EpochReport(Hook):
    """The epoch's learning rate, its log line and its metrics (MLflow on rank 0), once per epoch of the run.

    ``logged``: the epochs the MLflow run already has, when this try continues it. A try resumed from a
    checkpoint before an epoch's end whose metrics were logged (the process died between the two) redoes that
    end, and MLflow would keep both entries of the epoch; its redone metrics are not logged again.
    """

    def __init__(self, epochs: int, log_metrics: Callable[[Mapping[str, float], int], None],
                 learning_rate: Callable[[], float], logged: Optional[set[int]] = None):
        self.epochs, self._log_metrics, self._learning_rate = epochs, log_metrics, learning_rate
        self.logged = set(logged or ())

    def end_epoch(self, stats: EpochStats) -> bool:
        stats.learning_rate = self._learning_rate()
        log.info(epoch_line(stats, self.epochs))
        if stats.epoch not in self.logged:
            self._log_metrics(stats.metrics(), stats.epoch)
            self.logged.add(stats.epoch)
        return False


def epoch_line(stats: EpochStats, epochs: int) -> str:
    """The per-epoch log line (pure)."""
    line = (f"epoch {stats.epoch}/{epochs}: loss {stats.loss:.4f}, accuracy {stats.accuracy:.4f}, "
            f"{stats.examples} samples in {stats.seconds:.1f}s ({stats.samples_per_sec:.0f} samples/s), "
            f"lr {stats.learning_rate:.3g}")
    if stats.validation is not None:
        v = stats.validation
        if v.get("task", "multiclass") == "multiclass":
            line += f"; validation loss {v['loss']:.4f}, accuracy {v['accuracy']:.4f}, macro F1 {v['macro_f1']:.4f}"
            if v.get("roc_auc") is not None:
                line += f", ROC-AUC {v['roc_auc']:.4f}"
        else:
            shown = [name for name in tasks.HEADLINE[v["task"]] if v.get(name) is not None]
            line += "; validation " + ", ".join(f"{name} {v[name]:.4f}" for name in shown)
    return line
