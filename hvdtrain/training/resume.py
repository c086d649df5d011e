"""What a training checkpoint holds, how training saves it, and how a run resumes from it.

:mod:`hvdtrain.training.checkpoint` owns the format (atomic, checksummed, published in
the background); this module decides what goes in and puts it back:

* ``model/NNNN/<path>``: every model weight; ``optimizer/NNNN/<path>``:
  every optimizer variable (step counter, so the learning-rate schedule
  position, moments, loss scale);
* ``rng/rankR/NNNN``: each rank's dropout seed-generator states (ranks differ:
  each is gathered to rank 0);
* ``best/NNNN``: the best epoch's weights, when early stopping restores them;
* ``meta.json``: step, epoch, the interrupted epoch's rank-summed loss and
  accuracy sums, the finished epochs' stats, early-stopping values, the
  MLflow run id, the step offset (see :func:`check_layout`), what the input
  position depends on (world size, batch size, accumulation, steps per epoch,
  seed, shuffle buffer, input order version, dataset digest) and the model config's digest.

The input position is not stored as bytes: every rank's stream is a pure
function of the seed and the records it has read (:mod:`hvdtrain.data`), and
after ``n`` optimizer steps of one layout each rank has read ``n *
grad_accum_steps * batch_size`` records. A resumed run reads exactly the batches an
uninterrupted run would have read next.

Resuming is planned, then applied. :func:`find` (a collective) has rank 0
read the newest valid checkpoint (every rank may not see a local checkpoint
folder), check it against this run (:func:`plan_resume`, pure: a
:class:`ResumePlan` with the step offset, the optimizer counter's shift, the
first record per rank and the warnings) and broadcast the small state (meta,
plan, RNG states). :func:`apply` (a collective) then puts it back: rank 0 sets
its model and optimizer, every rank its RNG state; the caller broadcasts the
variables from rank 0 as at any start.
"""
from __future__ import annotations

import datetime
import logging
import time
from dataclasses import dataclass, field, fields
from typing import Any, Optional, Sequence

import numpy as np

from hvdtrain.core.config import CheckpointConfig, JobConfig
from hvdtrain.core.errors import ANY_ERROR, DataError, StorageError
from hvdtrain.data.pipeline import INPUT_ORDER
from hvdtrain.model.evaluation import scalar_metrics
from hvdtrain.observe.events import EpochStats, Hook, LoopState, Start
from hvdtrain.runtime import distributed
from hvdtrain.training import checkpoint
from hvdtrain.training.context import TrainContext
from hvdtrain.training.hooks import EarlyStopper

log = logging.getLogger("hvdtrain.training.train")
FORMAT = 1


# -- variables <-> arrays -------------------------------------------------------------

def seed_variables(model: Any) -> list[Any]:
    """The model's dropout seed-generator states: its variables that are not weights."""
    weights = {id(v) for v in model.weights}
    return [v for v in model.variables if id(v) not in weights]


def to_numpy(variables: Sequence[Any]) -> list[np.ndarray]:
    import keras

    return [np.array(keras.ops.convert_to_numpy(v)) for v in variables]


def state_arrays(model: Any, optimizer: Any) -> dict[str, np.ndarray]:
    """Model weights and optimizer variables, by position and path."""
    out = {}
    for prefix, variables in (("model", model.weights), ("optimizer", optimizer.variables)):
        for i, (v, value) in enumerate(zip(variables, to_numpy(variables))):
            out[f"{prefix}/{i:04d}/{v.path}"] = value
    return out


def group(arrays: dict[str, np.ndarray], prefix: str) -> list[np.ndarray]:
    """Arrays under ``prefix/`` in position order."""
    head = prefix + "/"
    keys = sorted((k for k in arrays if k.startswith(head)), key=lambda k: int(k[len(head):].split("/")[0]))
    return [arrays[k] for k in keys]


def assign(variables: Sequence[Any], values: Sequence[np.ndarray], what: str, where: str) -> None:
    """Assign saved values, checking count and shapes first (nothing is assigned on a mismatch)."""
    if len(values) != len(variables):
        raise DataError(f"checkpoint {where} holds {len(values)} {what} variables but this model has "
                        f"{len(variables)}: the model config changed since it was saved; start a new "
                        "checkpoint.dir or set checkpoint.resume=never")
    for v, value in zip(variables, values):
        if tuple(v.shape) != tuple(value.shape):
            raise DataError(f"checkpoint {where}: {what} variable {v.path} has shape {tuple(value.shape)} there "
                            f"but {tuple(v.shape)} in this model: the model config changed since it was saved; "
                            "start a new checkpoint.dir or set checkpoint.resume=never")
    for v, value in zip(variables, values):
        v.assign(value)


