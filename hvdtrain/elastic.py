"""Elastic training: hvdtrain's step under Horovod elastic mode, resizing without a process restart.

``train.elastic: {min_ranks, max_ranks}`` makes ``hvdtrain train`` launch an
elastic horovodrun (:func:`hvdtrain.elastic_plan.horovodrun_command`) whose ranks run :func:`run`.

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
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

from hvdtrain import config as config_lib
from hvdtrain import console, data, distributed, fs, heads
from hvdtrain import train as train_lib
from hvdtrain.config import JobConfig
from hvdtrain.data import plan as data_plan
from hvdtrain.elastic_plan import gradient_scale, virtual_ranks
from hvdtrain.errors import HvdtrainError
from hvdtrain.training import evaluation, runtime
from hvdtrain.training import steps as steps_lib
from hvdtrain.training.reports import weights_digest
from hvdtrain.training.state import build_state

log = logging.getLogger("hvdtrain.elastic")


# -- act ------------------------------------------------------------------------------------------------

@dataclass
class Job:
    """What every (re)start of the elastic function needs."""

    cfg: JobConfig
    manifest: Any
    shape: Any
    steps: int  # optimizer steps per epoch, fixed by the virtual world
    virtual: int
    stage_dir: str


class VirtualStep:
    """One optimizer step over this rank's virtual batches; the update is the mean over all virtual batches."""

    def __init__(self, model: Any, optimizer: Any, shape: Any):
        self.model, self.optimizer, self.shape = model, optimizer, shape
        self._head = heads.Head(task=getattr(shape, "task", "multiclass"))  # the task's loss
        self._compiled = tf.function(self._step, autograph=False)  # plain Python over the list of batches

    def _step(self, batches: Sequence[dict[str, Any]], scale: tf.Tensor) -> tf.Tensor:
        total, loss_sum = None, tf.constant(0.0, tf.float64)
        for batch in batches:
            grads, loss, _ = steps_lib._gradients(self.model, self.optimizer, self._head, batch, self.shape.inputs,
                                                  self.shape.label_feature)
            total = grads if total is None else [_add(a, b) for a, b in zip(total, grads)]
            loss_sum += loss
        assert total is not None, "a virtual step has at least one batch"
        averaged = distributed.allreduce_grads(total)
        self.optimizer.apply([g * tf.cast(scale, g.dtype) for g in averaged], self.model.trainable_variables)
        return loss_sum

    def __call__(self, batches: Sequence[dict[str, Any]], scale: float) -> Any:
        return self._compiled(list(batches), tf.constant(scale, tf.float32))


def _add(a: Any, b: Any) -> Any:
    """Sum of two gradients of one variable; an embedding's tf.IndexedSlices has no ``+`` (densified here, as
    :func:`hvdtrain.distributed.allreduce_grads` sends it dense anyway)."""
    if isinstance(a, tf.IndexedSlices) or isinstance(b, tf.IndexedSlices):
        return tf.convert_to_tensor(a) + tf.convert_to_tensor(b)
    return a + b


def _streams(job: Job, owned: Sequence[int], step: int) -> list[Iterator[dict[str, Any]]]:
    """The batch streams of ``owned`` virtual ranks, each after ``step`` batches (traced when asked)."""
    train = job.cfg.train
    trace = train.record_trace
    features = [*job.shape.inputs, job.shape.label_feature, *([data.KEY_FEATURE] if trace else [])]
    out = []
    for v in owned:
        stream = data.TrainStream(v, job.virtual, train.batch_size, train.shuffle_buffer, train.seed,
                                  records_per_epoch=job.steps * train.batch_size)
        batches = iter(data.train_dataset(job.manifest, stream, features=features, stage_dir=job.stage_dir,
                                          start_record=step * train.batch_size))
        out.append(data.trace_batches(batches, fs.local_path(trace), v, step) if trace else batches)
    return out


