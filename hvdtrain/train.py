"""Data-parallel training: the function every launcher runs on every rank.

``run(cfg)`` is called by the CLI, by ``horovodrun -np N python -m
hvdtrain.train CONFIG [key=value ...]`` and by the YARN launcher. Each rank:

1. initializes Horovod (or a single process), reads the manifest and checks it
   fits the model before any work;
2. builds its input stream (see :mod:`hvdtrain.data`), the model and Adam
   (learning rate ``train.learning_rate * size``, linear warm-up), then takes
   rank 0's initial weights and optimizer state;
3. trains ``train.epochs`` epochs of ``steps_per_epoch`` steps: plain
   ``tf.GradientTape``, gradients averaged with one grouped all-reduce;
   per-epoch loss and accuracy are summed exactly over ranks;
4. evaluates validation and test exactly (each rank's confusion matrix, summed);
5. checks that every rank ends with the same weights (digests gathered to rank 0).

Rank 0 then writes to ``train.output``: ``eval_report.json``, ``model.keras``,
``saved_model/`` (``model.export``, for serving), ``labels.json`` and
``result.json``, and logs the run to MLflow (:mod:`hvdtrain.tracking`).
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import logging
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

from hvdtrain import config as config_lib
from hvdtrain import data, distributed, fs, metrics, tracking
from hvdtrain import manifest as manifest_lib
from hvdtrain.config import JobConfig
from hvdtrain.errors import HvdtrainError
from hvdtrain.manifest import Manifest
from hvdtrain.models import build_model

log = logging.getLogger("hvdtrain.train")
EVAL_SPLITS = ("validation", "test")


# -- pure helpers -------------------------------------------------------------------

def scaled_learning_rate(base: float, size: int) -> float:
    """Linear scaling: the global batch grows with the rank count, so does the step size."""
    return base * size


def warmup_learning_rate(step: int, peak: float, warmup_steps: int) -> float:
    """Rate at optimizer step ``step`` (0-based): linear ramp to ``peak`` over ``warmup_steps``."""
    return peak if warmup_steps <= 0 else peak * min(1.0, (step + 1) / warmup_steps)


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


@dataclass
class EpochStats:
    epoch: int
    steps: int
    examples: int
    loss: float
    accuracy: float
    seconds: float

    @property
    def samples_per_sec(self) -> float:
        return self.examples / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "samples_per_sec": self.samples_per_sec}


def epoch_stats(epoch: int, steps: int, totals: np.ndarray, seconds: float) -> EpochStats:
    """From rank-summed [loss sum, correct, examples]: exact means, not a mean of means."""
    loss_sum, correct, examples = (float(x) for x in totals)
    return EpochStats(epoch, steps, int(examples), loss_sum / max(examples, 1), correct / max(examples, 1), seconds)


# -- model, optimizer, steps ---------------------------------------------------------------

class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """``warmup_learning_rate`` as a Keras schedule over the optimizer's step counter."""

    def __init__(self, peak: float, warmup_steps: int):
        self.peak, self.warmup_steps = float(peak), int(warmup_steps)

    def __call__(self, step: Any) -> Any:
        if self.warmup_steps <= 0:
            return keras.ops.convert_to_tensor(self.peak, "float32")
        ramp = (keras.ops.cast(step, "float32") + 1.0) / float(self.warmup_steps)
        return self.peak * keras.ops.minimum(1.0, ramp)

    def get_config(self) -> dict[str, Any]:
        return {"peak": self.peak, "warmup_steps": self.warmup_steps}


def build_state(cfg: JobConfig, shape: data.InputShape, size: int) -> tuple[keras.Model, keras.optimizers.Optimizer]:
    """Model and built optimizer, ready for broadcast_state()."""
    model = build_model(cfg.model, shape.vocab_size, shape.max_length, shape.num_classes)
    peak = scaled_learning_rate(cfg.train.learning_rate, size)
    optimizer = keras.optimizers.Adam(learning_rate=WarmupSchedule(peak, cfg.train.warmup_steps))
    optimizer.build(model.trainable_variables)
    return model, optimizer


def make_train_step(model: keras.Model, optimizer: keras.optimizers.Optimizer,
                    label_feature: str) -> Callable[[dict[str, tf.Tensor]], tuple[tf.Tensor, tf.Tensor]]:
    """A compiled step returning this rank's (sum of losses, correct predictions) for the batch."""
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    @tf.function
    def train_step(batch: dict[str, tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor]:
        labels = batch[label_feature]
        with tf.GradientTape() as tape:
            logits = model({k: batch[k] for k in data.MODEL_INPUTS}, training=True)
            per_example = loss_fn(labels, logits)
            loss = tf.reduce_mean(per_example)
        grads = tape.gradient(loss, model.trainable_variables)
        grads = distributed.allreduce_grads(grads)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, axis=-1), labels), tf.float64))
        return tf.reduce_sum(tf.cast(per_example, tf.float64)), correct

    return train_step