# -- what the position depends on ---------------------------------------------------------------

POSITION_KEYS = ("world_size", "batch_size", "grad_accum_steps", "steps_per_epoch")  # where a step leaves the input
ORDER_KEYS = ("seed", "shuffle_buffer", "input_order")  # which records come in which order


def layout(cfg: JobConfig, world_size: int, steps_per_epoch: int, manifest_digest: str,
           legacy_digest: str = "") -> dict[str, Any]:
    """Everything the data order and step numbering depend on, and the model config's digest (pure).

    ``manifest_digest`` is the dataset's content digest (:meth:`hvdtrain.data.manifest.Manifest.digest`);
    ``legacy_digest`` the same manifest's digest in the older form, which checkpoints saved before the content
    digest carry, so they still resume on their unchanged dataset.

    Reads cfg.train, cfg.model and cfg.task (their digests).
    """
    return {"world_size": world_size, "batch_size": cfg.train.batch_size,
            "grad_accum_steps": cfg.train.grad_accum_steps, "steps_per_epoch": steps_per_epoch,
            "epochs": cfg.train.epoch_count, "lr_schedule": cfg.train.lr_schedule,
            "seed": cfg.train.seed, "shuffle_buffer": cfg.train.shuffle_buffer, "input_order": INPUT_ORDER,
            "manifest_digest": manifest_digest, "model_digest": cfg.section_hash("model"),
            "task_digest": cfg.section_hash("task"),
            **({"manifest_digest_legacy": legacy_digest} if legacy_digest else {})}


def _describe(values: dict[str, Any], keys: Sequence[str]) -> str:
    return ", ".join(f"{k} {values.get(k)}" for k in keys)


def describe_layout(values: dict[str, Any]) -> str:
    """Where a step leaves the input, in words (``world_size 2, batch_size 32, ...``)."""
    return _describe(values, POSITION_KEYS)


