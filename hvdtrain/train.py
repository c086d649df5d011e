"""Data-parallel training: the function every launcher runs on every rank.

``run(cfg)`` is called by the CLI, by ``horovodrun -np N python -m
hvdtrain.train CONFIG [key=value ...]`` and by the YARN launcher. Each rank:

1. initializes Horovod (or a single process), reads the manifest and checks it
   fits the model (``model.kind``: transformer for text, mlp for tabular)
   before any work;
2. builds its input stream (see :mod:`hvdtrain.data`), the model (optionally
   under a mixed-precision policy) and Adam with linear warm-up and
   ``train.lr_schedule`` decay (peak rate ``train.learning_rate * size``),
   then takes rank 0's initial weights and optimizer state;
3. trains ``train.epochs`` epochs of ``steps_per_epoch`` optimizer steps
   (:mod:`hvdtrain.loop`, :mod:`hvdtrain.steps`): plain ``tf.GradientTape``,
   optional accumulation over ``train.grad_accum_steps`` batches, one grouped
   all-reduce per optimizer step (optionally float16 on the wire), clipping
   after the all-reduce; per-epoch loss and accuracy are summed exactly over
   ranks. With ``train.validate_every_epoch`` or ``train.early_stopping`` the
   validation split is evaluated after every epoch; early stopping decides
   from those all-reduced metrics, so every rank stops at the same epoch, and
   (``restore_best``) every rank restores the best epoch's weights;
4. evaluates validation and test exactly (:mod:`hvdtrain.evaluation`:
   confusion matrices, loss sums and, for two classes, ROC-AUC score
   histograms, summed over ranks);
5. checks that every rank ends with the same weights (digests gathered to rank 0).

Checkpoints and resume (:mod:`hvdtrain.resume`): every ``checkpoint.every_steps``
steps and at each epoch end the ranks save together (rank 0 writes, in the
background); with ``checkpoint.resume: auto`` a restarted job continues from the
newest valid checkpoint, mid-epoch included, on the same data order and in the
same MLflow run. A watchdog (:mod:`hvdtrain.watchdog`) ends a rank that makes no
progress for ``fault.stall_timeout`` seconds, naming what it waited for.

Every rank exports live metrics for Prometheus (:mod:`hvdtrain.monitoring`)
and measures where each epoch's time goes (:mod:`hvdtrain.breakdown`);
``train.timeline`` records Horovod's timeline for a few steps
(:mod:`hvdtrain.timeline`).

Rank 0 shows progress (:mod:`hvdtrain.progress`), then writes to
``train.output``: ``eval_report.json``, ``confusion_matrix.png`` (test split),
``model.keras``, ``saved_model/`` (``model.export``, for serving),
``labels.json``, ``tokenizer.json`` (text models, for scoring) and ``result.json``, and logs the run to MLflow
(:mod:`hvdtrain.tracking`).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Callable, Iterator, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

from hvdtrain import config as config_lib
from hvdtrain import breakdown, cpus, data, distributed, evaluation, fs, hooks, plots, progress, resume
from hvdtrain import console, kerberos, steps as steps_lib, supervise, timeline as timeline_lib, tracking
from hvdtrain import manifest as manifest_lib
from hvdtrain import secrets, watchdog
from hvdtrain.config import JobConfig, TrainConfig
from hvdtrain.context import TrainContext
from hvdtrain.errors import ConfigError, DataError, EnvironmentProblem, HvdtrainError, StorageError
from hvdtrain.hooks import EarlyStopper
from hvdtrain.loop import EpochStats, LoopPlan, fit
from hvdtrain.manifest import Manifest
from hvdtrain.models import build_model
from hvdtrain.schedules import WarmupDecay, scaled_learning_rate

log = logging.getLogger("hvdtrain.train")
EVAL_SPLITS = ("validation", "test")
CONFUSION_PNG = "confusion_matrix.png"
RESULT_NAME = "result.json"  # written last into train.output: marks a folder hvdtrain may replace


# -- pure helpers -------------------------------------------------------------------

def weights_digest(arrays: Sequence[np.ndarray]) -> dict[str, Any]:
    """Exact (SHA-256 of the bytes) and rough (sum of |w|) fingerprints of a model's weights."""
    sha = hashlib.sha256()
    abs_sum = 0.0
    for array in arrays:
        array = np.ascontiguousarray(array)
        sha.update(str(array.dtype).encode() + str(array.shape).encode())
        sha.update(array.tobytes())
        abs_sum += float(np.abs(array.astype(np.float64)).sum())
    return {"sha256": sha.hexdigest(), "abs_sum": abs_sum}