def make_predict_step(model: keras.Model) -> Callable[[dict[str, tf.Tensor]], tf.Tensor]:
    @tf.function(reduce_retracing=True)
    def predict(inputs: dict[str, tf.Tensor]) -> tf.Tensor:
        return tf.argmax(model(inputs, training=False), axis=-1)

    return predict


# -- the loop ------------------------------------------------------------------------------

def fit(train_step: Callable, batches: Iterator[dict[str, tf.Tensor]], epochs: int, steps: int,
        batch_size: int, on_epoch: Callable[[EpochStats], None]) -> list[EpochStats]:
    """Run ``epochs`` x ``steps`` steps on the shared stream; stats are summed over ranks."""
    history = []
    for epoch in range(1, epochs + 1):
        start = time.perf_counter()
        loss_sums, corrects = [], []
        for _ in range(steps):
            loss_sum, correct = train_step(next(batches))
            loss_sums.append(loss_sum)
            corrects.append(correct)
        local = np.array([float(tf.add_n(loss_sums)), float(tf.add_n(corrects)), steps * batch_size], np.float64)
        totals = distributed.allreduce_sum(local, name=f"hvdtrain.epoch{epoch}")
        stats = epoch_stats(epoch, steps, totals, time.perf_counter() - start)
        on_epoch(stats)
        history.append(stats)
    return history


def evaluate(predict: Callable, batches: Any, label_feature: str, num_classes: int, name: str) -> np.ndarray:
    """The confusion matrix over every rank's part of a split (exact: summed counts)."""
    cm = np.zeros((num_classes, num_classes), np.int64)
    for batch in batches:
        preds = predict({k: batch[k] for k in data.MODEL_INPUTS})
        cm += metrics.confusion_matrix(batch[label_feature].numpy(), preds.numpy(), num_classes)
    return distributed.allreduce_sum(cm, name=f"hvdtrain.eval.{name}")


# -- run -------------------------------------------------------------------------------------

def run(cfg: JobConfig) -> dict[str, Any]:
    """Train, evaluate and (rank 0) export and track one job; returns the result record on every rank."""
    rank = distributed.init()
    _configure_logging(rank)
    _configure_tf(rank, cfg.train.seed)
    manifest = manifest_lib.read(cfg.etl.output)
    shape = data.check_manifest(manifest, cfg.model)
    steps = data.steps_per_epoch(manifest.split("train").records, cfg.train.batch_size, rank.size)
    log.info("world size %d (%s), dataset %s (digest %s), %d steps/epoch x %d epochs, global batch %d",
             rank.size, rank.backend, manifest.root, manifest.digest(), steps, cfg.train.epochs,
             cfg.train.batch_size * rank.size)
    with tracking.start(cfg, rank.is_chief, _run_tags(manifest, rank)) as tracker, \
            tempfile.TemporaryDirectory(prefix="hvdtrain-stage-") as stage_dir:
        tracker.log_params({**tracking.flat_params(cfg), **_run_params(cfg, rank, steps)})
        model, history = _train(cfg, manifest, shape, rank, steps, stage_dir, tracker)
        evaluation = _evaluate_splits(model, manifest, shape, cfg, rank, stage_dir)
        report = build_report(cfg, manifest, rank, steps, history, evaluation, _rank_digests(model, rank))
        if not rank.is_chief:
            return result_record(tracker.run_id, report, cfg.train.output, exported=False)
        result = publish(cfg, manifest, shape, model, report, tracker)
    log.info("test accuracy %.4f, macro F1 %.4f; outputs in %s", evaluation["test"]["accuracy"],
             evaluation["test"]["macro_f1"], cfg.train.output)
    return result


def _train(cfg: JobConfig, manifest: Manifest, shape: data.InputShape, rank: distributed.RankInfo, steps: int,
           stage_dir: str, tracker: tracking.Tracker) -> tuple[keras.Model, list[EpochStats]]:
    """Build, take rank 0's initial state, and fit; logs one line per epoch on rank 0."""
    model, optimizer = build_state(cfg, shape, rank.size)
    distributed.broadcast_state(model, optimizer)
    batches = iter(data.train_dataset(
        manifest, rank=rank.rank, size=rank.size, batch_size=cfg.train.batch_size,
        shuffle_buffer=cfg.train.shuffle_buffer, seed=cfg.train.seed,
        features=[*data.MODEL_INPUTS, shape.label_feature], stage_dir=stage_dir))

    def on_epoch(stats: EpochStats) -> None:
        log.info("epoch %d/%d: loss %.4f, accuracy %.4f, %d samples in %.1fs (%.0f samples/s)", stats.epoch,
                 cfg.train.epochs, stats.loss, stats.accuracy, stats.examples, stats.seconds, stats.samples_per_sec)
        tracker.log_metrics({"train_loss": stats.loss, "train_accuracy": stats.accuracy,
                             "samples_per_sec": stats.samples_per_sec}, step=stats.epoch)

    history = fit(make_train_step(model, optimizer, shape.label_feature), batches, cfg.train.epochs, steps,
                  cfg.train.batch_size, on_epoch)
    return model, history


