"""The hooks of a training run, assembled in the one place their order is written.

:func:`training_hooks` yields the list :func:`hvdtrain.training.loop.fit`
calls, in order (see :mod:`hvdtrain.training.hooks` for what each does).
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import os
from typing import Any, Iterator, Mapping, Optional

import keras

from hvdtrain import tune
from hvdtrain.core import config as config_lib
from hvdtrain.core.errors import ConfigError, EnvironmentProblem
from hvdtrain.observe import breakdown, monitoring, progress, tensorboard
from hvdtrain.observe import timeline as timeline_lib
from hvdtrain.observe.events import EPOCH_METRIC, Hook
from hvdtrain.runtime import distributed, startup
from hvdtrain.training import hooks, resume
from hvdtrain.training import steps as steps_lib
from hvdtrain.training.context import TrainContext
from hvdtrain.training.evaluate import evaluate_split, make_eval_step
from hvdtrain.training.hooks import EarlyStopper
from hvdtrain.training.state import average_statistics, current_learning_rate

log = logging.getLogger("hvdtrain.training.train")


@dataclasses.dataclass(frozen=True)
class Restored:
    """How this try started: seconds spent finding, reading and applying a checkpoint; restarts before it."""

    seconds: float = 0.0
    restarts: int = 0


@dataclasses.dataclass(frozen=True)
class Observed:
    """What the monitoring hooks read from the training run."""

    step_fn: Any  # a steps.TimedStep exposes allreduce_seconds
    optimizer: Any
    checkpointer: resume.Checkpointer
    resumed: Optional[resume.Resumed]
    restored: Restored

    def allreduce_seconds(self) -> Optional[float]:
        return getattr(self.step_fn, "allreduce_seconds", None)


@contextlib.contextmanager
def training_hooks(ctx: TrainContext, model: keras.Model, stopper: Optional[EarlyStopper],
                   guard: Optional[steps_lib.FiniteGuard], observed: Observed) -> Iterator[list[Hook]]:
    """Every hook of the run, in the order the loop calls them; ends the observers when training ends.

    The end of start-up (the first step, :mod:`hvdtrain.runtime.startup`); progress and per-step metrics; the ranks'
    statistics averaged (before validation and checkpoints read them); validation and early stopping; skipped
    steps (float16 all-reduce); the study's pruning (a tune trial); the epoch report (after validation, so it
    includes it); the checkpointer (a pruned or stopped run still saves its last epoch); then the observers.
    """
    with _observers(ctx, observed) as observers:
        yield [hooks.FirstStep(lambda: startup.first_step_done(ctx.rank.is_chief)), *_progress(ctx),
               _statistics(model, observed.checkpointer), *_validation(ctx, model, stopper),
               *([hooks.SkippedSteps(guard.count)] if guard is not None else []), *_pruning(ctx),
               _epoch_report(ctx, observed), observed.checkpointer, *observers]


def _progress(ctx: TrainContext) -> list[Hook]:
    """Rank 0's progress display and its per-step MLflow metrics."""
    cfg, rank = ctx.cfg, ctx.rank
    mode = progress.mode_for(cfg.train.progress, rank.is_chief)
    bar = progress.Progress(mode, cfg.train.epoch_count, ctx.steps, cfg.train.progress_every_steps,
                            cfg.train.progress_every_seconds)
    every = cfg.tracking.log_every_steps if rank.is_chief and ctx.tracker.active else 0
    return [hooks.ProgressHook(bar, rank.size),
            hooks.StepMetricsHook(progress.MetricsLogger(ctx.tracker.log_metrics, every), rank.size)]


def _statistics(model: keras.Model, checkpointer: resume.Checkpointer) -> Hook:
    """BatchNormalization's moving statistics (any rank-local float state) averaged over ranks when read."""
    return hooks.AverageStatistics(lambda: average_statistics(model), checkpointer.due)


def _validation(ctx: TrainContext, model: keras.Model, stopper: Optional[EarlyStopper]) -> list[Hook]:
    """Validation (and early stopping) after each epoch, when configured."""
    if not ctx.cfg.train.validates_each_epoch:
        return []
    eval_step = make_eval_step(ctx, model)
    return [hooks.ValidationAndEarlyStopping(lambda: evaluate_split(ctx, eval_step, "validation"), stopper)]


def _epoch_report(ctx: TrainContext, observed: Observed) -> Hook:
    """The per-epoch report; a resumed try skips the epochs its MLflow run already has (:class:`hooks.EpochReport`)."""
    logged = ctx.tracker.logged_steps(EPOCH_METRIC) if observed.resumed is not None else set()
    return hooks.EpochReport(ctx.cfg.train.epoch_count, ctx.tracker.log_metrics,
                             lambda: current_learning_rate(observed.optimizer), logged)


def _pruning(ctx: TrainContext) -> list[Hook]:
    """A ``hvdtrain tune`` trial (``tune.trial`` set): the hook reporting to the study, on every rank."""
    tune_cfg = ctx.cfg.tune
    if tune_cfg.trial is None:
        return []
    report = tune.TrialReporter(tune_cfg, ctx.cfg.train.epoch_count).report if ctx.rank.is_chief else None
    return [hooks.PruningHook(tune.epoch_metric(tune_cfg.metric), report,
                              lambda stop, epoch: bool(distributed.broadcast_object(
                                  stop, name=f"hvdtrain.prune.{epoch}")))]


