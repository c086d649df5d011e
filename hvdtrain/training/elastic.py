"""Elastic training: hvdtrain's step under Horovod elastic mode, resizing without a process restart.

``train.elastic: {min_ranks, max_ranks}`` makes ``hvdtrain train`` launch an
elastic horovodrun (:func:`hvdtrain.runtime.elastic_plan.horovodrun_command`) whose ranks run :func:`run`.

**Virtual ranks.** The data plan is fixed at ``V = max_ranks`` virtual ranks:
virtual rank ``v`` reads share ``v`` of ``V`` of the train split, in its own
shuffled stream (:func:`hvdtrain.data.train_dataset` as for rank ``v`` of a
world of ``V``). A world of ``n`` ranks runs every virtual rank at every step:
real rank ``r`` takes one batch from each virtual rank ``v = r, r + n, ...``
(:func:`virtual_ranks`), sums their gradients, and the average over the
``n`` ranks is scaled by ``n / V`` (:func:`gradient_scale`): the update is
the mean over the ``V`` batches, whatever ``n`` is. So the global batch
(``V x batch_size``), the learning rate (that of ``V`` ranks), the steps per
epoch and the schedule do not change on a resize; a smaller world does more
per rank.

**Data accounting.** The input position is the global step. The state
(model, optimizer, step) is committed every ``commit_every_steps`` steps and at
the end. When a rank or host is lost, the survivors roll back to the last
commit at step ``c`` and every virtual stream restarts after ``c x
batch_size`` of its records (a stream is a pure function of the seed and its
position): within an epoch no record is lost, and the steps repeated are
``c + 1`` up to the failure, at most ``commit_every_steps``. When capacity
returns, Horovod adds the ranks at the next commit and the work spreads again.

**A job like any other.** The state also carries the finished epochs' stats, the running epoch's sums and the
MLflow run id. Every commit all-reduces the loss, correct and example sums of the steps since the last one (no
resize happens between two commits: a resize rolls back to one), so the epoch stats are exact over all virtual
batches. Whoever is rank 0 logs them to MLflow (a new rank 0, after rank 0 was lost, continues the same run)
and writes checkpoints at the checkpoint config's steps (epoch ends by default), which a relaunched job resumes
from with ``checkpoint.resume: auto``. Every commit first averages the statistics each rank updates on its own
(BatchNormalization's moving mean and variance, :func:`hvdtrain.training.state.average_statistics`), so what is
committed, saved, evaluated and exported is the same on every rank. At the end the ranks evaluate validation and
test exactly, and rank 0 publishes what ``hvdtrain train`` publishes (:func:`hvdtrain.training.publish.publish`).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional, Sequence

import hvdtrain.model.lean_keras  # noqa: F401  # first: Keras without its plotting and scikit-learn extras
import numpy as np
import tensorflow as tf

from hvdtrain.training import checkpoint, resume
from hvdtrain.observe import console, tracking
from hvdtrain import data
from hvdtrain.runtime import distributed
from hvdtrain.hadoop import fs
from hvdtrain.model import heads
from hvdtrain.core import secrets
from hvdtrain.core import config as config_lib
from hvdtrain.training import train as train_lib
from hvdtrain.core.config import JobConfig
from hvdtrain.data import plan as data_plan
from hvdtrain.runtime.elastic_plan import gradient_scale, virtual_ranks
from hvdtrain.core.errors import ANY_ERROR, DataError, HvdtrainError, StorageError
from hvdtrain.model.schedules import scaled_learning_rate
from hvdtrain.training import runtime
from hvdtrain.training import steps as steps_lib
from hvdtrain.training.context import Phase, TrainContext, no_phase
from hvdtrain.training.evaluate import evaluate_splits
from hvdtrain.observe.events import EPOCH_METRIC, EpochStats, epoch_stats
from hvdtrain.training.publish import publish
from hvdtrain.training.reports import build_report, rank_digests, result_record
from hvdtrain.training.state import average_statistics, build_state, current_learning_rate

log = logging.getLogger("hvdtrain.training.elastic")


# -- act ------------------------------------------------------------------------------------------------

@dataclass
class Job:
    """What every (re)start of the elastic function needs, and what this process opened while rank 0."""

    cfg: JobConfig
    manifest: Any
    shape: Any
    steps: int  # optimizer steps per epoch, fixed by the virtual world
    virtual: int
    stage_dir: str
    layout: dict[str, Any]
    model: Any = None
    optimizer: Any = None
    opened: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)  # this process's MLflow run
    tracker: Any = None  # inert until this process is rank 0 at a (re)start
    writer: Optional[checkpoint.CheckpointWriter] = None  # made by whoever is rank 0 at a checkpoint
    phase: Phase = no_phase  # the stall watchdog's: what this rank does next (runtime.guarded)
    # Epochs the MLflow run has: a rollback to a commit before an epoch's end redoes that end, and MLflow would
    # keep both entries of the epoch (filled from the run itself when a new rank 0 continues it)
    logged_epochs: set[int] = field(default_factory=set)

    @property
    def reset_timeout(self) -> float:
        """How long a commit or a reset may wait for the world to re-form: Horovod's start timeout (the elastic
        rendezvous) plus a stall's worth."""
        return float(self.cfg.fault.start_timeout + self.cfg.fault.stall_timeout)

    def track(self, rank: distributed.RankInfo, run_id: Optional[str]) -> Optional[str]:
        """Rank 0 opens (or continues) the MLflow run once per process; the run id, on every rank."""
        if self.tracker is None:
            self.tracker = tracking.Tracker(self.cfg, enabled=False)
        if rank.is_chief and not self.tracker.active and self.cfg.tracking.enabled and self.tracker.run_id is None:
            tags = {"manifest_digest": self.manifest.digest(), "dataset": self.manifest.root,
                    "distributed_backend": "horovod-elastic", "elastic_virtual_ranks": str(self.virtual)}
            self.tracker = self.opened.enter_context(tracking.start(self.cfg, True, tags, resume_run_id=run_id))
            if run_id is None or self.tracker.run_id != run_id:
                self.tracker.log_params({**tracking.flat_params(self.cfg), **self.params()})
            else:
                self.logged_epochs |= self.tracker.logged_steps(EPOCH_METRIC)
        return distributed.broadcast_object(self.tracker.run_id if rank.is_chief else None,
                                            name="hvdtrain.training.elastic.run_id")

    def params(self) -> dict[str, Any]:
        el = self.cfg.train.elastic
        assert el is not None
        return {"steps_per_epoch": self.steps, "global_batch_size": self.virtual * self.cfg.train.batch_size,
                "scaled_learning_rate": scaled_learning_rate(self.cfg.train.learning_rate, self.virtual),
                "decay_steps": self.steps * self.cfg.train.epoch_count, "elastic.virtual_ranks": self.virtual}

    def save(self, state: Any, epoch_end: bool) -> None:
        """Rank 0 stages a checkpoint of the committed state and publishes it in the background."""
        if self.writer is None:
            self.writer = resume.writer(self.cfg.checkpoint)
        history = state.history
        metrics = {"train_loss": history[-1]["loss"], "train_accuracy": history[-1]["accuracy"]} \
            if epoch_end and history else {}
        meta = resume.CheckpointMeta(step=state.step, epoch=len(history), epoch_end=epoch_end,
                                     carried=state.sums[:3], carried_seconds=state.sums[3], history=history,
                                     run_id=state.run_id, layout=self.layout, metrics=metrics)
        self.writer.save(state.step, resume.state_arrays(self.model, self.optimizer), meta.document())


