"""Publishing a written dataset: plan in a pure function, act in a thin one.

:func:`plan_publish` takes the write tasks' typed results (:class:`etl.writer.ShardResult`)
and everything fitted before the write, checks the row accounting, and returns
a :class:`PublishPlan`: which staged file moves where, which small files are
written, the manifest and the report. It touches no filesystem, so a plan that
would lose rows fails before anything moves. :func:`act` carries a plan out in
the order readers need: the manifest, which names every file of a dataset, is
written last.

Publishing over a dataset (``etl.overwrite``) never touches the old one until the
new one is complete: the new shards, vocabulary and tokenizer go to a version
folder ``v-<run>/`` beside the old files, then ``manifest.json`` is replaced in
one rename (:func:`hvdtrain.data.manifest.write`), and only then are the old files
deleted and ``rejects/`` and ``etl_report.json`` replaced. A run that fails or is
killed before the rename leaves the old dataset whole and readable; a dead
run's version folder is deleted by the next publish.

What is deleted is only what hvdtrain recorded (:mod:`hvdtrain.hadoop.ledger`): before
the first file moves in, :func:`act` writes ``_hvdtrain_ledger.json`` naming
what this publish will own, and a clean-up deletes only files that ledger, or the
published manifest, names; never a file because of its name (``train/``,
``v-*``). A folder holding a file nothing names is refused before anything moves.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from etl import accounting, sample, sources, tabular, text, writer
from etl import split as split_mod
from etl.accounting import RowCounts
from etl.fitted import Fitted
from hvdtrain.core import tasks
from hvdtrain.core.config import SPLITS, EtlConfig, JobConfig, SourceConfig
from hvdtrain.core.errors import ANY_ERROR, AccessDenied, DataError
from hvdtrain.data import manifest
from hvdtrain.data.contract import WEIGHT_FEATURE
from hvdtrain.hadoop import fs, lease, ledger

log = logging.getLogger("hvdtrain.etl")
LEFTOVER = "the next publish to this folder deletes it"  # about a folder that could not be deleted
WRITER = "hvdtrain etl"  # the writer named in etl.output's ledger (hvdtrain.hadoop.ledger)
STAGING = "_staging"  # etl.job's: each run records and clears its own _staging/<run id>; a publish leaves it


@dataclass(frozen=True)
class RunFacts:
    """Facts of this run that are not data: where it staged, how long stages took, when and with what."""

    staging: str
    stage_seconds: dict[str, float]
    created_at: str
    versions: dict[str, str]
    generation: str = ""  # "v-<run>": a published dataset is being replaced, the new one goes to this folder


@dataclass(frozen=True)
class PublishPlan:
    output: str
    clear_existing: bool  # delete what is at ``output`` first: it holds no dataset to keep readable (etl.overwrite)
    dirs: list[str]  # folders to create under ``output``
    moves: list[tuple[str, str]]  # (staged uri, final uri): the successful attempts' shards
    files: list[tuple[str, bytes]]  # (uri, content) the manifest names (vocabulary, tokenizer), written atomically
    manifest: manifest.Manifest
    report: dict[str, Any]
    side_moves: list[tuple[str, str]] = field(default_factory=list)  # rejects/: beside the dataset, not named by it
    side_files: list[tuple[str, bytes]] = field(default_factory=list)  # etl_report.json
    generation: str = ""  # the version folder of a dataset that replaces a published one ("": files at the top)

    @property
    def keep(self) -> set[str]:
        """Names under ``output`` that belong to the new dataset; the rest is the old one, once it is replaced."""
        side = {_top_name(self.output, dst) for dst, _ in self.side_files}
        side |= {_top_name(self.output, dst) for _, dst in self.side_moves}
        return {manifest.MANIFEST_NAME, "_staging", self.generation, *side} - {""}


def plan_publish(cfg: JobConfig, shards: writer.ShardPlan, results: list[writer.ShardResult], fitted: Fitted,
                 counts: RowCounts, run: RunFacts) -> PublishPlan:
    """What moves where, and the manifest; raises DataError when the row accounting fails.

    Reads cfg.etl, cfg.source, cfg.task and cfg.validation (the manifest's hash of the settings that made it).
    """
    counts = dataclasses.replace(counts, written={s: sum(r.records for r in results if r.split == s)
                                                  for s in SPLITS})
    accounting.check(counts)
    out = cfg.etl.output
    generation = run.generation if cfg.etl.overwrite else ""
    prefix = f"{generation}/" if generation else ""  # manifest paths are relative to its folder
    splits = {s: manifest.Split([]) for s in SPLITS}
    moves = []
    for r in sorted(results, key=lambda r: r.partition):
        rel = prefix + writer.shard_name(r.split, r.index, shards.counts[r.split], cfg.etl.compression)
        moves.append((r.staged, fs.join(out, rel)))
        splits[r.split].shards.append(manifest.Shard(
            path=rel, records=r.records, bytes=r.bytes, sha256=r.sha256,
            class_counts={fitted.labels[k]: v for k, v in r.class_counts.items()}))
    side_moves = []
    if counts.rejected_total or counts.duplicates:
        side_moves.append((fs.join(run.staging, "rejects"), fs.join(out, "rejects")))
    report = {
        "rows_in": counts.rows_in, "rows_written": counts.rows_written, "rows_rejected": counts.rejected_total,
        "duplicates_dropped": counts.duplicates, "rejects_by_rule": counts.by_rule,
        "rows_by_split": dict(counts.written), "shards_by_split": shards.counts, "stage_seconds": run.stage_seconds,
        "shards_by_encoder": dict(sorted(collections.Counter(r.encoder for r in results).items())),
    }
    features, vocab_info, preprocessing = _features(cfg.source, cfg.etl, cfg.task.kind, fitted, prefix)
    m = manifest.Manifest(
        features=features, label_feature="label", labels=fitted.labels, splits=splits,
        compression=cfg.etl.compression, vocab=vocab_info, preprocessing=preprocessing,
        source=source_info(cfg.source, cfg.task.kind, counts), etl_config_hash=cfg.section_hash("source", "validation", "etl"),
        versions=run.versions, created_at=run.created_at, task=cfg.task.kind,
        row_order=split_mod.row_order(cfg.etl.seed))
    dirs = sorted({fs.join(out, prefix + r.split) for r in results})
    return PublishPlan(output=out, clear_existing=cfg.etl.overwrite and not generation, dirs=dirs, moves=moves,
                       files=_small_files(fitted, out, prefix), manifest=m, report=report, side_moves=side_moves,
                       side_files=[(fs.join(out, "etl_report.json"), json.dumps(report, indent=2).encode())],
                       generation=generation)


def _small_files(fitted: Fitted, out: str, prefix: str = "") -> list[tuple[str, bytes]]:
    if fitted.vocab is None:
        return []
    return [(fs.join(out, prefix + "vocab.txt"), ("\n".join(fitted.vocab) + "\n").encode()),
            (fs.join(out, prefix + "tokenizer.json"), (fitted.tokenizer_json or "").encode())]


def _features(src: SourceConfig, etl: EtlConfig, task: str, fitted: Fitted,
              prefix: str = "") -> tuple[dict[str, manifest.FeatureSpec], dict, dict]:
    """(feature specs, vocabulary reference, preprocessing) for the manifest."""
    features: dict[str, manifest.FeatureSpec] = {}
    vocab_info: dict[str, Any] = {}
    preprocessing: dict[str, Any] = {}
    if fitted.vocab is not None:
        features.update(fitted.text_specs)
        vocab_info = {"path": prefix + "vocab.txt", "tokenizer": prefix + "tokenizer.json",
                      "size": len(fitted.vocab), "pad_id": 0, "learned": etl.vocab_file is None}
        preprocessing["text"] = {"column": src.text_column, **text.TextOptions.from_etl(etl).describe()}
        if len(src.text_columns) > 1:  # one input_ids sequence, [SEP] between (features.encode_columns)
            preprocessing["text"].update(columns=list(src.text_columns), separator="[SEP]")
    stats = fitted.tabular_stats
    if stats is not None:
        for name, (dtype, shape) in tabular.feature_specs(stats).items():
            features[name] = manifest.FeatureSpec(dtype, shape)
        preprocessing["tabular"] = {**stats, "fill_values": tabular.fill_values(stats),
                                    "cardinalities": tabular.cardinalities(stats)}
    if fitted.target is not None:
        preprocessing["target"] = fitted.target  # what training standardizes a regression target with
    features["label"] = manifest.FeatureSpec(*tasks.label_spec(task, len(fitted.labels)))
    if fitted.weighted:
        features[WEIGHT_FEATURE] = manifest.FeatureSpec("float32", [])
    features["key"] = manifest.FeatureSpec("bytes", [])
    return features, vocab_info, preprocessing


def source_info(src: SourceConfig, task: str, counts: RowCounts) -> dict[str, Any]:
    """The manifest's ``source`` block: what was read and its row accounting (``task``: the task's kind)."""
    info: dict[str, Any] = {"name": sources.describe(src), "rows_in": counts.rows_in,
                            "rows_rejected": counts.rejected_total, "duplicates_dropped": counts.duplicates}
    if src.sample is not None:
        metric, best = sample.best_score(src.sample, task)
        info["sample"] = {"label_noise": src.sample.label_noise, "task": task,
                          "best_metric": metric, "best_value": round(best, 4)}
        if task == "multiclass":
            info["sample"]["accuracy_ceiling"] = round(best, 4)
    return info


def act(plan: PublishPlan) -> dict[str, Any]:
    """Carry out a plan: everything the new manifest names is in place before the manifest is.

    Returns the report with the manifest's URI added.
    """
    out = plan.output
    owned = _claim(plan)  # refuses a folder holding what nothing names; records this publish's files first
    if plan.clear_existing:  # no manifest there: nothing a reader could be using
        ledger.delete_owned(out, lambda rel: owned(rel) and not _ours_now(rel), skip=(STAGING,))
    try:
        for folder in plan.dirs:
            fs.makedirs(folder)
        for src, dst in plan.moves:
            fs.move(src, dst)
        for uri, data in plan.files:
            fs.write_bytes_atomic(uri, data)
    except BaseException:
        if plan.generation:  # the old dataset was never touched; drop the new one's half
            fs.discard(fs.join(out, plan.generation), LEFTOVER)
        raise
    if not plan.generation:
        _place_side_outputs(plan, owned)
    uri = _swap(plan)  # readers switch to the new dataset here
    if plan.generation:
        try:  # the replaced dataset, dead runs' version folders: what the ledger or the old manifest names
            ledger.delete_owned(out, lambda rel: owned(rel) and _top_name(out, fs.join(out, rel)) not in plan.keep
                                and not _ours_now(rel), skip=(STAGING,))
        except ANY_ERROR as exc:  # the new dataset is published; the old files only take space
            log.warning("could not delete the replaced dataset's files in %s (%s); %s", out, exc, LEFTOVER)
        _place_side_outputs(plan, owned)
    _record(plan, owned)
    return {**plan.report, "manifest": uri}


def _previous_owner(out: str, files: list[str]) -> Callable[[str], bool]:
    """What of ``out`` earlier hvdtrain runs wrote: what its ledger names, and what its published manifest names
    (datasets written before ledgers: also ``etl_report.json`` and ``rejects/`` when that report is one)."""
    found = ledger.read_own(out, WRITER, "etl.output")
    named: set[str] = set()
    for name in (manifest.MANIFEST_NAME, manifest.MANIFEST_NAME + manifest.NEXT_SUFFIX):
        if name not in files:
            continue
        named.add(name)
        try:
            old = manifest.Manifest.from_dict(json.loads(fs.read_bytes(fs.join(out, name))), name)
        except AccessDenied:  # hvdtrain's or not, this user may not read it: say so, never guess
            raise
        except (ValueError, DataError):  # not a manifest hvdtrain can read: it names nothing
            continue
        named |= {shard.path for split in old.splits.values() for shard in split.shards}
        named |= {old.vocab[k] for k in ("path", "tokenizer") if isinstance(old.vocab.get(k), str)}
        if found is None and _is_etl_report(out, files):
            named.add("etl_report.json")
            named |= {f for f in files if f.startswith("rejects/")}
    return lambda rel: rel in named or (found is not None and found.owns(rel))


def _is_etl_report(out: str, files: list[str]) -> bool:
    """Whether ``out`` holds an etl_report.json an hvdtrain ETL wrote (the rows it accounts for)."""
    if "etl_report.json" not in files:
        return False
    try:
        doc = json.loads(fs.read_bytes(fs.join(out, "etl_report.json")))
    except ValueError:
        return False
    return isinstance(doc, dict) and {"rows_in", "rows_written", "rows_rejected"} <= doc.keys()


def _ours_now(rel: str) -> bool:
    """The ledger itself, the running job's lease (with the temporary file of its atomic renewal and a broken
    stale lease moved aside) and etl.job's staging: never deleted by a publish, never taken for a user's file."""
    return rel == ledger.NAME or lease.is_lease_file(rel) or rel.startswith(STAGING + "/")


def _new_entries(plan: PublishPlan) -> list[str]:
    """Ledger entries for what this publish writes under ``plan.output``."""
    out = plan.output
    if plan.generation:
        entries = [ledger.tree(plan.generation)]
    else:
        entries = [ledger.exact(_relative(out, dst)) for _, dst in plan.moves]
        entries += [ledger.exact(_relative(out, uri)) for uri, _ in plan.files]
    entries += [ledger.exact(manifest.MANIFEST_NAME), ledger.exact(manifest.MANIFEST_NAME + manifest.NEXT_SUFFIX)]
    entries += [ledger.tree(_relative(out, dst)) for _, dst in plan.side_moves]
    entries += [ledger.exact(_relative(out, uri)) for uri, _ in plan.side_files]
    return entries


def check_claim(out: str) -> list[str]:
    """The files of ``etl.output`` (runs' staging left out), each one hvdtrain wrote; raises DataError, in one
    line and before anything is touched, naming the files neither its ledger nor its manifest names. etl.job
    calls it before any Spark work, :func:`act` again before the first move."""
    files = [f for f in fs.walk(out, skip=(STAGING,)) if not _ours_now(f)]
    foreign = ledger.foreign(files, _previous_owner(out, files))
    if foreign:
        raise DataError(f"etl.output {out} holds files hvdtrain did not write ({ledger.sample(foreign)}); the "
                        f"ETL replaces only what its ledger {ledger.NAME} or its manifest names, and never these: "
                        f"move them out of {out}, or choose a new or empty folder for etl.output")
    return files


def claim_staging(out: str, run_id: str) -> None:
    """Record ``_staging/<run_id>`` in ``out``'s ledger (after :func:`check_claim`), before anything is staged."""
    files = check_claim(out)
    found = ledger.read_own(out, WRITER, "etl.output") or ledger.Ledger(WRITER, tuple(ledger.exact(f) for f in files))
    fs.makedirs(out)
    ledger.write(out, found.adding(ledger.tree(f"{STAGING}/{run_id}")))


def _staging_entries(out: str) -> tuple[str, ...]:
    """The runs' staging folders ``out``'s ledger names and that are still there: a publish keeps them in the
    ledger (etl.job clears its own; a killed run's stays named)."""
    found = ledger.read_own(out, WRITER, "etl.output")
    entries = [e for e in found.entries if e.startswith(STAGING + "/")] if found else []
    return tuple(e for e in entries if fs.exists(fs.join(out, e.removesuffix("/*"))))  # a run cleared its own


def _claim(plan: PublishPlan) -> Callable[[str], bool]:
    """Refuse a folder holding files nothing names (DataError, before anything moves), then write the ledger
    naming what this publish will own beside what earlier runs own; returns whether a file is hvdtrain's."""
    out = plan.output
    files = check_claim(out)
    claim = ledger.Ledger(WRITER, tuple(ledger.exact(f) for f in files) + tuple(_new_entries(plan))
                          + _staging_entries(out))
    fs.makedirs(out)
    ledger.write(out, claim)
    return claim.owns


def _record(plan: PublishPlan, owned: Callable[[str], bool]) -> None:
    """The ledger after a publish: each file of the new dataset, and what could not be deleted of the old."""
    try:
        files = [f for f in fs.walk(plan.output, skip=(STAGING,)) if not _ours_now(f) and owned(f)]
        ledger.write(plan.output, ledger.Ledger(WRITER, tuple(ledger.exact(f) for f in files)
                                                + _staging_entries(plan.output)))
    except ANY_ERROR as exc:  # the claim stays: it names all of these, and more
        log.warning("could not rewrite the ledger in %s (%s); the one written before the publish stands",
                    plan.output, exc)


def _relative(base: str, uri: str) -> str:
    """``uri``'s path under ``base`` ("a/b"); every path a plan writes lies under its output."""
    return uri[len(base.rstrip("/")) + 1:]


def _swap(plan: PublishPlan) -> str:
    """Write the manifest; when that fails and readers still get the old one, drop the new version folder."""
    try:
        return manifest.write(plan.manifest, plan.output)
    except BaseException:
        if plan.generation and _still_old(plan):
            fs.discard(manifest.manifest_uri(plan.output) + manifest.NEXT_SUFFIX, LEFTOVER)
            fs.discard(fs.join(plan.output, plan.generation), LEFTOVER)
        raise


def _still_old(plan: PublishPlan) -> bool:
    """Whether readers get a manifest other than the plan's (False when that cannot be told: keep everything)."""
    try:  # the whole manifest, not its digest: the digest cannot tell a rerun of the same data from the old one
        return manifest.read(plan.output).to_dict() != plan.manifest.to_dict()
    except ANY_ERROR:  # storage trouble: the next publish cleans up
        return False


def _top_name(base: str, uri: str) -> str:
    """The name right under ``base`` that ``uri`` lies in ("" when it is not under ``base``)."""
    prefix = base.rstrip("/") + "/"
    return uri[len(prefix):].split("/")[0] if uri.startswith(prefix) else ""


def _owned_under(owned: Callable[[str], bool], folder: str, rel: str) -> bool:
    """Whether ``rel`` inside ``folder`` (a name under the output) is owned."""
    return owned(f"{folder}/{rel}")


def _place_side_outputs(plan: PublishPlan, owned: Callable[[str], bool]) -> None:
    """rejects/ and etl_report.json: not part of the dataset readers use, replaced whole; the replaced
    rejects/ loses only the files ``owned`` names (a relative path under ``plan.output``)."""
    for src, dst in plan.side_moves:
        name = _relative(plan.output, dst)
        aside = fs.join(plan.output, f".{name}.previous-{uuid.uuid4().hex[:8]}")  # outside etl.job's staging
        if fs.exists(dst):
            fs.move(dst, aside)
        fs.move(src, dst)
        if fs.exists(aside):
            left = ledger.retire(aside, functools.partial(_owned_under, owned, name))
            if left:
                log.warning("the replaced %s held files hvdtrain did not write, kept in %s (%s): move them "
                            "where you want them", dst, aside, ledger.sample(left))
    for uri, data in plan.side_files:
        fs.write_bytes_atomic(uri, data)
