"""The run's documents (pure): ``eval_report.json``, ``result.json``, the final MLflow metrics, weight digests."""
from __future__ import annotations

import datetime
import hashlib
from typing import Any, Optional, Sequence

import keras
import numpy as np

from hvdtrain.core import tasks
from hvdtrain.core.config import TrainConfig
from hvdtrain.hadoop import fs
from hvdtrain.model import evaluation
from hvdtrain.model.schedules import scaled_learning_rate
from hvdtrain.observe.events import EpochStats
from hvdtrain.runtime import distributed
from hvdtrain.training.context import TrainContext

CONFUSION_PNG = "confusion_matrix.png"
RESIDUALS_PNG = "residuals.png"  # a regression's test chart



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


def rank_digests(model: keras.Model, rank: distributed.RankInfo) -> list[dict[str, Any]]:
    """Every rank's weight digest, in rank order (an allgather: all ranks call it)."""
    mine = weights_digest([keras.ops.convert_to_numpy(w) for w in model.weights])
    where = {"rank": rank.rank, "host": rank.hostname, "cross_rank": rank.cross_rank, "local_rank": rank.local_rank,
             "local_size": rank.local_size}
    return distributed.allgather_object({**where, **mine}, name="hvdtrain.digests")


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
        "task": cfg.task.kind,
        "model": {"kind": cfg.model.kind, "builder": cfg.model.builder, "mixed_precision": cfg.train.mixed_precision},
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
        "decay_steps": steps * train.epoch_count, "clip_norm": train.clip_norm, "fp16_allreduce": train.fp16_allreduce,
        "allreduce": train.allreduce,
        "skipped_steps": sum(h.skipped_steps for h in history),
        "seconds": seconds, "samples_per_sec": examples / seconds if seconds > 0 else 0.0,
        "history": [h.to_dict() for h in history],
    }


EXPORTS = {"keras": "model.keras", "saved_model": "saved_model", "labels": "labels.json", "tokenizer": "tokenizer.json",
           "confusion_matrix": CONFUSION_PNG, "residuals": RESIDUALS_PNG}


def result_record(run_id: Optional[str], report: dict[str, Any], output: str, written: Sequence[str] = (),
                  model_uri: Optional[str] = None, tracking_uri: Optional[str] = None) -> dict[str, Any]:
    """The result.json document (pure); ``exports`` lists only the exports in ``written`` (names in the output)."""
    test, validation = report["evaluation"]["test"], report["evaluation"]["validation"]
    task = test.get("task", "multiclass")
    return {
        "run_id": run_id,
        "tracking_uri": tracking_uri,
        "mlflow_model_uri": model_uri,
        "task": task,
        "test_accuracy": test.get("accuracy"),
        "test_macro_f1": test.get("macro_f1"),
        "test_roc_auc": test.get("roc_auc"),
        "validation_accuracy": validation.get("accuracy"),
        "test_metrics": {k: test[k] for k in tasks.METRICS[task] if test.get(k) is not None},
        "validation_metrics": {k: validation[k] for k in tasks.METRICS[task] if validation.get(k) is not None},
        "ranks_agree": report["rank_digest"]["agree"],
        "world_size": report["training"]["world_size"],
        "epochs_run": report["training"]["epochs"],
        "skipped_steps": report["training"].get("skipped_steps", 0),
        "restarts": len(report.get("restarts", [])),
        "report": fs.join(output, "eval_report.json"),
        "exports": {key: fs.join(output, name) for key, name in EXPORTS.items() if name in written},
    }


def final_metrics(report: dict[str, Any]) -> dict[str, float]:
    """End-of-run MLflow metrics from the report (pure)."""
    out = {"train_samples_per_sec": report["training"]["samples_per_sec"]}
    for split, result in report["evaluation"].items():
        out.update(evaluation.scalar_metrics(result, split))
    return out