class VirtualStep:
    """One optimizer step over this rank's virtual batches; the update is the mean over all virtual batches."""

    def __init__(self, model: Any, optimizer: Any, shape: Any, head: heads.Head):
        self.model, self.optimizer, self.shape, self._head = model, optimizer, shape, head
        self._compiled = tf.function(self._step, autograph=False)  # plain Python over the list of batches

    def _step(self, batches: Sequence[dict[str, Any]], scale: tf.Tensor) -> tf.Tensor:
        total, sums = None, tf.zeros([3], tf.float64)  # loss sum, correct, examples
        for batch in batches:
            grads, loss, correct = steps_lib._gradients(self.model, self.optimizer, self._head, batch,
                                                        self.shape.inputs, self.shape.label_feature)
            total = grads if total is None else [_add(a, b) for a, b in zip(total, grads)]
            examples = tf.cast(tf.shape(batch[self.shape.label_feature])[0], tf.float64)
            sums += tf.stack([loss, tf.cast(correct, tf.float64), examples])
        assert total is not None, "a virtual step has at least one batch"
        averaged = distributed.allreduce_grads(total)
        self.optimizer.apply([g * tf.cast(scale, g.dtype) for g in averaged], self.model.trainable_variables)
        return sums

    def __call__(self, batches: Sequence[dict[str, Any]], scale: float) -> Any:
        return self._compiled(list(batches), tf.constant(scale, tf.float32))