def _loop(job: Job, state: Any, step_fn: VirtualStep, sizes: list[int]) -> None:
    """Train from the committed step to the end; the body of ``hvd.elastic.run`` (re-run after each reset)."""
    rank = distributed.refresh()
    owned = virtual_ranks(rank.rank, rank.size, job.virtual)
    sizes.append(rank.size)
    log.info("elastic: %d ranks from step %d; rank %d runs virtual ranks %s", rank.size, state.step, rank.rank, owned)
    streams = _streams(job, owned, state.step)
    elastic_cfg = job.cfg.train.elastic
    assert elastic_cfg is not None  # this module runs only for train.elastic
    total, every = job.cfg.train.epochs * job.steps, elastic_cfg.commit_every_steps
    while state.step < total:
        step_fn([next(s) for s in streams], gradient_scale(rank.size, job.virtual))
        state.step += 1
        if state.step % every == 0 or state.step == total:
            state.commit()


def _evaluate(job: Job, model: Any) -> dict[str, Any]:
    """The test split's accuracy, every record counted once over the final world."""
    rank = distributed.refresh()
    eval_step = steps_lib.make_eval_step(model, job.shape.label_feature, job.shape.inputs)
    batches = data.eval_dataset(job.manifest, "test", rank=rank.rank, size=rank.size,
                                batch_size=job.cfg.train.batch_size,
                                features=[*job.shape.inputs, job.shape.label_feature], stage_dir=job.stage_dir)
    empty = evaluation.empty_counts("multiclass", job.shape.num_classes, rank.rank, rank.size)
    counts = evaluation.allreduce_counts(evaluation.count_split(eval_step, batches, job.shape.label_feature, empty),
                                         "test")
    return {"records": counts.records, "accuracy": float(np.trace(counts.confusion)) / max(counts.records, 1)}


def run(cfg: JobConfig) -> dict[str, Any]:
    """Train under Horovod elastic mode; returns the result record on every rank (rank 0 writes result.json)."""
    rank = distributed.init()
    runtime.configure_logging(rank)
    threads = runtime.configure_tf(rank, cfg.train)
    manifest, shape, _ = train_lib.plan(cfg, rank)
    assert cfg.train.elastic is not None  # this module runs only for train.elastic
    virtual = cfg.train.elastic.max_ranks
    steps = data_plan.steps_per_epoch(manifest.split("train").records, cfg.train.batch_size, virtual)
    model, optimizer = build_state(cfg, shape, virtual, cfg.train.epochs * steps)
    step_fn, sizes = VirtualStep(model, optimizer, shape), list[int]()
    state = distributed.elastic_state(model, optimizer, step=0)
    with tempfile.TemporaryDirectory(prefix=f"hvdtrain-stage-{rank.hostname}-") as stage_dir:
        job = Job(cfg, manifest, shape, steps, virtual, stage_dir)
        distributed.elastic_run(lambda s: _loop(job, s, step_fn, sizes))(state)
        test = _evaluate(job, model)
    rank = distributed.refresh()
    digests = distributed.allgather_object(
        weights_digest([keras.ops.convert_to_numpy(w) for w in model.weights]), name="hvdtrain.elastic.digests")
    result = {"world_size": rank.size, "sizes": sizes, "steps": int(state.step), "steps_per_epoch": steps,
              "virtual_ranks": virtual, "global_batch": virtual * cfg.train.batch_size, "threads": threads,
              "test_accuracy": test["accuracy"], "test_records": test["records"],
              "ranks_agree": len({d["sha256"] for d in digests}) == 1}
    if rank.is_chief:
        fs.write_bytes_atomic(fs.join(cfg.train.output, "result.json"), (json.dumps(result, indent=2) + "\n").encode())
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m hvdtrain.elastic CONFIG [key=value ...]``, under an elastic horovodrun."""
    parser = argparse.ArgumentParser(prog="python -m hvdtrain.elastic", description=__doc__.split("\n")[0])
    parser.add_argument("config", help="job config YAML with train.elastic set")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    args = parser.parse_intermixed_args(argv)
    try:
        result = run(config_lib.load(args.config, args.overrides))
    except HvdtrainError as exc:
        return console.report_error(exc, "hvdtrain")
    if distributed.info().is_chief:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