def check_layout(saved: dict[str, Any], now: dict[str, Any], where: str) -> tuple[list[str], int]:
    """Warnings, and the step offset this run continues with; raises what cannot resume (pure).

    ``saved`` is the checkpoint's meta (its layout, step, step offset). Step
    numbers (checkpoint names, MLflow steps) only ever grow; the loop counts
    epochs in *layout steps*, ``step - step_offset``, whole epochs of this
    run's ``steps_per_epoch``. A changed dataset is refused. A changed world
    size, batch size or accumulation moves where a step leaves each rank's
    input, so only an epoch-end checkpoint can carry over: the run continues
    at the next epoch in the new layout, under a new offset (and the
    optimizer's step counter moves to the new layout step, so the learning-rate
    schedule is at the same fraction of training). Mid-epoch, that is refused
    with both layouts named. A changed seed, shuffle buffer, input order
    version (``data.INPUT_ORDER``) or model config is
    a warning: training continues, but not as an uninterrupted run would have.
    """
    if saved.get("manifest_digest") not in (now["manifest_digest"], now.get("manifest_digest_legacy")):
        raise DataError(f"checkpoint {where} was trained on dataset digest {saved.get('manifest_digest')} but "
                        f"the manifest now has {now['manifest_digest']}: resuming would mix datasets; "
                        "point checkpoint.dir at a new folder or set checkpoint.resume=never")
    step, offset, warnings = int(saved["step"]), int(saved.get("step_offset", 0)), []
    moved = [k for k in POSITION_KEYS if saved.get(k) != now[k]]
    if moved:
        old_steps = int(saved["steps_per_epoch"])
        finished, into = divmod(step - offset, old_steps)
        if into:
            raise DataError(
                f"checkpoint {where} stopped {into} of {old_steps} steps into epoch {finished + 1} with "
                f"{_describe(saved, POSITION_KEYS)}; this run has {_describe(now, POSITION_KEYS)}. A mid-epoch "
                "input position cannot carry over to another layout: rerun with the checkpoint's world size, "
                "train.batch_size and train.grad_accum_steps; or resume from an epoch-end checkpoint "
                "(`hvdtrain checkpoints list DIR` shows the steps: copy that one into a new checkpoint.dir, "
                "or move the later ones out of this one, and set checkpoint.resume=<its folder>); "
                "or set checkpoint.resume=never")
        offset = step - finished * int(now["steps_per_epoch"])
        warnings.append(f"resuming {where} (end of epoch {finished}) with "
                        f"{', '.join(f'{k} {saved.get(k)} -> {now[k]}' for k in moved)}: training continues at "
                        f"epoch {finished + 1} with {now['steps_per_epoch']} steps per epoch, step numbers going on "
                        f"from {step}; the later epochs read the data in this layout's order")
    before = {"input_order": 1, **saved}  # checkpoints older than INPUT_ORDER read records in order 1
    reordered = [f"{k} {before[k]} -> {now[k]}" for k in ORDER_KEYS if k in before and before[k] != now[k]]
    if reordered:
        warnings.append(f"resuming {where} with {', '.join(reordered)}: training continues from step {step}, "
                        "but the data order is not the one an uninterrupted run would have seen (records of "
                        "the interrupted epoch may be skipped or repeated)")
    if "epochs" in saved and saved["epochs"] != now["epochs"]:
        horizon = f"{int(saved['epochs']) * int(now['steps_per_epoch'])} -> {now['epochs'] * now['steps_per_epoch']}"
        effect = ("the learning-rate schedule's horizon moves with it" if now.get("lr_schedule", "constant") !=
                  "constant" else "train.lr_schedule is constant, so only the run's length changes")
        warnings.append(f"resuming {where} with train.epochs {saved['epochs']} -> {now['epochs']}: {effect} "
                        f"(decay steps {horizon}, train.lr_schedule {now.get('lr_schedule')}); from step {step} "
                        "the learning rate is not the one either run alone would have used")
    if "task_digest" in saved and saved["task_digest"] != now["task_digest"]:
        warnings.append(f"resuming {where} with a changed task config (digest {saved['task_digest']} -> "
                        f"{now['task_digest']}: the objective, e.g. task.target_transform, class weights or the "
                        "positive label): the saved weights are restored, but from here they learn another objective")
    if "model_digest" in saved and saved["model_digest"] != now["model_digest"]:
        warnings.append(f"resuming {where} with a changed model config (digest {saved['model_digest']} -> "
                        f"{now['model_digest']}): the saved weights still fit this model and are restored, "
                        "but the run is no longer the one that saved them")
    return warnings, offset


@dataclass(frozen=True)
class ResumePlan:
    """How this run continues from a checkpoint (see :func:`plan_resume`)."""

    step: int  # the checkpoint's global step
    step_offset: int  # global step = step_offset + layout step, in this run
    optimizer_shift: int  # added to the optimizer's step counter (another layout moves the schedule); else 0
    first_record: int  # records each rank has read: where its input stream restarts
    warnings: tuple[str, ...] = ()

    @property
    def layout_step(self) -> int:
        """Optimizer steps done in this run's layout (whole epochs of its steps_per_epoch, then the rest)."""
        return self.step - self.step_offset


def plan_resume(saved: dict[str, Any], now: dict[str, Any], where: str) -> ResumePlan:
    """Check a checkpoint's meta against this run's layout and say how to continue (pure).

    Raises what cannot resume (:func:`check_layout`). In another layout the
    optimizer's step counter moves by as many steps as the layout step moved,
    so the learning-rate schedule is at the same fraction of training and the
    steps the optimizer skipped (float16 overflow) stay skipped.
    """
    warnings, offset = check_layout(saved, now, where)
    step, saved_offset = int(saved["step"]), int(saved.get("step_offset", 0))
    layout_step = step - offset
    shift = layout_step - (step - saved_offset) if offset != saved_offset else 0
    return ResumePlan(step, offset, shift, layout_step * now["grad_accum_steps"] * now["batch_size"], tuple(warnings))


# -- saving ----------------------------------------------------------------------------

@dataclass(frozen=True)
class SaveTiming:
    """One checkpoint save as this rank's training thread saw it (the publish runs in the background)."""

    step: int
    seconds: float
    bytes: int  # model, optimizer and RNG state written (rank 0; 0 on the others, which only send)


def writer(cfg: CheckpointConfig) -> checkpoint.CheckpointWriter:
    """Rank 0's checkpoint writer for the ``checkpoint`` section (folder, retention)."""
    return checkpoint.CheckpointWriter(cfg.dir, cfg.keep_last, cfg.keep_best, cfg.best_metric, cfg.best_mode)


