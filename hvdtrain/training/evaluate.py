"""Evaluating a split on every rank: this rank's part of the data, counted, then summed over ranks."""
from __future__ import annotations

import logging
from typing import Any

import keras

from hvdtrain import data
from hvdtrain.model import evaluation, heads
from hvdtrain.training import steps as steps_lib
from hvdtrain.training.context import TrainContext

log = logging.getLogger("hvdtrain.training.train")
EVAL_SPLITS = ("validation", "test")


def task_head(ctx: TrainContext) -> heads.Head:
    """The task's loss and decisions (with ``task.class_weights`` from the training split's class counts)."""
    return heads.for_task(ctx.cfg.task, ctx.manifest.labels, ctx.manifest.split("train").class_counts(),
                          ctx.manifest.preprocessing.get("target"))


def make_eval_step(ctx: TrainContext, model: keras.Model) -> Any:
    """The compiled evaluation step of the run's task, over the features the model reads."""
    return steps_lib.make_eval_step(model, ctx.shape.label_feature, steps_lib.input_names(model), task_head(ctx))


def evaluate_split(ctx: TrainContext, eval_step: Any, split: str) -> dict[str, Any]:
    """One split's report from counts summed over ranks (a collective: every rank calls it)."""
    shape, rank = ctx.shape, ctx.rank
    batches = data.with_threads(data.eval_dataset(ctx.manifest, split, rank=rank.rank, size=rank.size,
                                                  batch_size=ctx.cfg.train.batch_size,
                                                  features=list(shape.read_features),
                                                  stage_dir=ctx.stage_dir), ctx.threads)
    empty = evaluation.empty_counts(ctx.cfg.task.kind, shape.num_classes, rank.rank, rank.size)
    local = evaluation.count_split(eval_step, batches, shape.label_feature, empty,
                                   on_batch=lambda: ctx.phase(f"evaluating the {split} split"),
                                   threshold=ctx.cfg.task.threshold)
    ctx.phase(f"all-reducing the {split} split's counts")
    counts = evaluation.allreduce_counts(local, split)
    expected = ctx.manifest.split(split).records
    if counts.records != expected:
        log.warning("%s: evaluated %d records but the manifest lists %d", split, counts.records, expected)
    return evaluation.split_report(counts, ctx.manifest.labels, expected)


def evaluate_splits(ctx: TrainContext, model: keras.Model) -> dict[str, dict[str, Any]]:
    eval_step = make_eval_step(ctx, model)
    return {split: evaluate_split(ctx, eval_step, split) for split in EVAL_SPLITS}