def rank_agreement(digests: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Whether every rank holds identical weights, with each rank's digest."""
    return {"agree": len({d["sha256"] for d in digests}) == 1, "ranks": list(digests)}


def global_batch_size(train: TrainConfig, size: int) -> int:
    """Examples per optimizer step over all ranks."""
    return train.batch_size * train.grad_accum_steps * size


# -- model, optimizer ------------------------------------------------------------------------

def build_optimizer(train: TrainConfig, size: int, total_steps: int) -> keras.optimizers.Optimizer:
    """Adam on the warm-up/decay schedule, clipping by global norm; loss scaling under float16."""
    schedule = WarmupDecay(scaled_learning_rate(train.learning_rate, size), train.warmup_steps, total_steps,
                           train.lr_schedule, train.min_lr_ratio)
    optimizer = keras.optimizers.Adam(learning_rate=schedule, global_clipnorm=train.clip_norm)
    if train.mixed_precision == "float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


def build_state(cfg: JobConfig, shape: data.InputShape, size: int,
                total_steps: int = 0) -> tuple[keras.Model, keras.optimizers.Optimizer]:
    """Model and built optimizer, ready for broadcast_state(); ``total_steps`` is the decay horizon."""
    model = build_model(cfg.model, shape, cfg.train.mixed_precision)
    optimizer = build_optimizer(cfg.train, size, total_steps)
    optimizer.build(model.trainable_variables)
    return model, optimizer


def current_learning_rate(optimizer: keras.optimizers.Optimizer) -> float:
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))


# -- run -------------------------------------------------------------------------------------

def run(cfg: JobConfig) -> dict[str, Any]:
    """Train, evaluate and (rank 0) export and track one job; returns the result record on every rank."""
    for name, value in watchdog.horovod_env(cfg.fault.peer_timeout, cfg.fault.stall_check_warning,
                                            cfg.fault.stall_timeout, cfg.fault.checkpoint_timeout).items():
        os.environ.setdefault(name, value)  # read by hvd.init(); the user's environment wins
    if cfg.train.timeline is not None:
        for name, value in distributed.TIMELINE_ENV.items():
            os.environ.setdefault(name, value)
    rank = distributed.init()
    _configure_logging(rank)
    secrets.protect_logging(*secrets.secret_values(cfg.flat()))
    secrets.private_files()  # checkpoints, the MLflow store, outputs: the user's only
    threads = _configure_tf(rank, cfg.train)
    with watchdog.Watchdog(cfg.fault.stall_timeout, rank.rank) as dog, _kerberos(cfg, rank):
        dog.phase("reading the manifest and agreeing on the plan")
        manifest, shape, steps = plan(cfg, rank)
        hosts = sorted(set(distributed.allgather_object(rank.hostname, name="hvdtrain.hosts")))
        log.info("world size %d (%s) on %s, dataset %s (digest %s), model %s, %d optimizer steps/epoch x %d "
                 "epochs, global batch %d", rank.size, rank.backend, ",".join(hosts), manifest.root,
                 manifest.digest(), cfg.model.kind, steps, cfg.train.epochs, global_batch_size(cfg.train, rank.size))
        layout = resume.layout(cfg, rank.size, steps, manifest.digest())
        dog.phase("looking for a checkpoint to resume from", cfg.fault.checkpoint_timeout)
        looking = time.perf_counter()
        resumed = resume.find(cfg.checkpoint, rank, layout)
        restore_seconds = time.perf_counter() - looking
        with tracking.start(cfg, rank.is_chief, {**_run_tags(manifest, rank, hosts), **_tune_tags(cfg)},
                            resume_run_id=resumed.run_id if resumed else None) as tracker, \
                tempfile.TemporaryDirectory(prefix="hvdtrain-stage-") as stage_dir:
            if resumed is None or tracker.run_id != resumed.run_id:
                tracker.log_params({**tracking.flat_params(cfg), **_run_params(cfg, rank, steps, hosts)})
            restarts = supervise.restarts_from_env()
            if restarts:  # one MLflow run throughout: this try counts the restarts before it
                tracker.log_metrics({"restarts": float(len(restarts))})
                tracker.set_tags({"last_restart_cause": restarts[-1].get("cause", "")})
            ctx = TrainContext(cfg, manifest, shape, rank, steps, stage_dir, tracker, layout, dog.phase, threads)
            model, history, stopping = _train(ctx, resumed, Restored(restore_seconds, len(restarts)))
            evaluated = _evaluate_splits(ctx, model)
            dog.phase("gathering weight digests")
            report = build_report(ctx, history, evaluated, _rank_digests(model, rank), stopping)
            report["resumed_from"] = resumed.uri if resumed else None
            report["restarts"] = restarts
            if not rank.is_chief:
                return result_record(tracker.run_id, report, cfg.train.output)
            # Export, the MLflow upload and the output upload can take long on slow storage: they run under
            # fault.checkpoint_timeout, and each file restarts the clock (no "stall" after training finished).
            dog.phase("exporting the model and logging it to MLflow", cfg.fault.checkpoint_timeout)
            result = publish(ctx, model, report)
    log.info("test accuracy %.4f, macro F1 %.4f; outputs in %s", evaluated["test"]["accuracy"],
             evaluated["test"]["macro_f1"], cfg.train.output)
    return result