@dataclass(frozen=True)
class CheckpointMeta:
    """A checkpoint's meta.json, the one document :func:`load` reads back; written by the training loop's
    checkpoints and the elastic loop's alike, so the two cannot drift apart."""

    step: int
    epoch: int
    epoch_end: bool
    carried: Sequence[float]  # the interrupted epoch's rank-summed loss, correct and example sums
    carried_seconds: float
    history: list[dict[str, Any]]
    run_id: Optional[str]
    layout: dict[str, Any]
    metrics: dict[str, float] = field(default_factory=dict)
    stopped: bool = False
    early_stopping: Optional[dict[str, Any]] = None
    step_offset: int = 0

    def document(self) -> dict[str, Any]:
        """The JSON document (pure but for the clock)."""
        return {"format": FORMAT, "step": self.step, "epoch": self.epoch, "epoch_end": self.epoch_end,
                "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "metrics": self.metrics, "carried": [float(x) for x in self.carried],
                "carried_seconds": self.carried_seconds, "history": self.history, "stopped": self.stopped,
                "run_id": self.run_id, "early_stopping": self.early_stopping, "step_offset": self.step_offset,
                **self.layout}


def _layout_step(state: LoopState) -> int:
    """The state's layout step (``LoopState`` sets it to the global step when it was not given)."""
    return state.step if state.layout_step is None else state.layout_step


class Checkpointer(Hook):
    """The hook that saves checkpoints when :func:`checkpoint.save_due` says so (a collective)."""

    def __init__(self, ctx: TrainContext, model: Any, optimizer: Any, stopper: Optional[EarlyStopper] = None):
        self.ctx, self.cfg = ctx, ctx.cfg.checkpoint
        self.model, self.optimizer, self.stopper = model, optimizer, stopper
        self.wait_timeout = ctx.cfg.fault.checkpoint_timeout
        self.writer = writer(self.cfg) if ctx.rank.is_chief else None
        self.saved: list[int] = []
        self.last_save: Optional[SaveTiming] = None  # (step, seconds on this thread, state bytes) of the last save
        self.seconds = 0.0  # total seconds this rank's training thread spent saving

    def due(self, state: LoopState) -> bool:
        return self.pause_after(state.step, state.step if state.layout_step is None else state.layout_step)

    def pause_after(self, global_step: int, layout_step: int) -> bool:
        """Whether a checkpoint is due after that step (so a multi-step call ends there)."""
        if not self.cfg.enabled:
            return False
        return checkpoint.save_due(layout_step, self.ctx.steps, self.cfg.every_steps, self.cfg.at_epoch_end)

    def after_step(self, state: LoopState) -> None:
        if not self.due(state):
            return
        started = time.perf_counter()
        what = f"saving the checkpoint of step {state.step}"
        self.ctx.phase(what, self.wait_timeout)  # the others wait for rank 0's previous publish, on slow storage
        if self.writer is not None:
            self.writer.wait()
            self.ctx.phase(what)  # back to the stall timeout: rank 0 catches a peer frozen in the collectives
        carried = distributed.allreduce_sum(state.partial(), name=f"hvdtrain.ckpt{state.step}.sums")
        rng = distributed.allgather_object(to_numpy(seed_variables(self.model)), name=f"hvdtrain.ckpt{state.step}.rng")
        nbytes = 0
        if self.writer is not None:
            arrays = state_arrays(self.model, self.optimizer)
            for r, states in enumerate(rng):
                arrays.update({f"rng/rank{r}/{i:04d}": s for i, s in enumerate(states)})
            if self.stopper is not None and self.stopper.best_weights is not None:
                arrays.update({f"best/{i:04d}": w for i, w in enumerate(self.stopper.best_weights)})
            self.writer.save(state.step, arrays, self.meta(state, carried))
            nbytes = sum(int(a.nbytes) for a in arrays.values())
        self.saved.append(state.step)
        seconds = time.perf_counter() - started
        self.seconds += seconds
        self.last_save = SaveTiming(state.step, seconds, nbytes)

    def meta(self, state: LoopState, carried: np.ndarray) -> dict[str, Any]:
        """The checkpoint's meta.json (pure but for the clock)."""
        last = state.history[-1] if state.history and state.epoch_end else None
        metrics = {}
        if last is not None:
            metrics = {"train_loss": last.loss, "train_accuracy": last.accuracy}
            if last.validation is not None:
                metrics.update(scalar_metrics(last.validation, "validation"))
        return CheckpointMeta(
            step=state.step, epoch=state.epoch, epoch_end=state.epoch_end, carried=carried.tolist(),
            carried_seconds=state.epoch_seconds, history=[h.to_dict() for h in state.history],
            run_id=self.ctx.run_id, layout=self.ctx.layout, metrics=metrics, stopped=state.stopped,
            early_stopping={"values": self.stopper.values} if self.stopper is not None else None,
            step_offset=state.step - _layout_step(state)).document()

    def close(self) -> None:
        """Wait for the last publish (a collective: the other ranks wait for rank 0); raises if it failed."""
        self.ctx.phase("publishing the last checkpoint", self.wait_timeout)
        if self.writer is not None:
            self.writer.wait()
            self.ctx.phase("publishing the last checkpoint")
        distributed.barrier()


