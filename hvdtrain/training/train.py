"""Data-parallel training: the function every launcher runs on every rank.

``run(cfg)`` is called by the CLI, by ``horovodrun -np N python -m
hvdtrain.training.train CONFIG [key=value ...]`` and by the YARN launcher. Each rank:

1. initializes Horovod (or a single process), reads the manifest and checks it
   fits the model (``model.kind``: transformer for text, mlp for tabular)
   before any work;
2. builds its input stream (see :mod:`hvdtrain.data`), the model (optionally
   under a mixed-precision policy) and Adam with linear warm-up and
   ``train.lr_schedule`` decay (peak rate ``train.learning_rate * size``),
   then takes rank 0's initial weights and optimizer state;
3. trains ``train.epochs`` epochs (``auto``: by the train split's size) of ``steps_per_epoch`` optimizer steps
   (:mod:`hvdtrain.training.loop`, :mod:`hvdtrain.training.steps`): plain ``tf.GradientTape``,
   optional accumulation over ``train.grad_accum_steps`` batches, one grouped
   all-reduce per optimizer step (optionally float16 on the wire), clipping
   after the all-reduce; per-epoch loss and accuracy are summed exactly over
   ranks. With ``train.validate_every_epoch`` or ``train.early_stopping`` the
   validation split is evaluated after every epoch; early stopping decides
   from those all-reduced metrics, so every rank stops at the same epoch, and
   (``restore_best``) every rank restores the best epoch's weights;
4. evaluates validation and test exactly (:mod:`hvdtrain.model.evaluation`:
   confusion matrices, loss sums and, for two classes, ROC-AUC score
   histograms, summed over ranks);
5. checks that every rank ends with the same weights (digests gathered to rank 0); state each rank updates
   on its own (BatchNormalization's moving statistics) is averaged over ranks before every evaluation,
   checkpoint and export (:func:`hvdtrain.training.state.average_statistics`).

Checkpoints and resume (:mod:`hvdtrain.training.resume`): every ``checkpoint.every_steps``
steps and at each epoch end the ranks save together (rank 0 writes, in the
background); with ``checkpoint.resume: auto`` a restarted job continues from the
newest valid checkpoint, mid-epoch included, on the same data order and in the
same MLflow run. A watchdog (:mod:`hvdtrain.runtime.watchdog`) ends a rank that makes no
progress for ``fault.stall_timeout`` seconds, naming what it waited for.

Every rank exports live metrics for Prometheus (:mod:`hvdtrain.observe.monitoring`)
and measures where each epoch's time goes (:mod:`hvdtrain.observe.breakdown`);
``train.timeline`` records Horovod's timeline for a few steps
(:mod:`hvdtrain.observe.timeline`).

Rank 0 shows progress (:mod:`hvdtrain.observe.progress`), then writes to
``train.output``: ``eval_report.json``, ``confusion_matrix.png`` or ``residuals.png`` (test split),
``model.keras``, ``saved_model/`` (``model.export``, for serving),
``labels.json``, ``tokenizer.json`` (text models, for scoring) and ``result.json``, and logs the run to MLflow
(:mod:`hvdtrain.observe.tracking`).
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import tempfile
import time
from typing import Any, Optional, Sequence

import hvdtrain.model.lean_keras  # noqa: F401  # first: Keras without its plotting and scikit-learn extras
import keras

from hvdtrain.core import config as config_lib
from hvdtrain.observe import console, tracking
from hvdtrain import data
from hvdtrain.runtime import distributed, startup, supervise
from hvdtrain.hadoop import fs
from hvdtrain.model import heads
from hvdtrain.training import leases, resume
from hvdtrain.core import secrets
from hvdtrain.data import manifest as manifest_lib
from hvdtrain.core import tasks as tasks_lib
from hvdtrain.core.config import JobConfig, TrainConfig, TuneConfig
from hvdtrain.core.errors import DataError, HvdtrainError
from hvdtrain.data.manifest import Manifest
from hvdtrain.data.plan import with_epochs
from hvdtrain.model.schedules import scaled_learning_rate
from hvdtrain.training import runtime
from hvdtrain.training import steps as steps_lib
from hvdtrain.training.assemble import Observed, Restored, training_hooks
from hvdtrain.training.context import TrainContext
from hvdtrain.training.evaluate import evaluate_splits, task_head
from hvdtrain.observe.events import EpochStats, LoopPlan
from hvdtrain.training.hooks import EarlyStopper
from hvdtrain.training.loop import fit
from hvdtrain.training.publish import check_replaceable, publish, record_claim
from hvdtrain.training.reports import build_report, global_batch_size, rank_digests, result_record
from hvdtrain.training.state import average_statistics, build_state

log = logging.getLogger("hvdtrain.training.train")


# -- run -------------------------------------------------------------------------------------

def run(cfg: JobConfig, guard: runtime.Guard = runtime.guarded) -> dict[str, Any]:
    """Train, evaluate and (rank 0) export and track one job; returns the result record on every rank. ``guard``
    (the stall watchdog and the Kerberos renewer) wraps everything after the process set-up."""
    runtime.set_horovod_env(cfg.fault, cfg.train)
    rank = distributed.init()
    startup.mark("rendezvous")
    runtime.configure_logging(rank)
    secrets.protect_logging(*secrets.secret_values(cfg.flat()))
    secrets.private_files()  # checkpoints, the MLflow store, outputs: the user's only
    threads = runtime.configure_tf(rank, cfg.train)
    with guard(cfg, rank) as dog, leases.for_ranks(
            cfg.train.output, cfg.checkpoint.dir if cfg.checkpoint.enabled else None, rank.is_chief,
            lambda obj: distributed.broadcast_object(obj, name="hvdtrain.leases")) as held:
        dog.phase("reading the manifest and agreeing on the plan")
        manifest, shape, steps = plan(cfg, rank)
        cfg = dataclasses.replace(cfg, train=with_epochs(cfg.train, manifest))
        hosts = sorted(set(distributed.allgather_object(rank.hostname, name="hvdtrain.hosts")))
        log.info("world size %d (%s) on %s, dataset %s (digest %s), model %s, %d optimizer steps/epoch x %d "
                 "epochs, global batch %d", rank.size, rank.backend, ",".join(hosts), manifest.root,
                 manifest.digest(), cfg.model.kind, steps, cfg.train.epoch_count, global_batch_size(cfg.train, rank.size))
        layout = resume.layout(cfg, rank.size, steps, manifest.digest(), manifest.legacy_digest())
        dog.phase("looking for a checkpoint to resume from", cfg.fault.checkpoint_timeout)
        looking = time.perf_counter()
        resumed = resume.find(cfg.checkpoint, rank, layout)
        restore_seconds = time.perf_counter() - looking
        startup.mark("data plan")
        with tracking.start(cfg, rank.is_chief, {**_run_tags(manifest, rank, hosts), **_tune_tags(cfg.tune)},
                            resume_run_id=resumed.run_id if resumed else None) as tracker, \
                tempfile.TemporaryDirectory(prefix=f"hvdtrain-stage-{rank.hostname}-") as stage_dir:
            if resumed is None or tracker.run_id != resumed.run_id:
                tracker.log_params({**tracking.flat_params(cfg), **_run_params(cfg.train, rank, steps, hosts)})
            restarts = supervise.restarts_from_env()
            if restarts:  # one MLflow run throughout: this try counts the restarts before it
                tracker.log_metrics({"restarts": float(len(restarts))})
                tracker.set_tags({"last_restart_cause": restarts[-1].get("cause", "")})
            startup.mark("tracking")
            ctx = TrainContext(cfg, manifest, shape, rank, steps, stage_dir, tracker, layout, dog.phase, threads)
            model, history, stopping = _train(ctx, resumed, Restored(restore_seconds, len(restarts)))
            average_statistics(model)  # BatchNormalization's, as evaluated, compared and exported
            evaluated = evaluate_splits(ctx, model)
            dog.phase("gathering weight digests")
            report = build_report(ctx, history, evaluated, rank_digests(model, rank), stopping)
            report["resumed_from"] = resumed.uri if resumed else None
            report["startup"] = startup.CLOCK.breakdown()
            report["restarts"] = restarts
            if not rank.is_chief:
                return result_record(tracker.run_id, report, cfg.train.output)
            # Export, the MLflow upload and the output upload can take long on slow storage: they run under
            # fault.checkpoint_timeout, and each file restarts the clock (no "stall" after training finished).
            dog.phase("exporting the model and logging it to MLflow", cfg.fault.checkpoint_timeout)
            result = publish(ctx, model, report, before_replace=held.check)
    test = evaluated["test"]
    log.info("test %s; outputs in %s", ", ".join(f"{k} {test[k]:.4f}" for k in tasks_lib.HEADLINE[test["task"]]
                                                 if test.get(k) is not None), cfg.train.output)
    return result


def plan(cfg: JobConfig, rank: distributed.RankInfo) -> tuple[Manifest, data.InputShape, int]:
    """Manifest, the model's view of it and optimizer steps per epoch; fails before any training.

    Reads cfg.train, cfg.etl (the dataset), cfg.model and cfg.task (what they need of the dataset).
    """
    check_replaceable(cfg.train.output)  # first: a refused output would waste everything after it
    manifest = manifest_lib.read(cfg.etl.output)  # then the dataset, before anything is written: one this user
    if rank.is_chief:  # may not read leaves no claimed output behind
        record_claim(cfg.train.output)
    shape = data.check_manifest(manifest, cfg.model, cfg.task.kind)
    heads.target_transform(cfg.task.kind, cfg.task.target_transform, manifest.preprocessing.get("target"))
    heads.class_weight_vector(cfg.task.class_weights, manifest.labels, {})  # a label the dataset lacks: one line
    if cfg.train.record_trace and data.KEY_FEATURE not in manifest.features:
        raise DataError(f"{manifest.location}: train.record_trace={cfg.train.record_trace} needs feature "
                        f"{data.KEY_FEATURE!r} (the record keys), which this dataset lacks; rerun the ETL with this "
                        "hvdtrain version or set train.record_trace=null")
    steps = data.steps_per_epoch(manifest.split("train").records, cfg.train.batch_size, rank.size,
                                 cfg.train.grad_accum_steps)
    few_shards = data.shard_warning("train", len(manifest.split("train").shards), rank.size)
    for warning in (few_shards, manifest_lib.order_warning(manifest)):
        if warning and rank.is_chief:
            log.warning("%s", warning)
    if cfg.train.validates_each_epoch and manifest.split("validation").records == 0:
        raise DataError(f"{manifest.location}: the validation split is empty, but train.early_stopping / "
                        "train.validate_every_epoch evaluate it after every epoch: give etl.splits a validation "
                        "fraction and rerun the ETL, or turn both off")
    return manifest, shape, steps


def _train(ctx: TrainContext, resumed: Optional[resume.Resumed],
           restored: Optional[Restored] = None) -> tuple[keras.Model, list[EpochStats], Optional[dict]]:
    """Build, resume or take rank 0's initial state, fit; returns the early-stopping summary (None when off)."""
    cfg, rank = ctx.cfg, ctx.rank
    model, optimizer = build_state(cfg, ctx.shape, rank.size, total_steps=ctx.steps * cfg.train.epoch_count)
    stopping = cfg.train.early_stopping
    stopper = EarlyStopper(stopping, model.get_weights) if stopping is not None else None
    restored = restored or Restored()
    if resumed is not None:
        applying = time.perf_counter()
        resume.apply(resumed, model, optimizer, rank, stopper)
        restored = dataclasses.replace(restored, seconds=restored.seconds + time.perf_counter() - applying)
    distributed.broadcast_state(model, optimizer)
    startup.mark("model build")
    guard = steps_lib.FiniteGuard() if cfg.train.fp16_allreduce else None
    reduction = steps_lib.Reduction(cfg.train.fp16_allreduce, cfg.train.allreduce, _sparse(ctx, model), task_head(ctx))
    per_call = 1 if cfg.monitoring.step_breakdown else cfg.train.steps_per_call  # the breakdown times each step
    make_step = (steps_lib.make_timed_step if cfg.monitoring.step_breakdown else
                 steps_lib.make_unrolled_step if per_call > 1 else steps_lib.make_optimizer_step)
    step_fn = make_step(model, optimizer, ctx.shape.label_feature, steps_lib.input_names(model),
                        cfg.train.grad_accum_steps, reduction, guard)
    checkpointer = resume.Checkpointer(ctx, model, optimizer, stopper)
    plan = LoopPlan(cfg.train.epoch_count, ctx.steps, cfg.train.grad_accum_steps, cfg.train.batch_size, per_call)
    observed = Observed(step_fn, optimizer, checkpointer, resumed, restored)
    with training_hooks(ctx, model, stopper, guard, observed) as hooks:
        history = fit(step_fn, _train_batches(ctx, resumed.plan.first_record if resumed else 0), plan, hooks=hooks,
                      start=resumed.start(rank) if resumed else None, phase=ctx.phase)
        checkpointer.close()
    if stopper is None:
        return model, history, None
    restore = stopper.restore_best(model, len(history))
    if restore and stopper.decision is not None:  # restore implies a decision; the same on every rank, and
        distributed.broadcast_state(model, optimizer)  # rank 0 holds the best weights (even after a resume)
        log.info("restored the weights of epoch %d (best validation %s)", stopper.decision.best_epoch,
                 stopper.cfg.metric)
    return model, history, stopper.summary(restored=restore, epochs=cfg.train.epoch_count)