def _add(a: Any, b: Any) -> Any:
    """Sum of two gradients of one variable; an embedding's tf.IndexedSlices has no ``+`` (densified here, as
    :func:`hvdtrain.runtime.distributed.allreduce_grads` sends it dense anyway)."""
    if isinstance(a, tf.IndexedSlices) or isinstance(b, tf.IndexedSlices):
        return tf.convert_to_tensor(a) + tf.convert_to_tensor(b)
    return a + b


def _streams(job: Job, owned: Sequence[int], step: int) -> list[Iterator[dict[str, Any]]]:
    """The batch streams of ``owned`` virtual ranks, each after ``step`` batches (traced when asked)."""
    train = job.cfg.train
    trace = train.record_trace
    features = [*job.shape.read_features, *([data.KEY_FEATURE] if trace else [])]
    out = []
    for v in owned:
        stream = data.TrainStream(v, job.virtual, train.batch_size, train.shuffle_buffer, train.seed,
                                  records_per_epoch=job.steps * train.batch_size)
        # A reset drops these streams on every rank: without autotuning, so that dropping them is prompt.
        batches = iter(data.without_autotune(data.train_dataset(job.manifest, stream, features=features,
                                                                stage_dir=job.stage_dir,
                                                                start_record=step * train.batch_size)))
        out.append(data.trace_batches(batches, fs.local_path(trace), v, step) if trace else batches)
    return out


def _loop(job: Job, state: Any, step_fn: VirtualStep) -> None:
    """Train from the committed step to the end; the body of ``hvd.elastic.run`` (re-run after each reset).

    The job's first entry resumes from a checkpoint (:func:`_start`); a rank joining later gets the state by
    Horovod's sync instead. Commits come every ``commit_every_steps`` steps, at each epoch end and at each
    checkpoint step. The sums of the steps since the last commit are all-reduced there and added to the
    epoch's (in the committed state).
    """
    rank = distributed.refresh()
    if not state.started:
        _start(job, state, rank)
    owned = virtual_ranks(rank.rank, rank.size, job.virtual)
    log.info("elastic: %d ranks from step %d; rank %d runs virtual ranks %s", rank.size, state.step, rank.rank, owned)
    state.run_id = job.track(rank, state.run_id)
    # Kept at once (a save, no collective): a rollback before the next commit must not lose this start's size,
    # nor the MLflow run just opened (a new rank 0 would open a second one).
    state.sizes = [*state.sizes, rank.size]
    state.save()
    streams = _streams(job, owned, state.step)
    elastic_cfg, ck = job.cfg.train.elastic, job.cfg.checkpoint
    assert elastic_cfg is not None  # this module runs only for train.elastic
    total, every = job.cfg.train.epoch_count * job.steps, elastic_cfg.commit_every_steps
    sums, since = tf.zeros([3], tf.float64), time.perf_counter()
    while state.step < total:
        job.phase(f"elastic step {state.step + 1}: input batches, gradients and their all-reduce")
        sums += step_fn([next(s) for s in streams], gradient_scale(rank.size, job.virtual))
        state.step += 1
        epoch_end = state.step % job.steps == 0
        save = ck.enabled and checkpoint.save_due(state.step, job.steps, ck.every_steps, ck.at_epoch_end)
        if state.step % every == 0 or epoch_end or save or state.step == total:
            average_statistics(job.model)  # committed, saved and rolled back to alike on every rank
            seconds = time.perf_counter() - since
            _add_sums(job, state, rank, np.append(sums.numpy(), seconds), epoch_end)
            if save:
                job.phase(f"saving the checkpoint of step {state.step}", job.cfg.fault.checkpoint_timeout)
                _collectively(rank, lambda: job.save(state, epoch_end), "checkpoint")
            sums, since = tf.zeros([3], tf.float64), time.perf_counter()
            job.phase(f"committing step {state.step} (a resize waits here for the new world)", job.reset_timeout)
            state.commit()  # raises HostsUpdatedInterrupt when hosts changed: the job resizes here