def _kerberos(cfg: JobConfig, rank: distributed.RankInfo) -> Any:
    """The first rank on each host keeps the host's Kerberos ticket alive from ``yarn.keytab`` (long jobs)."""
    y = cfg.yarn
    if y.principal and y.keytab and rank.local_rank == 0 and os.path.isfile(y.keytab):
        return kerberos.Renewer(y.principal, y.keytab)
    return contextlib.nullcontext()


def plan(cfg: JobConfig, rank: distributed.RankInfo) -> tuple[Manifest, data.InputShape, int]:
    """Manifest, the model's view of it and optimizer steps per epoch; fails before any training."""
    check_replaceable(cfg.train.output)  # before any training: a refused output would waste it all
    manifest = manifest_lib.read(cfg.etl.output)
    shape = data.check_manifest(manifest, cfg.model)
    if cfg.train.record_trace and data.KEY_FEATURE not in manifest.features:
        raise DataError(f"{manifest.location}: train.record_trace={cfg.train.record_trace} needs feature "
                        f"{data.KEY_FEATURE!r} (the record keys), which this dataset lacks; rerun the ETL with this "
                        "hvdtrain version or set train.record_trace=null")
    steps = data.steps_per_epoch(manifest.split("train").records, cfg.train.batch_size, rank.size,
                                 cfg.train.grad_accum_steps)
    few_shards = data.shard_warning("train", len(manifest.split("train").shards), rank.size)
    if few_shards and rank.is_chief:
        log.warning("%s", few_shards)
    if cfg.train.validates_each_epoch and manifest.split("validation").records == 0:
        raise DataError(f"{manifest.location}: the validation split is empty, but train.early_stopping / "
                        "train.validate_every_epoch evaluate it after every epoch: give etl.splits a validation "
                        "fraction and rerun the ETL, or turn both off")
    return manifest, shape, steps


def _train(ctx: TrainContext, resumed: Optional[resume.Resumed],
           restored: Optional["Restored"] = None) -> tuple[keras.Model, list[EpochStats], Optional[dict]]:
    """Build, resume or take rank 0's initial state, fit; returns the early-stopping summary (None when off)."""
    cfg, rank = ctx.cfg, ctx.rank
    model, optimizer = build_state(cfg, ctx.shape, rank.size, total_steps=ctx.steps * cfg.train.epochs)
    stopping = cfg.train.early_stopping
    stopper = EarlyStopper(stopping, model.get_weights) if stopping is not None else None
    restored = restored or Restored()
    if resumed is not None:
        applying = time.perf_counter()
        resume.apply(resumed, model, optimizer, rank, stopper)
        restored = dataclasses.replace(restored, seconds=restored.seconds + time.perf_counter() - applying)
    distributed.broadcast_state(model, optimizer)
    guard = steps_lib.FiniteGuard() if cfg.train.fp16_allreduce else None
    make_step = steps_lib.make_timed_step if cfg.monitoring.step_breakdown else steps_lib.make_optimizer_step
    reduction = steps_lib.Reduction(cfg.train.fp16_allreduce, cfg.train.allreduce)
    step_fn = make_step(model, optimizer, ctx.shape.label_feature, ctx.shape.inputs, cfg.train.grad_accum_steps,
                        reduction, guard)
    checkpointer = resume.Checkpointer(ctx, model, optimizer, stopper)
    plan = LoopPlan(cfg.train.epochs, ctx.steps, cfg.train.grad_accum_steps, cfg.train.batch_size)
    skips = [hooks.SkippedSteps(guard.count)] if guard is not None else []
    skips += _pruning(ctx)
    observed = Observed(step_fn, optimizer, checkpointer, resumed, restored)
    with _observers(ctx, observed) as observers:
        history = fit(step_fn, _train_batches(ctx, resumed.plan.first_record if resumed else 0), plan,
                      hooks=[*_hooks(ctx, model, optimizer, stopper, skips), checkpointer, *observers],
                      start=resumed.start(rank) if resumed else None, phase=ctx.phase)
        checkpointer.close()
    if stopper is None:
        return model, history, None
    restore = stopper.restore_best(model, len(history))
    if restore:  # the same decision on every rank; rank 0 holds the best weights (even after a resume)
        distributed.broadcast_state(model, optimizer)
        log.info("restored the weights of epoch %d (best validation %s)", stopper.decision.best_epoch,
                 stopping.metric)
    return model, history, stopper.summary(restored=restore, epochs=cfg.train.epochs)