def _sparse(ctx: TrainContext, model: keras.Model) -> tuple[bool, ...]:
    """Per trainable variable, whether its gradient travels sparse (model.sparse_embedding_rows); logged once."""
    if ctx.cfg.train.grad_accum_steps > 1:
        return ()  # accumulated gradients are dense
    chosen = steps_lib.sparse_variables(model, ctx.cfg.model.sparse_embedding_rows)
    for variable, sparse in zip(model.trainable_variables, chosen):
        if sparse and ctx.rank.is_chief:
            log.info("gradient of %s %s: sparse allgather of the touched rows (model.sparse_embedding_rows=%d)",
                     variable.path, tuple(variable.shape), ctx.cfg.model.sparse_embedding_rows)
    return chosen


def _train_batches(ctx: TrainContext, start_record: int) -> Any:
    """This rank's endless training batches from ``start_record`` on, traced when asked."""
    train, shape = ctx.cfg.train, ctx.shape
    trace = train.record_trace
    stream = data.TrainStream(ctx.rank.rank, ctx.rank.size, train.batch_size, train.shuffle_buffer, train.seed,
                              records_per_epoch=ctx.steps * train.batch_size * train.grad_accum_steps)
    batches = iter(data.with_threads(data.train_dataset(
        ctx.manifest, stream, features=[*shape.read_features, *([data.KEY_FEATURE] if trace else [])],
        stage_dir=ctx.stage_dir, start_record=start_record), ctx.threads))
    if trace:
        batches = data.trace_batches(batches, fs.local_path(trace), ctx.rank.rank, start_record // train.batch_size)
    return batches


def _run_tags(manifest: Manifest, rank: distributed.RankInfo, hosts: Sequence[str]) -> dict[str, str]:
    tags = {"manifest_digest": manifest.digest(), "dataset": manifest.root, "horovod_size": str(rank.size),
            "horovod_hosts": ",".join(hosts), "distributed_backend": rank.backend}
    commit = tracking.git_commit(os.path.dirname(os.path.abspath(__file__)))
    if commit:
        tags["git_commit"] = commit
    return tags


def _tune_tags(tune: TuneConfig) -> dict[str, str]:
    """A ``hvdtrain tune`` trial's run sits under the study's run (MLflow's parent/child tag)."""
    tags = {}
    if tune.trial is not None:
        tags.update({"hvdtrain.tune.study": tune.study, "tune_trial": str(tune.trial)})
    if tune.parent_run_id:
        tags["mlflow.parentRunId"] = tune.parent_run_id
    return tags


def _run_params(train: TrainConfig, rank: distributed.RankInfo, steps: int, hosts: Sequence[str]) -> dict[str, Any]:
    return {"horovod.size": rank.size, "horovod.hosts": ",".join(hosts), "steps_per_epoch": steps,
            "global_batch_size": global_batch_size(train, rank.size),
            "scaled_learning_rate": scaled_learning_rate(train.learning_rate, rank.size),
            "decay_steps": steps * train.epoch_count}


# -- command line ---------------------------------------------------------------------------

def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m hvdtrain.training.train CONFIG [key=value ...]`` (also under horovodrun)."""
    parser = argparse.ArgumentParser(prog="python -m hvdtrain.training.train", description=__doc__.split("\n")[0])
    parser.add_argument("config", help="job config YAML")
    parser.add_argument("overrides", nargs="*", help="section.key=value, e.g. train.epochs=2")
    args = parser.parse_intermixed_args(argv)
    startup.mark("interpreter and imports")  # this module's imports include TensorFlow's
    try:
        result = run(config_lib.load(args.config, args.overrides))
    except HvdtrainError as exc:
        return console.report_error(exc, "hvdtrain")
    except runtime.CORRUPT_DATA as exc:  # a shard's bytes changed after the ETL: exit 3, never restarted
        return console.report_error(runtime.corrupt_data_error(exc), "hvdtrain")
    finally:
        runtime.skip_final_collections()
    runtime.report_result(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