def _add_sums(job: Job, state: Any, rank: distributed.RankInfo, local: np.ndarray, epoch_end: bool) -> None:
    """The interval's sums over ranks into the epoch's; at an epoch end, its stats into the history (and MLflow).

    New lists are assigned, never changed in place: Horovod's ``ObjectState`` keeps references, so an in-place
    change would also change the committed copy that a reset rolls back to.
    """
    summed = distributed.allreduce_sum(local, name="hvdtrain.training.elastic.sums")
    totals = [a + float(b) for a, b in zip(state.sums[:3], summed[:3])] + [state.sums[3] + float(local[3])]
    if not epoch_end:
        state.sums = totals
        return
    epoch = state.step // job.steps
    stats = epoch_stats(epoch, job.steps, np.array(totals[:3]), totals[3])
    stats.learning_rate = current_learning_rate(job.optimizer)
    state.history, state.sums = [*state.history, stats.to_dict()], [0.0, 0.0, 0.0, 0.0]
    log.info("epoch %d/%d at %d ranks: loss %.4f, accuracy %.4f", epoch, job.cfg.train.epoch_count, rank.size,
             stats.loss, stats.accuracy)
    if epoch not in job.logged_epochs:  # once per epoch, however many times a rollback redoes its end
        job.tracker.log_metrics({**stats.metrics(), "world_size": float(rank.size)}, epoch)
        job.logged_epochs.add(epoch)


def _collectively(rank: distributed.RankInfo, act: Any, what: str) -> Any:
    """Rank 0 acts; its user-facing error is raised on every rank (a collective), so the job ends with it
    instead of losing rank 0 and going on without (Horovod would blacklist its host and carry on)."""
    result, error = None, None
    if rank.is_chief:
        try:
            result = act()
        except HvdtrainError as exc:
            error = (type(exc).__name__, str(exc))
        except ANY_ERROR as exc:  # raised on every rank below: rank 0 alone must not fail
            log.exception("elastic: %s failed on rank 0", what)
            error = ("DataError", f"{what} failed on rank 0: {type(exc).__name__}: {exc}")
    error = distributed.broadcast_object(error, name=f"hvdtrain.training.elastic.{what}")
    if error:
        raise (StorageError if error[0] == StorageError.__name__ else DataError)(error[1])
    return result


def _start(job: Job, state: Any, rank: distributed.RankInfo) -> None:
    """The job's first start: rank 0 resumes from a checkpoint (``checkpoint.resume``), every rank takes its
    state. A collective of the first world only: the flag is committed, so ranks joining later skip it."""
    job.phase("looking for a checkpoint to resume from", job.cfg.fault.checkpoint_timeout)
    uri = _collectively(rank, lambda: _resume(job, state), "resume")
    distributed.broadcast_state(job.model, job.optimizer)
    fields = distributed.broadcast_object(
        {"step": state.step, "history": state.history, "sums": state.sums, "run_id": state.run_id, "uri": uri},
        name="hvdtrain.training.elastic.resumed")
    state.step, state.history, state.sums, state.run_id = (fields[k] for k in ("step", "history", "sums", "run_id"))
    state.resumed_from, state.started = fields["uri"], True
    state.save()


def _resume(job: Job, state: Any) -> Optional[str]:
    """Rank 0 continues from the newest valid checkpoint (``checkpoint.resume``): model, optimizer and the
    state's step, history, epoch sums and MLflow run id; returns its location (None: a fresh start)."""
    ck = job.cfg.checkpoint
    if not ck.enabled:
        return None
    if ck.resume == "never":
        resume.refuse_used_dir(ck)
        return None
    found = resume.load(ck, job.layout)
    if found is None:
        return None
    if found.plan.step_offset or found.plan.optimizer_shift:
        raise DataError(f"checkpoint {found.uri} was saved with {resume.describe_layout(found.meta)}; an elastic "
                        f"job of {resume.describe_layout(job.layout)} continues only from a checkpoint of the same "
                        "layout: set train.elastic.max_ranks and train.batch_size as they were, or point "
                        "checkpoint.dir at a new folder")
    assert found.arrays is not None
    resume.assign(job.model.weights, resume.group(found.arrays, "model"), "model", found.uri)
    resume.assign(job.optimizer.variables, resume.group(found.arrays, "optimizer"), "optimizer", found.uri)
    known = {f for f in EpochStats.__dataclass_fields__}
    state.step = found.step
    state.history = [{k: v for k, v in h.items() if k in known or k == "samples_per_sec"}
                     for h in found.meta.get("history", [])]
    state.sums = [*[float(x) for x in found.meta.get("carried", [0.0, 0.0, 0.0])][:3],
                  float(found.meta.get("carried_seconds", 0.0))]
    state.run_id = found.run_id
    for warning in found.plan.warnings:
        log.warning(warning)
    return found.uri


def _resetting(job: Job, step_fn: VirtualStep) -> Any:
    """The body of ``hvd.elastic.run``: a try that fails (a lost rank, hosts changed) tells the watchdog that the
    rank now waits for the world to re-form, which may take up to :attr:`Job.reset_timeout`."""
    def body(state: Any) -> None:
        try:
            _loop(job, state, step_fn)
        except BaseException:
            job.phase("re-forming the elastic world after a lost rank or a host change", job.reset_timeout)
            raise
    return body