def _pruning(ctx: TrainContext) -> list[hooks.Hook]:
    """A ``hvdtrain tune`` trial (``tune.trial`` set): the hook reporting to the study, on every rank."""
    tune_cfg = ctx.cfg.tune
    if tune_cfg.trial is None:
        return []
    from hvdtrain import tune

    report = tune.TrialReporter(tune_cfg).report if ctx.rank.is_chief else None
    return [hooks.PruningHook(tune.epoch_metric(tune_cfg.metric), report,
                              lambda stop, epoch: bool(distributed.broadcast_object(
                                  stop, name=f"hvdtrain.prune.{epoch}")))]


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
def _observers(ctx: TrainContext, observed: Observed) -> Iterator[list[hooks.Hook]]:
    """The hooks after the checkpointer: Prometheus metrics, the step-time breakdown, the Horovod timeline
    (each when configured); stops the metrics writer and closes the timeline when training ends."""
    cfg, rank = ctx.cfg, ctx.rank
    out: list[hooks.Hook] = []
    exporter, recorder = _metrics_exporter(ctx, observed)
    if exporter is not None:
        out.append(recorder)
    if cfg.monitoring.step_breakdown:
        out.append(breakdown.StepTimeBreakdown(rank, observed.allreduce_seconds,
                                               lambda: observed.checkpointer.seconds, ctx.tracker.log_metrics))
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


def _metrics_exporter(ctx: TrainContext, observed: Observed) -> tuple[Optional[Any], Optional[hooks.Hook]]:
    """This rank's Prometheus exporter and the hook feeding it (a collective: rank 0 checks the port and
    hands every rank the run id); (None, None) when monitoring is off."""
    from hvdtrain import monitoring

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
         "error": port_problem}, name="hvdtrain.monitoring")
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