# -- resuming ---------------------------------------------------------------------------

@dataclass
class Resumed:
    """A checkpoint to continue from and how (on every rank; arrays on rank 0 only)."""

    uri: str
    meta: dict[str, Any]
    rng: list[list[np.ndarray]]
    plan: ResumePlan
    arrays: Optional[dict[str, np.ndarray]] = None

    @property
    def step(self) -> int:
        return self.plan.step

    @property
    def step_offset(self) -> int:
        return self.plan.step_offset

    @property
    def layout_step(self) -> int:
        return self.plan.layout_step

    @property
    def run_id(self) -> Optional[str]:
        return self.meta.get("run_id")

    @property
    def nbytes(self) -> int:
        """Bytes of state this rank read from the checkpoint (rank 0 reads; the others receive)."""
        return sum(int(a.nbytes) for a in self.arrays.values()) if self.arrays else 0

    def start(self, rank: distributed.RankInfo) -> Start:
        """The loop's starting point; the interrupted epoch's sums ride on rank 0 only."""
        known = {f.name for f in fields(EpochStats)}
        history = [EpochStats(**{k: v for k, v in h.items() if k in known}) for h in self.meta.get("history", [])]
        carried = np.array(self.meta.get("carried", [0.0, 0.0, 0.0]), np.float64) if rank.is_chief else None
        return Start(self.step, history, carried, float(self.meta.get("carried_seconds", 0.0)),
                     bool(self.meta.get("stopped", False)), self.step_offset)


def find(cfg: CheckpointConfig, rank: distributed.RankInfo, now: dict[str, Any]) -> Optional[Resumed]:
    """The checkpoint to resume from per ``checkpoint.resume``, with its plan (a collective: every rank calls it).

    Raises on every rank (never only on rank 0, which would leave the others
    waiting) when an explicit checkpoint is invalid or the dataset changed.
    """
    found: Optional[Resumed] = None
    error: Optional[str] = None
    kind = "data"
    if rank.is_chief and cfg.enabled:
        try:
            if cfg.resume == "never":
                refuse_used_dir(cfg)
                found = None
            else:
                found = load(cfg, now)
        except DataError as exc:
            error, kind = str(exc), "storage" if isinstance(exc, StorageError) else "data"
        except Exception as exc:  # raised on every rank below: rank 0 alone must not fail
            log.exception("reading checkpoint.dir %s failed", cfg.dir)
            error = (f"reading checkpoint.dir {cfg.dir} to resume from failed: {type(exc).__name__}: {exc}; "
                     "check the path and its permissions, or set checkpoint.resume=never")
    small = distributed.broadcast_object(
        {"error": error, "uri": found.uri, "meta": found.meta, "rng": found.rng, "plan": found.plan}
        if found else {"error": error, "kind": kind}, name="hvdtrain.training.resume")
    if small["error"]:
        raise (StorageError if small.get("kind") == "storage" else DataError)(small["error"])
    if "uri" not in small:
        return None
    if not rank.is_chief:
        found = Resumed(small["uri"], small["meta"], small["rng"], small["plan"])
    return found


def refuse_used_dir(cfg: CheckpointConfig) -> None:
    """``resume: never`` starts a fresh run: over committed checkpoints it would overwrite same-step ones and
    mix two runs under retention, so it needs an empty (or new) ``checkpoint.dir``."""
    committed = [i.name for i in checkpoint.scan(cfg.dir, verify=False) if i.status != "uncommitted"]
    if committed:
        raise DataError(f"checkpoint.resume=never, but checkpoint.dir {cfg.dir} holds committed checkpoints "
                        f"({', '.join(committed[-3:])}{', ...' if len(committed) > 3 else ''}): a fresh run would "
                        "overwrite and mix them; point checkpoint.dir at a new folder for a fresh run, move them "
                        "out, or set checkpoint.resume=auto to continue from the newest")