def run(cfg: JobConfig, guard: runtime.Guard = runtime.guarded) -> dict[str, Any]:
    """Train under Horovod elastic mode; returns the result record on every rank (rank 0 writes result.json).
    ``guard`` (the stall watchdog and the Kerberos renewer, as for a fixed-size job) wraps all the work."""
    runtime.set_horovod_env(cfg.fault, cfg.train)
    rank = distributed.init()
    runtime.configure_logging(rank)
    secrets.protect_logging(*secrets.secret_values(cfg.flat()))
    secrets.private_files()
    threads = runtime.configure_tf(rank, cfg.train)
    with guard(cfg, rank) as dog:
        return _run(cfg, rank, threads, dog.phase)


def _run(cfg: JobConfig, rank: distributed.RankInfo, threads: int, phase: Phase) -> dict[str, Any]:
    phase("reading the manifest and agreeing on the plan")
    manifest, shape, _ = train_lib.plan(cfg, rank)
    cfg = dataclasses.replace(cfg, train=data_plan.with_epochs(cfg.train, manifest))
    assert cfg.train.elastic is not None  # this module runs only for train.elastic
    virtual = cfg.train.elastic.max_ranks
    steps = data_plan.steps_per_epoch(manifest.split("train").records, cfg.train.batch_size, virtual)
    model, optimizer = build_state(cfg, shape, virtual, cfg.train.epoch_count * steps)
    head = heads.for_task(cfg.task, manifest.labels, manifest.split("train").class_counts(),
                          manifest.preprocessing.get("target"))
    step_fn = VirtualStep(model, optimizer, shape, head)
    state = distributed.elastic_state(model, optimizer, step=0, history=[], sums=[0.0, 0.0, 0.0, 0.0], run_id=None,
                                      sizes=[], started=False, resumed_from=None)
    layout = resume.layout(cfg, virtual, steps, manifest.digest(), manifest.legacy_digest())
    with tempfile.TemporaryDirectory(prefix=f"hvdtrain-stage-{rank.hostname}-") as stage_dir, \
            contextlib.ExitStack() as opened:
        job = Job(cfg, manifest, shape, steps, virtual, stage_dir, layout, model, optimizer, opened, phase=phase)
        distributed.elastic_run(_resetting(job, step_fn))(state)
        rank = distributed.refresh()
        # The last checkpoint published before the outputs (rank 0 waits; a failure ends every rank).
        phase("publishing the last checkpoint", cfg.fault.checkpoint_timeout)
        _collectively(rank, lambda: job.writer.wait() if job.writer is not None else None, "published")
        tracker = job.tracker if job.tracker is not None and rank.is_chief else tracking.Tracker(cfg, enabled=False)
        ctx = TrainContext(cfg, manifest, shape, rank, steps, stage_dir, tracker, layout, phase, threads)
        average_statistics(model)  # as evaluated, compared and exported (a no-op after the last commit's)
        report = build_report(ctx, [EpochStats(**{k: v for k, v in h.items() if k != "samples_per_sec"})
                                    for h in state.history], evaluate_splits(ctx, model), rank_digests(model, rank))
        elastic = {"sizes": state.sizes, "steps": int(state.step), "steps_per_epoch": steps, "virtual_ranks": virtual,
                   "global_batch": virtual * cfg.train.batch_size, "threads": threads,
                   "resumed_from": state.resumed_from}
        report["training"].update(world_size=rank.size, global_batch_size=virtual * cfg.train.batch_size,
                                  learning_rate=scaled_learning_rate(cfg.train.learning_rate, virtual),
                                  elastic=elastic)
        if not rank.is_chief:
            return {**result_record(tracker.run_id, report, cfg.train.output), **elastic}
        return publish(ctx, model, report, extra=elastic)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m hvdtrain.training.elastic CONFIG [key=value ...]``, under an elastic horovodrun."""
    parser = argparse.ArgumentParser(prog="python -m hvdtrain.training.elastic", description=__doc__.split("\n")[0])
    parser.add_argument("config", help="job config YAML with train.elastic set")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    args = parser.parse_intermixed_args(argv)
    try:
        result = run(config_lib.load(args.config, args.overrides))
    except HvdtrainError as exc:
        return console.report_error(exc, "hvdtrain")
    finally:
        runtime.skip_final_collections()
    runtime.report_result(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