def _train_batches(ctx: TrainContext, start_record: int) -> Any:
    """This rank's endless training batches from ``start_record`` on, traced when asked."""
    train, shape = ctx.cfg.train, ctx.shape
    trace = train.record_trace
    stream = data.TrainStream(ctx.rank.rank, ctx.rank.size, train.batch_size, train.shuffle_buffer, train.seed,
                              records_per_epoch=ctx.steps * train.batch_size * train.grad_accum_steps)
    batches = iter(data.with_threads(data.train_dataset(
        ctx.manifest, stream, features=[*shape.inputs, shape.label_feature, *([data.KEY_FEATURE] if trace else [])],
        stage_dir=ctx.stage_dir, start_record=start_record), ctx.threads))
    if trace:
        batches = data.trace_batches(batches, fs.local_path(trace), ctx.rank.rank, start_record // train.batch_size)
    return batches


def _hooks(ctx: TrainContext, model: keras.Model, optimizer: Any, stopper: Optional[EarlyStopper],
           before_report: Sequence[hooks.Hook] = ()) -> list[hooks.Hook]:
    """Progress, per-step metrics, validation and early stopping, ``before_report``, the epoch report."""
    cfg, rank = ctx.cfg, ctx.rank
    mode = progress.mode_for(cfg.train.progress, rank.is_chief)
    bar = progress.Progress(mode, cfg.train.epochs, ctx.steps, cfg.train.progress_every_steps,
                            cfg.train.progress_every_seconds)
    every = cfg.tracking.log_every_steps if rank.is_chief and ctx.tracker.active else 0
    out: list[hooks.Hook] = [hooks.ProgressHook(bar, rank.size),
                             hooks.StepMetricsHook(progress.MetricsLogger(ctx.tracker.log_metrics, every), rank.size)]
    if cfg.train.validates_each_epoch:
        eval_step = steps_lib.make_eval_step(model, ctx.shape.label_feature, ctx.shape.inputs)
        out.append(hooks.ValidationAndEarlyStopping(lambda: evaluate_split(ctx, eval_step, "validation"), stopper))
    out += before_report
    out.append(hooks.EpochReport(cfg.train.epochs, ctx.tracker.log_metrics, lambda: current_learning_rate(optimizer)))
    return out


def _rank_digests(model: keras.Model, rank: distributed.RankInfo) -> list[dict[str, Any]]:
    """Every rank's weight digest, in rank order (an allgather: all ranks call it)."""
    mine = weights_digest([keras.ops.convert_to_numpy(w) for w in model.weights])
    where = {"rank": rank.rank, "host": rank.hostname, "cross_rank": rank.cross_rank, "local_rank": rank.local_rank,
             "local_size": rank.local_size}
    return distributed.allgather_object({**where, **mine}, name="hvdtrain.digests")


def evaluate_split(ctx: TrainContext, eval_step: Any, split: str) -> dict[str, Any]:
    """One split's report from counts summed over ranks (a collective: every rank calls it)."""
    shape, rank = ctx.shape, ctx.rank
    batches = data.with_threads(data.eval_dataset(ctx.manifest, split, rank=rank.rank, size=rank.size,
                                                  batch_size=ctx.cfg.train.batch_size,
                                                  features=[*shape.inputs, shape.label_feature],
                                                  stage_dir=ctx.stage_dir), ctx.threads)
    local = evaluation.count_split(eval_step, batches, shape.label_feature, shape.num_classes,
                                   on_batch=lambda: ctx.phase(f"evaluating the {split} split"))
    ctx.phase(f"all-reducing the {split} split's counts")
    counts = evaluation.allreduce_counts(local, split)
    expected = ctx.manifest.split(split).records
    if counts.records != expected:
        log.warning("%s: evaluated %d records but the manifest lists %d", split, counts.records, expected)
    return evaluation.split_report(counts, ctx.manifest.labels, expected)


def _evaluate_splits(ctx: TrainContext, model: keras.Model) -> dict[str, dict[str, Any]]:
    eval_step = steps_lib.make_eval_step(model, ctx.shape.label_feature, ctx.shape.inputs)
    return {split: evaluate_split(ctx, eval_step, split) for split in EVAL_SPLITS}


def build_report(ctx: TrainContext, history: list[EpochStats], evaluated: dict[str, Any],
                 digests: list[dict[str, Any]], stopping: Optional[dict[str, Any]] = None) -> dict:
    """The eval_report.json document (pure)."""
    cfg, manifest = ctx.cfg, ctx.manifest
    return {
        "job": cfg.name,
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "dataset": {"location": manifest.root, "manifest_digest": manifest.digest(),
                    "records": {name: split.records for name, split in manifest.splits.items()}},
        "labels": manifest.labels,
        "model": {"kind": cfg.model.kind, "mixed_precision": cfg.train.mixed_precision},
        "training": training_summary(cfg.train, ctx.rank, ctx.steps, history),
        "early_stopping": stopping,
        "evaluation": evaluated,
        "rank_digest": rank_agreement(digests),
    }


def training_summary(train: TrainConfig, rank: distributed.RankInfo, steps: int,
                     history: list[EpochStats]) -> dict[str, Any]:
    """The report's training section (pure)."""
    seconds = sum(h.seconds for h in history)
    examples = sum(h.examples for h in history)
    return {
        "world_size": rank.size, "backend": rank.backend, "epochs": len(history), "steps_per_epoch": steps,
        "steps": sum(h.steps for h in history), "grad_accum_steps": train.grad_accum_steps,
        "batch_size_per_rank": train.batch_size, "global_batch_size": global_batch_size(train, rank.size),
        "learning_rate": scaled_learning_rate(train.learning_rate, rank.size),
        "warmup_steps": train.warmup_steps, "lr_schedule": train.lr_schedule, "min_lr_ratio": train.min_lr_ratio,
        "decay_steps": steps * train.epochs, "clip_norm": train.clip_norm, "fp16_allreduce": train.fp16_allreduce,
        "allreduce": train.allreduce,
        "skipped_steps": sum(h.skipped_steps for h in history),
        "seconds": seconds, "samples_per_sec": examples / seconds if seconds > 0 else 0.0,
        "history": [h.to_dict() for h in history],
    }


EXPORTS = {"keras": "model.keras", "saved_model": "saved_model", "labels": "labels.json", "tokenizer": "tokenizer.json",
           "confusion_matrix": CONFUSION_PNG}


def result_record(run_id: Optional[str], report: dict[str, Any], output: str, written: Sequence[str] = (),
                  model_uri: Optional[str] = None, tracking_uri: Optional[str] = None) -> dict[str, Any]:
    """The result.json document (pure); ``exports`` lists only the exports in ``written`` (names in the output)."""
    test = report["evaluation"]["test"]
    return {
        "run_id": run_id,
        "tracking_uri": tracking_uri,
        "mlflow_model_uri": model_uri,
        "test_accuracy": test["accuracy"],
        "test_macro_f1": test["macro_f1"],
        "test_roc_auc": test.get("roc_auc"),
        "validation_accuracy": report["evaluation"]["validation"]["accuracy"],
        "ranks_agree": report["rank_digest"]["agree"],
        "world_size": report["training"]["world_size"],
        "epochs_run": report["training"]["epochs"],
        "skipped_steps": report["training"].get("skipped_steps", 0),
        "restarts": len(report.get("restarts", [])),
        "report": fs.join(output, "eval_report.json"),
        "exports": {key: fs.join(output, name) for key, name in EXPORTS.items() if name in written},
    }


# -- rank 0: files and tracking ----------------------------------------------------------------

def publish(ctx: TrainContext, model: keras.Model, report: dict[str, Any]) -> dict[str, Any]:
    """Write report, chart, exports and result to ``train.output`` and log them to MLflow."""
    output, tracker = ctx.cfg.train.output, ctx.tracker
    with tempfile.TemporaryDirectory(prefix="hvdtrain-out-") as local:
        _dump_json(os.path.join(local, "eval_report.json"), report)
        _dump_json(os.path.join(local, "labels.json"), labels_document(ctx.manifest, ctx.shape))
        _copy_tokenizer(ctx.manifest, local)
        png = _confusion_png(report, local)
        model.save(os.path.join(local, "model.keras"))
        model.export(os.path.join(local, "saved_model"), verbose=False)
        recorded = os.path.join(ctx.stage_dir, timeline_lib.FILENAME)  # train.timeline's capture, if any
        if os.path.isfile(recorded):
            shutil.copy(recorded, local)
        tracker.progress = lambda what: ctx.phase(f"MLflow: {what}", ctx.cfg.fault.checkpoint_timeout)
        model_uri = _log_run_end(ctx, model, report, local, png)
        tracker.flush()  # ride out an outage before saying what MLflow has
        result = {**result_record(tracker.run_id, report, output, os.listdir(local), model_uri=model_uri,
                                  tracking_uri=secrets.redact_url(tracker.tracking_uri)), "tracking": tracker.summary()}
        _dump_json(os.path.join(local, RESULT_NAME), result)
        upload_dir(local, output, lambda what: ctx.phase(what, ctx.cfg.fault.checkpoint_timeout))
    return result


def _confusion_png(report: dict[str, Any], folder: str) -> Optional[str]:
    """The test split's confusion matrix as a PNG; a charting failure only warns."""
    test = report["evaluation"]["test"]
    title = f"{report['job']}: test split, accuracy {test['accuracy']:.4f}"
    try:
        return plots.confusion_matrix_png(np.array(test["confusion_matrix"]), report["labels"],
                                          os.path.join(folder, CONFUSION_PNG), title)
    except Exception as exc:  # noqa: BLE001 - a chart is not worth failing a finished training for
        log.warning("could not draw %s (%s: %s); the report has the same numbers", CONFUSION_PNG,
                    type(exc).__name__, exc)
        return None


def labels_document(manifest: Manifest, shape: data.InputShape) -> dict[str, Any]:
    """What a server needs beside the model: label names and how inputs were made."""
    return {"labels": manifest.labels, "label_feature": shape.label_feature, "model_kind": shape.kind,
            "max_length": shape.max_length, "inputs": list(shape.inputs),
            "input_specs": {k: {"dtype": d, "shape": s} for k, (d, s) in shape.input_specs().items()},
            "outputs": "logits", "preprocessing": manifest.preprocessing,
            "vocab": manifest.vocab, "manifest_digest": manifest.digest(), "dataset": manifest.root}


def _copy_tokenizer(manifest: Manifest, local: str) -> None:
    """The dataset's tokenizer beside the model, so scoring needs only the model (the dataset may be rewritten)."""
    name = manifest.vocab.get("tokenizer")
    if name:
        with open(os.path.join(local, "tokenizer.json"), "wb") as fh:
            fh.write(fs.read_bytes(fs.join(manifest.root, name)))


def final_metrics(report: dict[str, Any]) -> dict[str, float]:
    """End-of-run MLflow metrics from the report (pure)."""
    out = {"train_samples_per_sec": report["training"]["samples_per_sec"]}
    for split, result in report["evaluation"].items():
        out.update(evaluation.scalar_metrics(result, split))
    return out


def _log_run_end(ctx: TrainContext, model: keras.Model, report: dict[str, Any], local: str,
                 png: Optional[str]) -> Optional[str]:
    tracker = ctx.tracker
    tracker.log_metrics(final_metrics(report))
    tags: dict[str, Any] = {"ranks_agree": report["rank_digest"]["agree"]}
    if report["early_stopping"] is not None:
        tags.update(best_epoch=report["early_stopping"]["best_epoch"],
                    stopped_early=report["early_stopping"]["stopped_early"])
    tracker.set_tags(tags)
    tracker.log_text(ctx.cfg.to_yaml(redacted=True), "config.yaml")
    tracker.log_text(ctx.manifest.to_json(), "manifest.json")
    tracker.log_artifact(os.path.join(local, "eval_report.json"))
    tracker.log_artifact(os.path.join(local, "labels.json"))
    if os.path.exists(os.path.join(local, "tokenizer.json")):
        tracker.log_artifact(os.path.join(local, "tokenizer.json"))
    if png is not None:
        tracker.log_artifact(png)
    tracker.log_artifact(os.path.join(local, "saved_model"), "serving")
    return tracker.log_keras_model(model, ctx.shape.input_specs(), ctx.shape.num_classes,
                                   ctx.cfg.tracking.registered_model_name)


def upload_dir(local: str, output: str, progress: Callable[[str], None] = lambda what: None) -> None:
    """Replace ``output``'s files with a local folder's, leaving the previous outputs whole on failure.

    Files go to a sibling folder first (``progress`` hears each one, so a slow
    storage restarts the stall clock per file, and the log shows where it is);
    only when every file is there does that folder take ``output``'s place. A
    failed upload names the file, and ``output`` is as it was.
    """
    files = sorted(os.path.relpath(os.path.join(root, name), local).replace(os.sep, "/")
                   for root, _, names in os.walk(local) for name in names)
    parent, base = output.rstrip("/").rsplit("/", 1) if "/" in output.rstrip("/") else (".", output)
    incoming = fs.join(parent, f".{base}.incoming-{os.getpid()}")
    if fs.exists(incoming):
        fs.delete(incoming)
    for i, rel in enumerate(files, start=1):
        what = f"uploading {rel} ({i}/{len(files)}) to {output}"
        progress(what)
        log.info(what)
        try:
            fs.copy_from_local(os.path.join(local, *rel.split("/")), fs.join(incoming, *rel.split("/")))
        except Exception as exc:  # noqa: BLE001 - one line naming the file; the old outputs stay
            _discard(incoming)
            raise StorageError(f"uploading {rel} to {output} failed ({type(exc).__name__}: {exc}); the previous "
                               f"outputs in {output} are unchanged: fix the storage and rerun") from exc
    progress(f"replacing {output} with the new outputs")
    _swap_in(incoming, output)


def check_replaceable(output: str) -> None:
    """``train.output`` is replaced whole: only a missing or empty folder, or a previous hvdtrain output
    (it holds ``result.json``), may be; anything else raises DataError before it is touched."""
    names = fs.listdir(output) if fs.exists(output) else []
    if names and RESULT_NAME not in names:
        raise DataError(f"train.output {output} holds files that are not a previous hvdtrain output "
                        f"({', '.join(sorted(names)[:5])}; no {RESULT_NAME}): hvdtrain replaces the whole folder, "
                        "so choose a new or empty folder for train.output")


def _swap_in(incoming: str, output: str) -> None:
    """``incoming`` becomes ``output``; a previous ``output`` is moved aside first, then deleted."""
    previous = f"{incoming}.previous"
    check_replaceable(output)  # again: something may have been put there while training ran
    if fs.exists(output):
        fs.move(output, previous)
    fs.move(incoming, output)
    _discard(previous)


def _discard(uri: str) -> None:
    try:
        if fs.exists(uri):
            fs.delete(uri)
    except Exception as exc:  # noqa: BLE001 - a leftover folder is not worth failing over
        log.warning("could not delete %s (%s); delete it by hand", uri, exc)


def _dump_json(path: str, doc: Any) -> None:
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=2, sort_keys=False)
        fh.write("\n")