def _rank_digests(model: keras.Model, rank: distributed.RankInfo) -> list[dict[str, Any]]:
    """Every rank's weight digest, in rank order (an allgather: all ranks call it)."""
    mine = weights_digest([keras.ops.convert_to_numpy(w) for w in model.weights])
    return distributed.allgather_object({"rank": rank.rank, "host": rank.hostname, **mine}, name="hvdtrain.digests")


def _evaluate_splits(model: keras.Model, manifest: Manifest, shape: data.InputShape, cfg: JobConfig,
                     rank: distributed.RankInfo, stage_dir: str) -> dict[str, dict[str, Any]]:
    predict = make_predict_step(model)
    out = {}
    for split in EVAL_SPLITS:
        batches = data.eval_dataset(manifest, split, rank=rank.rank, size=rank.size,
                                    batch_size=cfg.train.batch_size,
                                    features=[*data.MODEL_INPUTS, shape.label_feature], stage_dir=stage_dir)
        cm = evaluate(predict, batches, shape.label_feature, shape.num_classes, split)
        expected = manifest.split(split).records
        out[split] = {**metrics.report(cm, manifest.labels), "expected_records": expected,
                      "complete": int(cm.sum()) == expected}
        if int(cm.sum()) != expected:
            log.warning("%s: evaluated %d records but the manifest lists %d", split, int(cm.sum()), expected)
    return out


def build_report(cfg: JobConfig, manifest: Manifest, rank: distributed.RankInfo, steps: int,
                 history: list[EpochStats], evaluation: dict[str, Any], digests: list[dict[str, Any]]) -> dict:
    """The eval_report.json document (pure)."""
    seconds = sum(h.seconds for h in history)
    examples = sum(h.examples for h in history)
    return {
        "job": cfg.name,
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "dataset": {"location": manifest.root, "manifest_digest": manifest.digest(),
                    "records": {name: split.records for name, split in manifest.splits.items()}},
        "labels": manifest.labels,
        "training": {
            "world_size": rank.size, "backend": rank.backend, "epochs": len(history), "steps_per_epoch": steps,
            "steps": steps * len(history), "batch_size_per_rank": cfg.train.batch_size,
            "global_batch_size": cfg.train.batch_size * rank.size,
            "learning_rate": scaled_learning_rate(cfg.train.learning_rate, rank.size),
            "warmup_steps": cfg.train.warmup_steps, "seconds": seconds,
            "samples_per_sec": examples / seconds if seconds > 0 else 0.0,
            "history": [h.to_dict() for h in history],
        },
        "evaluation": evaluation,
        "rank_digest": rank_agreement(digests),
    }


def result_record(run_id: Optional[str], report: dict[str, Any], output: str, exported: bool,
                  model_uri: Optional[str] = None, tracking_uri: Optional[str] = None) -> dict[str, Any]:
    """The result.json document (pure)."""
    test = report["evaluation"]["test"]
    return {
        "run_id": run_id,
        "tracking_uri": tracking_uri,
        "mlflow_model_uri": model_uri,
        "test_accuracy": test["accuracy"],
        "test_macro_f1": test["macro_f1"],
        "validation_accuracy": report["evaluation"]["validation"]["accuracy"],
        "ranks_agree": report["rank_digest"]["agree"],
        "world_size": report["training"]["world_size"],
        "report": fs.join(output, "eval_report.json"),
        "exports": {"keras": fs.join(output, "model.keras"), "saved_model": fs.join(output, "saved_model"),
                    "labels": fs.join(output, "labels.json")} if exported else {},
    }


# -- rank 0: files and tracking ----------------------------------------------------------------

def publish(cfg: JobConfig, manifest: Manifest, shape: data.InputShape, model: keras.Model,
            report: dict[str, Any], tracker: tracking.Tracker) -> dict[str, Any]:
    """Write report, exports and result to ``train.output`` and log them to MLflow."""
    output = cfg.train.output
    with tempfile.TemporaryDirectory(prefix="hvdtrain-out-") as local:
        _dump_json(os.path.join(local, "eval_report.json"), report)
        _dump_json(os.path.join(local, "labels.json"), labels_document(manifest, shape))
        model.save(os.path.join(local, "model.keras"))
        model.export(os.path.join(local, "saved_model"), verbose=False)
        model_uri = _log_run_end(tracker, cfg, manifest, shape, model, report, local)
        result = result_record(tracker.run_id, report, output, exported=True, model_uri=model_uri,
                               tracking_uri=tracker.tracking_uri)
        _dump_json(os.path.join(local, "result.json"), result)
        upload_dir(local, output)
    return result


