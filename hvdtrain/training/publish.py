"""Rank 0's outputs: files in ``train.output`` (replaced whole, see :func:`hvdtrain.hadoop.fs.swap_in`) and MLflow."""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import uuid
from typing import Any, Callable, Optional

import keras
import numpy as np

from hvdtrain import data
from hvdtrain.core import secrets
from hvdtrain.core.config import ModelConfig, TaskConfig
from hvdtrain.core.errors import ANY_ERROR, DataError, StorageError
from hvdtrain.data.manifest import Manifest
from hvdtrain.hadoop import fs, ledger
from hvdtrain.model import heads
from hvdtrain.observe import plots, tensorboard
from hvdtrain.observe import timeline as timeline_lib
from hvdtrain.runtime import launch
from hvdtrain.training.context import TrainContext
from hvdtrain.training.evaluate import task_head
from hvdtrain.training.reports import CONFUSION_PNG, RESIDUALS_PNG, final_metrics, result_record

log = logging.getLogger("hvdtrain.training.train")
RESULT_NAME = "result.json"  # written last into train.output
WRITER = "hvdtrain train"  # the writer named in train.output's ledger (hvdtrain.hadoop.ledger)



def publish(ctx: TrainContext, model: keras.Model, report: dict[str, Any],
            extra: Optional[dict[str, Any]] = None, before_replace: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Write report, chart, exports and result to ``train.output`` and log them to MLflow; ``extra`` joins the
    result record (an elastic job's sizes and steps); ``before_replace`` runs right before the new outputs
    take ``train.output``'s place (the lease check, :mod:`hvdtrain.training.leases`)."""
    output, tracker = ctx.cfg.train.output, ctx.tracker
    model = heads.serving_model(model, task_head(ctx))  # a regression's outputs in the target's units
    with tempfile.TemporaryDirectory(prefix="hvdtrain-out-") as local:
        _dump_json(os.path.join(local, "eval_report.json"), report)
        _dump_json(os.path.join(local, "labels.json"), labels_document(ctx.manifest, ctx.shape, ctx.cfg.model,
                                                                        ctx.cfg.task))
        _copy_tokenizer(ctx.manifest, local)
        png = _test_chart(report, local)
        model.save(os.path.join(local, "model.keras"))
        model.export(os.path.join(local, "saved_model"), verbose=False)
        recorded = os.path.join(ctx.stage_dir, timeline_lib.FILENAME)  # train.timeline's capture, if any
        if os.path.isfile(recorded):
            shutil.copy(recorded, local)
        tensorboard.copy_events(os.path.join(ctx.stage_dir, tensorboard.FOLDER), local)
        tracker.progress = lambda what: ctx.phase(f"MLflow: {what}", ctx.cfg.fault.checkpoint_timeout)
        model_uri = _log_run_end(ctx, model, report, local, png)
        tracker.flush()  # ride out an outage before saying what MLflow has
        result = {**result_record(tracker.run_id, report, output, os.listdir(local), model_uri=model_uri,
                                  tracking_uri=(secrets.redact_url(tracker.tracking_uri)
                                                            if tracker.tracking_uri else None)), "tracking": tracker.summary(),
                  **(extra or {})}
        _dump_json(os.path.join(local, RESULT_NAME), result)
        upload_dir(local, output, lambda what: ctx.phase(what, ctx.cfg.fault.checkpoint_timeout), before_replace)
    return result


def _test_chart(report: dict[str, Any], folder: str) -> Optional[str]:
    """The test split's chart as a PNG: the confusion matrix, or for a regression the residuals; a charting
    failure only warns (multilabel has per-label figures in the report instead)."""
    test = report["evaluation"]["test"]
    try:
        if "confusion_matrix" in test:
            title = f"{report['job']}: test split, accuracy {test['accuracy']:.4f}"
            return plots.confusion_matrix_png(np.array(test["confusion_matrix"]), report["labels"],
                                              os.path.join(folder, CONFUSION_PNG), title)
        if test.get("residual_sample"):
            title = f"{report['job']}: test split, RMSE {test['rmse']:.4g}, R\u00b2 {test['r2']:.4f}"
            return plots.residuals_png(test["residual_sample"], os.path.join(folder, RESIDUALS_PNG), title)
    except ANY_ERROR as exc:  # a chart is not worth failing a finished training for
        log.warning("could not draw the test split's chart (%s: %s); the report has the same numbers",
                    type(exc).__name__, exc)
    return None


def labels_document(manifest: Manifest, shape: data.InputShape, model: Optional[ModelConfig] = None,
                    task: Optional[TaskConfig] = None) -> dict[str, Any]:
    """What a server needs beside the model: label names, the task, the user's builder and how inputs were made."""
    custom = {"model_builder": model.builder, "threshold": task.threshold} if model and task else {}
    return {"labels": manifest.labels, "label_feature": shape.label_feature, "model_kind": shape.kind,
            "task": shape.task, "num_outputs": shape.num_outputs, **custom,
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
    return tracker.log_keras_model(model, ctx.shape.input_specs(), ctx.shape.num_outputs,
                                   ctx.cfg.tracking.registered_model_name)


def upload_dir(local: str, output: str, progress: Callable[[str], None] = lambda what: None,
               before_replace: Callable[[], None] = lambda: None) -> None:
    """Replace ``output``'s files with a local folder's, leaving the previous outputs whole on failure.

    Files go to a sibling folder first (``progress`` hears each one, so a slow
    storage restarts the stall clock per file, and the log shows where it is),
    with a ledger naming each of them; only when every file is there does that
    folder take ``output``'s place. The previous folder, moved aside, loses
    exactly the files its ledger names (:func:`_retire`). A failed upload
    names the file, and ``output`` is as it was. ``before_replace`` may refuse the swap (a DataError: the new
    outputs are kept in their folder, named).
    """
    files = sorted(os.path.relpath(os.path.join(root, name), local).replace(os.sep, "/")
                   for root, _, names in os.walk(local) for name in names)
    parent, base = output.rstrip("/").rsplit("/", 1) if "/" in output.rstrip("/") else (".", output)
    # A fresh name per upload: a pid repeats across runs (in containers rank 0 is often the same pid), and a
    # refused upload's folder is kept for the user, so no later run may delete it by that name.
    incoming = fs.join(parent, f".{base}.incoming-{uuid.uuid4().hex[:12]}")
    for i, rel in enumerate(files, start=1):
        what = f"uploading {rel} ({i}/{len(files)}) to {output}"
        progress(what)
        log.info(what)
        try:
            fs.copy_from_local(os.path.join(local, *rel.split("/")), fs.join(incoming, *rel.split("/")))
        except Exception as exc:  # one line naming the file; the old outputs stay
            fs.discard(incoming)
            raise StorageError(f"uploading {rel} to {output} failed ({type(exc).__name__}: {exc}); the previous "
                               f"outputs in {output} are unchanged: fix the storage and rerun") from exc
    ledger.write(incoming, ledger.Ledger(WRITER, (*(ledger.exact(rel) for rel in files), *WRITTEN_LATER)))
    progress(f"replacing {output} with the new outputs")
    try:
        before_replace()  # e.g. this run's lease on train.output is still its own
        owns = check_replaceable(output)  # again: something may have been put there while training ran
    except DataError as exc:  # the trained model is not thrown away over it
        raise DataError(f"{exc} (this run's outputs are kept in {incoming})") from None
    previous = f"{incoming}.previous-{uuid.uuid4().hex[:8]}"  # a fresh name: never into an earlier leftover
    if fs.exists(output):
        fs.move(output, previous)
    fs.move(incoming, output)
    if fs.exists(previous):
        _retire(previous, owns, output)


# Written into train.output after its ledger, by this run or its launcher: the TensorBoard events rank 0
# publishes while it trains, and the record a Spark/YARN launch leaves (a failed try's, or the run's own).
WRITTEN_LATER = (ledger.exact(launch.LAUNCHER_RECORD),
                 ledger.exact(f"{tensorboard.FOLDER}/{tensorboard.EVENTS_PREFIX}") + "*")
# What hvdtrain versions before the ledger wrote into train.output: owned only beside a result.json that names
# this folder (:func:`_owner`).
WRITTEN_BEFORE_LEDGERS = (*(ledger.exact(n) for n in (RESULT_NAME, "eval_report.json", "labels.json",
                                                      "tokenizer.json", "model.keras", CONFUSION_PNG,
                                                      RESIDUALS_PNG, timeline_lib.FILENAME)),
                          ledger.tree("saved_model"), *WRITTEN_LATER)


def _owner(output: str, files: list[str]) -> ledger.Ledger:
    """What of ``output`` hvdtrain wrote: its ledger; for an output of an older hvdtrain (no ledger, but a
    result.json whose report is this folder's eval_report.json) the names those versions wrote; else only what
    a launch or TensorBoard may have put there already (:data:`WRITTEN_LATER`)."""
    found = ledger.read_own(output, WRITER, "train.output")
    if found is not None:
        return found
    if RESULT_NAME in files:
        try:
            doc = json.loads(fs.read_bytes(fs.join(output, RESULT_NAME)))
        except ValueError:
            doc = None
        if isinstance(doc, dict) and doc.get("report") == fs.join(output, "eval_report.json"):
            return ledger.Ledger(WRITER, WRITTEN_BEFORE_LEDGERS)
    return ledger.Ledger(WRITER, WRITTEN_LATER)


def check_replaceable(output: str) -> Callable[[str], bool]:
    """Whether a file of ``train.output`` is hvdtrain's (a predicate on relative paths); raises DataError, before
    anything is touched, when the folder holds a file hvdtrain did not write (its ledger does not name it)."""
    files = fs.walk(output)
    owns = _owner(output, files).owns
    foreign = ledger.foreign(files, owns)
    if foreign:
        raise DataError(f"train.output {output} holds files hvdtrain did not write ({ledger.sample(foreign)}); "
                        f"it replaces only what its ledger {ledger.NAME} names: move them out of {output}, or "
                        "choose a new or empty folder for train.output")
    return owns


def claim_output(output: str, write: bool) -> None:
    """Before training: refuse an output holding files hvdtrain did not write (:func:`check_replaceable`), then
    (``write``: rank 0) record in its ledger what this run will put there before the outputs, so nothing
    this run writes is ever mistaken for the user's, and nothing of the user's for this run's."""
    check_replaceable(output)
    if write:
        record_claim(output)


def record_claim(output: str) -> None:
    """Rank 0, once :func:`check_replaceable` passed: record in the output's ledger what this run will put there."""
    found = ledger.read_own(output, WRITER, "train.output")
    files = [f for f in fs.walk(output) if f != ledger.NAME]
    claimed = found or ledger.Ledger(WRITER, tuple(ledger.exact(f) for f in files))  # files the check owned
    fs.makedirs(output)
    ledger.write(output, claimed.adding(*WRITTEN_LATER))


def _retire(previous: str, owns: Callable[[str], bool], output: str) -> None:
    """Delete what the replaced output's ledger names; anything else stays in ``previous`` and is named."""
    try:
        left = ledger.retire(previous, owns)
    except ANY_ERROR as exc:  # the new outputs are in place; the old ones only take space
        log.warning("could not delete the replaced outputs in %s (%s: %s); delete them by hand", previous,
                    type(exc).__name__, exc)
        return
    if left:
        log.warning("the replaced outputs of %s left files hvdtrain did not write in %s (%s): move them back "
                    "where you want them", output, previous, ledger.sample(left))


def _dump_json(path: str, doc: Any) -> None:
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=2, sort_keys=False)
        fh.write("\n")