def _run_tags(manifest: Manifest, rank: distributed.RankInfo, hosts: Sequence[str]) -> dict[str, str]:
    tags = {"manifest_digest": manifest.digest(), "dataset": manifest.root, "horovod_size": str(rank.size),
            "horovod_hosts": ",".join(hosts), "distributed_backend": rank.backend}
    commit = tracking.git_commit(os.path.dirname(os.path.abspath(__file__)))
    if commit:
        tags["git_commit"] = commit
    return tags


def _tune_tags(cfg: JobConfig) -> dict[str, str]:
    """A ``hvdtrain tune`` trial's run sits under the study's run (MLflow's parent/child tag)."""
    tags = {}
    if cfg.tune.trial is not None:
        tags.update({"hvdtrain.tune.study": cfg.tune.study, "tune_trial": str(cfg.tune.trial)})
    if cfg.tune.parent_run_id:
        tags["mlflow.parentRunId"] = cfg.tune.parent_run_id
    return tags


def _run_params(cfg: JobConfig, rank: distributed.RankInfo, steps: int, hosts: Sequence[str]) -> dict[str, Any]:
    return {"horovod.size": rank.size, "horovod.hosts": ",".join(hosts), "steps_per_epoch": steps,
            "global_batch_size": global_batch_size(cfg.train, rank.size),
            "scaled_learning_rate": scaled_learning_rate(cfg.train.learning_rate, rank.size),
            "decay_steps": steps * cfg.train.epochs}