def labels_document(manifest: Manifest, shape: data.InputShape) -> dict[str, Any]:
    """What a server needs beside the model: label names and how inputs were made."""
    return {"labels": manifest.labels, "label_feature": shape.label_feature, "max_length": shape.max_length,
            "inputs": list(data.MODEL_INPUTS), "outputs": "logits", "preprocessing": manifest.preprocessing,
            "vocab": manifest.vocab, "manifest_digest": manifest.digest(), "dataset": manifest.root}


def _log_run_end(tracker: tracking.Tracker, cfg: JobConfig, manifest: Manifest, shape: data.InputShape,
                 model: keras.Model, report: dict[str, Any], local: str) -> Optional[str]:
    final = {}
    for split, result in report["evaluation"].items():
        final[f"{split}_accuracy"] = result["accuracy"]
        final[f"{split}_macro_f1"] = result["macro_f1"]
    tracker.log_metrics({**final, "train_samples_per_sec": report["training"]["samples_per_sec"]})
    tracker.set_tags({"ranks_agree": report["rank_digest"]["agree"]})
    tracker.log_text(cfg.to_yaml(), "config.yaml")
    tracker.log_text(manifest.to_json(), "manifest.json")
    tracker.log_artifact(os.path.join(local, "eval_report.json"))
    tracker.log_artifact(os.path.join(local, "labels.json"))
    tracker.log_artifact(os.path.join(local, "saved_model"), "serving")
    return tracker.log_keras_model(model, shape.max_length, shape.num_classes)


def upload_dir(local: str, output: str) -> None:
    """Copy a local folder's files into ``output`` (local or remote); each file lands atomically.

    ``saved_model/`` is replaced as a whole so no file of an older export survives.
    """
    if fs.exists(fs.join(output, "saved_model")):
        fs.delete(fs.join(output, "saved_model"))
    fs.makedirs(output)
    for root, _, files in os.walk(local):
        for name in sorted(files):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, local).replace(os.sep, "/")
            with open(path, "rb") as fh:
                fs.write_bytes_atomic(fs.join(output, *rel.split("/")), fh.read())


def _dump_json(path: str, doc: Any) -> None:
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=2, sort_keys=False)
        fh.write("\n")


def _run_tags(manifest: Manifest, rank: distributed.RankInfo) -> dict[str, str]:
    tags = {"manifest_digest": manifest.digest(), "dataset": manifest.root, "horovod_size": str(rank.size),
            "distributed_backend": rank.backend}
    commit = tracking.git_commit(os.path.dirname(os.path.abspath(__file__)))
    if commit:
        tags["git_commit"] = commit
    return tags


def _run_params(cfg: JobConfig, rank: distributed.RankInfo, steps: int) -> dict[str, Any]:
    return {"horovod.size": rank.size, "steps_per_epoch": steps,
            "global_batch_size": cfg.train.batch_size * rank.size,
            "scaled_learning_rate": scaled_learning_rate(cfg.train.learning_rate, rank.size)}


def _configure_logging(rank: distributed.RankInfo) -> None:
    """Plain lines from rank 0; other ranks report warnings and errors only."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format=f"%(asctime)s [rank {rank.rank}] %(levelname)s %(message)s",
                            datefmt="%H:%M:%S")
    logging.getLogger("hvdtrain").setLevel(logging.INFO if rank.is_chief else logging.WARNING)
    logging.getLogger("tensorflow").setLevel(logging.WARNING)  # e.g. "Assets written to" on export


def _configure_tf(rank: distributed.RankInfo, seed: int) -> None:
    """Share the host's cores among its ranks; seed each rank differently (weights come from rank 0)."""
    threads = max(1, (os.cpu_count() or 1) // rank.local_size)
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(min(threads, 2))
    except RuntimeError:  # TensorFlow already started (run() called twice in one process)
        pass
    keras.utils.set_random_seed(seed + rank.rank)


# -- command line ---------------------------------------------------------------------------

def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m hvdtrain.train CONFIG [key=value ...]`` (also under horovodrun)."""
    parser = argparse.ArgumentParser(prog="python -m hvdtrain.train", description=__doc__.split("\n")[0])
    parser.add_argument("config", help="job config YAML")
    parser.add_argument("overrides", nargs="*", help="section.key=value, e.g. train.epochs=2")
    args = parser.parse_args(argv)
    try:
        result = run(config_lib.load(args.config, args.overrides))
    except HvdtrainError as exc:
        print(f"hvdtrain: error: {exc}", file=sys.stderr)
        return 2
    if distributed.info().is_chief:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