@contextlib.contextmanager
def _observers(ctx: TrainContext, observed: Observed) -> Iterator[list[Hook]]:
    """The hooks after the checkpointer: TensorBoard (rank 0), Prometheus metrics, the step-time breakdown, the
    Horovod timeline (each when configured); stops the writers and closes the timeline when training ends."""
    cfg, rank = ctx.cfg, ctx.rank
    board = _tensorboard(ctx, observed)
    out: list[Hook] = [board] if board is not None else []
    exporter, recorder = _metrics_exporter(ctx, observed)
    if exporter is not None and recorder is not None:  # both or neither
        out.append(recorder)
    if cfg.monitoring.step_breakdown:
        def log_metrics(metrics: Mapping[str, float], step: Optional[int] = None) -> None:
            ctx.tracker.log_metrics(metrics, step)
            if board is not None:
                board.log_metrics(metrics)

        out.append(breakdown.StepTimeBreakdown(rank, observed.allreduce_seconds,
                                               lambda: observed.checkpointer.seconds, log_metrics))
    recording = None
    if cfg.train.timeline is not None:
        recording = timeline_lib.TimelineHook(  # published with the outputs (publish), attached to MLflow here
            cfg.train.timeline, os.path.join(ctx.stage_dir, timeline_lib.FILENAME),
            observed.resumed.step if observed.resumed else 0,
            lambda path: ctx.tracker.log_artifact(path, "timeline"), rank.is_chief)
        out.append(recording)
    try:
        with exporter if exporter is not None else contextlib.nullcontext():
            yield out
    finally:
        if recording is not None:
            recording.close()
        if board is not None:
            board.close()


def _tensorboard(ctx: TrainContext, observed: Observed) -> Optional[tensorboard.TensorBoardHook]:
    """Rank 0's TensorBoard hook (``tensorboard.enabled``), with an MLflow tag saying where the events are."""
    cfg = ctx.cfg
    if not (cfg.tensorboard.enabled and ctx.rank.is_chief):
        return None
    optimizer, checkpointer = observed.optimizer, observed.checkpointer
    resume_step = observed.resumed.step if observed.resumed else 0
    board = tensorboard.start_hook(
        os.path.join(ctx.stage_dir, tensorboard.FOLDER), cfg.checkpoint.dir, cfg.tensorboard.every_steps,
        ctx.rank.size, resume_step, lambda: current_learning_rate(optimizer),
        lambda: checkpointer.last_save.step if checkpointer.last_save else None)
    if board is not None and cfg.tensorboard.graph and resume_step == 0:
        board.add_graph(lambda: tensorboard.model_graph(checkpointer.model, ctx.shape.input_specs()))
    if board is not None:
        ctx.tracker.set_tags({"tensorboard": tensorboard.output_dir(cfg.train.output),
                              "tensorboard_command": f"hvdtrain tensorboard {cfg.train.output}",
                              "tensorboard_live": tensorboard.live_dir(cfg.checkpoint.dir)})
    return board


def _metrics_exporter(ctx: TrainContext, observed: Observed) -> tuple[Optional[Any], Optional[Hook]]:
    """This rank's Prometheus exporter and the hook feeding it (a collective: rank 0 checks the port and
    hands every rank the run id); (None, None) when monitoring is off."""
    mon, rank = ctx.cfg.monitoring, ctx.rank
    if not mon.enabled:
        return None, None
    if config_lib.has_scheme(mon.textfile_dir):
        raise ConfigError("monitoring.textfile_dir", mon.textfile_dir, "must be a local folder (node_exporter's "
                          "textfile collector reads local files); set it, since workdir is remote")
    port_problem = (monitoring.check_port_free(mon.port, mon.addr) if rank.is_chief and mon.port is not None
                    else None)
    shared = distributed.broadcast_object(
        {"run_id": ctx.run_id or f"untracked-{datetime.datetime.now(datetime.timezone.utc):%Y%m%dT%H%M%SZ}",
         "error": port_problem}, name="hvdtrain.observe.monitoring")
    if shared["error"]:
        raise EnvironmentProblem(shared["error"])
    missing = monitoring.available()
    if missing:  # monitoring never stops training
        log.warning("%s; training goes on without Prometheus metrics on this rank", missing)
        return None, None
    metrics = monitoring.Metrics(mon.job, shared["run_id"], rank.rank, rank.hostname)
    optimizer = observed.optimizer
    metrics.read_at_collect("hvdtrain_learning_rate", lambda: current_learning_rate(optimizer))
    metrics["hvdtrain_stall_timeout_seconds"].set(ctx.cfg.fault.stall_timeout)
    monitoring.restored(metrics, observed.restored.seconds if observed.resumed else 0.0,
                        observed.resumed.nbytes if observed.resumed else 0, observed.restored.restarts)
    hook = monitoring.MetricsHook(metrics, observed.allreduce_seconds, lambda: observed.checkpointer.last_save,
                                  lambda: int(optimizer.iterations.numpy()))
    exporter = monitoring.Exporter(metrics, monitoring.textfile_path(mon.textfile_dir, mon.job, rank.rank),
                                   mon.interval_seconds, port=mon.port if rank.is_chief else None,
                                   before_write=hook.refresh, addr=mon.addr)
    return exporter, hook