def _configure_logging(rank: distributed.RankInfo) -> None:
    """Plain lines from rank 0; other ranks report warnings and errors only."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format=f"%(asctime)s [rank {rank.rank}] %(levelname)s %(message)s",
                            datefmt="%H:%M:%S")
    logging.getLogger("hvdtrain").setLevel(logging.INFO if rank.is_chief else logging.WARNING)
    logging.getLogger("tensorflow").setLevel(logging.WARNING)  # e.g. "Assets written to" on export


def _configure_tf(rank: distributed.RankInfo, train: TrainConfig) -> int:
    """Size TensorFlow's thread pools from this rank's CPU budget, seed each rank differently (weights come
    from rank 0), and turn on op determinism when asked; returns the budget (tf.data's private pool too)."""
    found = cpus.detect()
    threads = cpus.per_rank(found, rank.local_size)
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(min(threads, 2))
    except RuntimeError:  # TensorFlow already started (run() called twice in one process)
        pass
    log.info("CPU budget %d for this rank (%s: %d%s); TensorFlow intra-op threads %d, inter-op %d, tf.data "
             "private pool %d", threads, found.source, found.cpus,
             f" shared by {rank.local_size} ranks on this host" if found.shared and rank.local_size > 1 else "",
             tf.config.threading.get_intra_op_parallelism_threads(),
             tf.config.threading.get_inter_op_parallelism_threads(), threads)
    keras.utils.set_random_seed(train.seed + rank.rank)
    if train.deterministic:
        tf.config.experimental.enable_op_determinism()
    return threads


# -- command line ---------------------------------------------------------------------------

def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m hvdtrain.train CONFIG [key=value ...]`` (also under horovodrun)."""
    parser = argparse.ArgumentParser(prog="python -m hvdtrain.train", description=__doc__.split("\n")[0])
    parser.add_argument("config", help="job config YAML")
    parser.add_argument("overrides", nargs="*", help="section.key=value, e.g. train.epochs=2")
    args = parser.parse_intermixed_args(argv)
    try:
        result = run(config_lib.load(args.config, args.overrides))
    except HvdtrainError as exc:
        return console.report_error(exc, "hvdtrain")
    if distributed.info().is_chief:
        if console.launcher_mode():  # the hvdtrain launcher prints the summary (or the JSON with --json)
            console.emit("result", result=result)
        else:
            print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