def load(cfg: CheckpointConfig, now: dict[str, Any]) -> Optional[Resumed]:
    """The checkpoint ``checkpoint.resume`` names (auto: the newest valid one), read by this process alone, with
    its plan against ``now``; None when there is none. Raises what cannot resume."""
    if cfg.resume == "auto":
        loaded = checkpoint.restore_latest(cfg.dir)
        if loaded is None:
            return None
        info, arrays, meta = loaded
    else:
        uri = cfg.resume
        info = checkpoint.inspect(uri, uri.rstrip("/").rsplit("/", 1)[-1], -1)
        if not info.valid:
            raise DataError(f"checkpoint.resume={uri}: {info.status} ({info.detail}); pick a valid one "
                            "(`hvdtrain checkpoints verify DIR` lists them), or set checkpoint.resume=auto")
        arrays, meta = checkpoint.load(info)
        newer = [i.name for i in checkpoint.scan(cfg.dir, verify=False) if i.step > int(meta["step"])]
        if newer:
            raise DataError(f"checkpoint.resume={uri} is at step {meta['step']}, but checkpoint.dir {cfg.dir} "
                            f"holds later checkpoints ({', '.join(newer)}): the resumed run would save over them "
                            "and `resume: auto` would later pick them up; move them out of checkpoint.dir "
                            "first, or set checkpoint.dir to a new folder")
    if meta.get("format") != FORMAT:
        raise DataError(f"checkpoint {info.uri} has format {meta.get('format')!r}, this hvdtrain reads {FORMAT}; "
                        "set checkpoint.resume=never or use a new checkpoint.dir")
    ranks = sorted({k.split("/")[1] for k in arrays if k.startswith("rng/")}, key=lambda r: int(r[4:]))
    rng = [group(arrays, f"rng/{r}") for r in ranks]
    log.info("resuming from %s (step %d, epoch %d)", info.uri, meta["step"], meta.get("epoch", 0))
    return Resumed(info.uri, meta, rng, plan_resume(meta, now, info.uri), arrays)


def apply(resumed: Resumed, model: Any, optimizer: Any, rank: distributed.RankInfo,
          stopper: Optional[EarlyStopper]) -> None:
    """Carry out a resume plan (a collective): rank 0 sets model and optimizer (broadcast them after
    this) and reports the plan's warnings; every rank sets its own dropout RNG state and the
    early-stopping history.

    A checkpoint that does not fit the model raises on every rank, not on rank 0 alone.
    """
    error = None
    if resumed.arrays is not None:
        for warning in resumed.plan.warnings:
            log.warning(warning)
        try:
            assign(model.weights, group(resumed.arrays, "model"), "model", resumed.uri)
            assign(optimizer.variables, group(resumed.arrays, "optimizer"), "optimizer", resumed.uri)
            if resumed.plan.optimizer_shift:  # another layout: the schedule moves with the layout step
                iterations = int(to_numpy([optimizer.iterations])[0])
                optimizer.iterations.assign(max(0, iterations + resumed.plan.optimizer_shift))
        except ANY_ERROR as exc:  # raised on every rank below: rank 0 alone must not fail
            error = str(exc) if isinstance(exc, DataError) else (
                f"restoring checkpoint {resumed.uri} failed: {type(exc).__name__}: {exc}")
    error = distributed.broadcast_object(error, name="hvdtrain.training.resume.apply")
    if error:
        raise DataError(error)
    seeds = seed_variables(model)
    if rank.rank < len(resumed.rng) and len(resumed.rng[rank.rank]) == len(seeds):
        for v, value in zip(seeds, resumed.rng[rank.rank]):
            v.assign(value)
    else:
        log.warning("checkpoint %s has no dropout RNG state for rank %d; this rank's dropout masks will differ "
                    "from an uninterrupted run", resumed.uri, rank.rank)
    if stopper is not None and resumed.meta.get("early_stopping"):
        best = group(resumed.arrays, "best") if resumed.arrays is not None else []
        stopper.restore(resumed.meta["early_stopping"]["values"], best or None)
    resumed.arrays = None  # the model holds them now; free the host copy before training
