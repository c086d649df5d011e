"""Publishing a written dataset: plan in a pure function, act in a thin one.

:func:`plan_publish` takes the write tasks' typed results (:class:`etl.writer.ShardResult`)
and everything fitted before the write, checks the row accounting, and returns
a :class:`PublishPlan`: which staged file moves where, which small files are
written, the manifest and the report. It touches no filesystem, so a plan that
would lose rows fails before anything moves. :func:`act` carries a plan out in
the order readers need: the old dataset's manifest goes first, the new one is
written last.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Optional

from etl import accounting, writer
from etl.accounting import RowCounts
from hvdtrain import fs, manifest
from hvdtrain.config import SPLITS, JobConfig


@dataclass(frozen=True)
class Fitted:
    """What the job learned before writing, as plain data (the manifest records it)."""

    labels: list[str]
    text_specs: dict[str, manifest.FeatureSpec] = field(default_factory=dict)
    vocab: Optional[list[str]] = None  # vocab.txt lines in id order; None for tabular-only data
    tokenizer_json: Optional[str] = None
    tabular_stats: Optional[dict[str, Any]] = None


@dataclass(frozen=True)
class RunFacts:
    """Facts of this run that are not data: where it staged, how long stages took, when and with what."""

    staging: str
    stage_seconds: dict[str, float]
    created_at: str
    versions: dict[str, str]


@dataclass(frozen=True)
class PublishPlan:
    output: str
    clear_existing: bool  # delete the published dataset at ``output`` first (etl.overwrite)
    dirs: list[str]  # folders to create under ``output``
    moves: list[tuple[str, str]]  # (staged uri, final uri): the successful attempts' shards, then rejects
    files: list[tuple[str, bytes]]  # (uri, content) written atomically before the manifest
    manifest: manifest.Manifest
    report: dict[str, Any]


def plan_publish(cfg: JobConfig, shards: writer.ShardPlan, results: list[writer.ShardResult], fitted: Fitted,
                 counts: RowCounts, run: RunFacts) -> PublishPlan:
    """What moves where, and the manifest; raises DataError when the row accounting fails."""
    counts = dataclasses.replace(counts, written={s: sum(r.records for r in results if r.split == s)
                                                  for s in SPLITS})
    accounting.check(counts)
    out = cfg.etl.output
    splits = {s: manifest.Split([]) for s in SPLITS}
    moves = []
    for r in sorted(results, key=lambda r: r.partition):
        rel = writer.shard_name(r.split, r.index, shards.counts[r.split], cfg.etl.compression)
        moves.append((r.staged, fs.join(out, rel)))
        splits[r.split].shards.append(manifest.Shard(
            path=rel, records=r.records, bytes=r.bytes, sha256=r.sha256,
            class_counts={fitted.labels[k]: v for k, v in r.class_counts.items()}))
    if counts.rejected_total or counts.duplicates:
        moves.append((fs.join(run.staging, "rejects"), fs.join(out, "rejects")))
    report = {
        "rows_in": counts.rows_in, "rows_written": counts.rows_written, "rows_rejected": counts.rejected_total,
        "duplicates_dropped": counts.duplicates, "rejects_by_rule": counts.by_rule,
        "rows_by_split": dict(counts.written), "shards_by_split": shards.counts, "stage_seconds": run.stage_seconds,
    }
    files = _small_files(fitted, out) + [(fs.join(out, "etl_report.json"), json.dumps(report, indent=2).encode())]
    features, vocab_info, preprocessing = _features(cfg, fitted)
    m = manifest.Manifest(
        features=features, label_feature="label", labels=fitted.labels, splits=splits,
        compression=cfg.etl.compression, vocab=vocab_info, preprocessing=preprocessing,
        source=source_info(cfg, counts), etl_config_hash=cfg.section_hash("source", "validation", "etl"),
        versions=run.versions, created_at=run.created_at)
    dirs = sorted({fs.join(out, r.split) for r in results})
    return PublishPlan(output=out, clear_existing=cfg.etl.overwrite, dirs=dirs, moves=moves, files=files,
                       manifest=m, report=report)


def _small_files(fitted: Fitted, out: str) -> list[tuple[str, bytes]]:
    if fitted.vocab is None:
        return []
    return [(fs.join(out, "vocab.txt"), ("\n".join(fitted.vocab) + "\n").encode()),
            (fs.join(out, "tokenizer.json"), (fitted.tokenizer_json or "").encode())]


def _features(cfg: JobConfig, fitted: Fitted) -> tuple[dict[str, manifest.FeatureSpec], dict, dict]:
    """(feature specs, vocabulary reference, preprocessing) for the manifest."""
    from etl import tabular, text

    features: dict[str, manifest.FeatureSpec] = {}
    vocab_info: dict[str, Any] = {}
    preprocessing: dict[str, Any] = {}
    if fitted.vocab is not None:
        features.update(fitted.text_specs)
        vocab_info = {"path": "vocab.txt", "tokenizer": "tokenizer.json", "size": len(fitted.vocab), "pad_id": 0,
                      "learned": cfg.etl.vocab_file is None}
        preprocessing["text"] = {"column": cfg.source.text_column, **text.TextOptions.from_etl(cfg.etl).describe()}
    stats = fitted.tabular_stats
    if stats is not None:
        for name, (dtype, shape) in tabular.feature_specs(stats).items():
            features[name] = manifest.FeatureSpec(dtype, shape)
        preprocessing["tabular"] = {**stats, "fill_values": tabular.fill_values(stats),
                                    "cardinalities": tabular.cardinalities(stats)}
    features["label"] = manifest.FeatureSpec("int64", [])
    features["key"] = manifest.FeatureSpec("bytes", [])
    return features, vocab_info, preprocessing


def source_info(cfg: JobConfig, counts: RowCounts) -> dict[str, Any]:
    """The manifest's ``source`` block: what was read and its row accounting."""
    from etl import sample, sources

    info: dict[str, Any] = {"name": sources.describe(cfg), "rows_in": counts.rows_in,
                            "rows_rejected": counts.rejected_total, "duplicates_dropped": counts.duplicates}
    if cfg.source.sample is not None:
        info["sample"] = {"label_noise": cfg.source.sample.label_noise,
                          "accuracy_ceiling": round(sample.accuracy_ceiling(cfg.source.sample), 4)}
    return info


def act(plan: PublishPlan) -> dict[str, Any]:
    """Carry out a plan: readers stop seeing the old dataset first and see the new one last.

    Returns the report with the manifest's URI added.
    """
    out = plan.output
    if plan.clear_existing and fs.exists(out):
        fs.delete(manifest.manifest_uri(out))  # readers stop seeing the old dataset first
        for name in fs.listdir(out):
            if name != "_staging":
                fs.delete(fs.join(out, name))
    for folder in plan.dirs:
        fs.makedirs(folder)
    for src, dst in plan.moves:
        fs.move(src, dst)
    for uri, data in plan.files:
        fs.write_bytes_atomic(uri, data)
    return {**plan.report, "manifest": manifest.write(plan.manifest, out)}
