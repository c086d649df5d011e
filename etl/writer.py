"""TFRecord shards written by Spark tasks, published by the driver.

Commit protocol: each task writes its shard straight to the output filesystem
under ``_staging/<run>/`` with a name unique to the task attempt, and returns
a :class:`ShardResult`. ``collect()`` returns the results of the successful
attempt of each partition only, so the driver knows exactly which staged files
are the dataset: ``etl.publish`` moves those into place and the staging folder
(with any failed or speculative attempts' files) is deleted. The manifest is
written last.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Optional

import numpy as np

from etl import faults
from etl.fitted import Fitted
from hvdtrain.core.config import SPLITS
from hvdtrain.data import tfrecord
from hvdtrain.data.contract import WEIGHT_FEATURE
from hvdtrain.data.features import FeatureEncoder
from hvdtrain.hadoop import fs

BATCH = 1024
# Bytes per int64 token id in a record: varints of ids < 16384 take 1-2 bytes.
_EST_BYTES_PER_TOKEN = 2.2


@dataclass(frozen=True)
class ShardPlan:
    """Which Spark partition writes which shard."""

    counts: dict[str, int]  # split -> number of shards

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def offset(self, split: str) -> int:
        return sum(self.counts[s] for s in SPLITS[:SPLITS.index(split)])

    def locate(self, partition: int) -> tuple[str, int]:
        for split in SPLITS:
            if partition < self.offset(split) + self.counts[split]:
                return split, partition - self.offset(split)
        raise IndexError(partition)


def record_bytes(max_length: int) -> float:
    """Estimated bytes of one record: token ids and mask as int64 varints, plus label, key and framing."""
    return 2 * max_length * _EST_BYTES_PER_TOKEN + 64


def plan_shards(rows: dict[str, int], max_length: int, target_mb: float, min_shards: int,
                min_shard_mb: float = 1.0) -> ShardPlan:
    """Shards per split (pure): enough that none exceeds ``target_mb``, and at least ``min_shards`` so a
    large split spreads over many ranks, but never so many that shards fall below ``min_shard_mb`` (a small
    split gets fewer, fuller shards), never more than one per row, and at least one.

    Sizes are estimated from ``max_length`` (:func:`record_bytes`).
    """
    est_record = record_bytes(max_length)
    counts = {}
    for split in SPLITS:
        n = rows.get(split, 0)
        by_size = math.ceil(n * est_record / (target_mb * 1e6))
        # How many shards of at least min_shard_mb the split fills (no bound when min_shard_mb is 0).
        fits = int(n * est_record // (min_shard_mb * 1e6)) if min_shard_mb > 0 else min_shards
        counts[split] = max(1, min(max(by_size, min(min_shards, fits)), n)) if n else 0
    return ShardPlan(counts)


def shard_name(split: str, index: int, count: int, compression: str) -> str:
    ext = ".tfrecord.gz" if compression == "gzip" else ".tfrecord"
    return f"{split}/part-{index:05d}-of-{count:05d}{ext}"


@dataclass(frozen=True)
class ShardResult:
    """What one write task reports about the shard it staged (the driver publishes from these only)."""

    partition: int
    split: str
    index: int
    staged: str  # the attempt's file under _staging/
    records: int
    bytes: int
    sha256: str
    class_counts: dict[int, int]  # label index -> records


def write_partition(partition: int, rows: Iterable, *, plan: ShardPlan, staging: str, fitted: Fitted,
                    compression: str, fault: Optional[faults.Fault] = None) -> Iterator[ShardResult]:
    """Runs in a Spark task: encode ordered rows and write one shard.

    ``rows`` are ((partition, order, key), (text, label_id, numeric values, categorical
    values, sample weight or None)) pairs, in the order they go into the shard (``etl.split.add_order``).
    Yields one :class:`ShardResult` (nothing for an empty
    partition). ``fitted`` holds the tokenizer, statistics and packed encodings
    fitted on the training split; ``fault`` is the test-only hook (``etl.faults``).
    """
    from pyspark import TaskContext

    fs.prepare_hdfs_client(staging)  # libhdfs in this executor: the Hadoop classpath, as training ranks get it
    split, index = plan.locate(partition)
    ctx = TaskContext.get()
    attempt = f"{ctx.stageId()}-{ctx.taskAttemptId()}" if ctx else "driver"
    encode = RecordEncoder(fitted)
    drop = fault.drops("write") if fault else None
    if drop is not None:
        rows = (r for r in rows if r[0][-1] != drop)
    path = fs.join(staging, f"{split}-{index:05d}-attempt-{attempt}.tfrecord")
    if fault and fault.fails_write(partition, ctx.attemptNumber() if ctx else 0):
        _write_shard(list(rows)[:1], path, encode, compression)  # part of the shard reaches storage
        raise faults.InjectedFault(f"fail_write_once: attempt 0 of partition {partition} dies after one record")
    if fault and fault.writes_twice(partition):
        rows = list(rows)  # a speculative copy: the same rows written whole to a second attempt's file
        _write_shard(rows, fs.join(staging, f"{split}-{index:05d}-attempt-{attempt}-copy.tfrecord"), encode,
                     compression)
    stats = _write_shard(rows, path, encode, compression)
    if stats is not None:
        yield ShardResult(partition=partition, split=split, index=index, staged=path, records=stats.records,
                          bytes=stats.bytes, sha256=stats.sha256, class_counts=dict(sorted(stats.class_counts.items())))


def _write_shard(rows: Iterable, path: str, encode: "RecordEncoder", compression: str) -> Optional[Any]:
    """Write rows to ``path`` in batches; the writer's stats, or None when there were no rows."""
    stream = None
    writer = None
    batch: list = []
    try:
        for row in rows:
            if writer is None:
                stream = fs.open_output(path)
                writer = tfrecord.TFRecordWriter(stream, compression)
            batch.append(row)
            if len(batch) >= BATCH:
                encode.write(writer, batch)
                batch.clear()
        if writer is None:
            return None
        if batch:
            encode.write(writer, batch)
        return writer.finish()
    finally:
        if stream is not None:
            stream.close()


class RecordEncoder:
    """Turns a batch of rows into tf.train.Example records: the model features from
    :class:`hvdtrain.data.features.FeatureEncoder` (the code scoring runs too), the encoded label and the key.

    The label is an int64 class index (multiclass, binary), a float32 multi-hot
    vector (multilabel) or a float32 target (regression): see etl/labels.py. With
    ``source.weight_column``, the row's sample weight is the float32 ``weight`` feature.
    """

    def __init__(self, fitted: Fitted):
        self.features = FeatureEncoder(fitted.tokenizer_json, fitted.tabular_stats)
        self.encodings = fitted.encodings
        self.task = fitted.task
        self.weighted = fitted.weighted

    def columns(self, batch: list) -> dict[str, tuple[str, Any]]:
        keys = [sort_key[-1] for sort_key, _ in batch]
        labels = np.array([v[1] for _, v in batch], dtype=np.int64 if self.task in ("multiclass", "binary")
                          else np.float32)
        feats = self.features.encode([v[0] for _, v in batch] if self.features.tok is not None else None,
                                     [v[2] for _, v in batch], [v[3] for _, v in batch])
        cols: dict[str, tuple[str, Any]] = {}
        for name in ("input_ids", "attention_mask"):
            if name in feats:
                cols[name] = tfrecord.int_column(feats[name], self.encodings.get(name, ""))
        if "numeric" in feats:
            cols["numeric"] = (tfrecord.FLOAT, feats["numeric"])
        if "categorical" in feats:
            cols["categorical"] = (tfrecord.INT64, feats["categorical"])
        cols["label"] = (tfrecord.INT64 if labels.dtype == np.int64 else tfrecord.FLOAT, labels)
        if self.weighted:
            cols[WEIGHT_FEATURE] = (tfrecord.FLOAT, np.array([v[4] for _, v in batch], dtype=np.float32))
        cols["key"] = (tfrecord.BYTES, [k.encode() for k in keys])
        return cols

    def write(self, writer: tfrecord.TFRecordWriter, batch: list) -> None:
        cols = self.columns(batch)
        writer.write_columns(cols)
        labels = cols["label"][1]
        if self.task == "multilabel":  # occurrences of each label
            writer.count_labels(np.nonzero(labels)[1])
        elif self.task != "regression":
            writer.count_labels(labels)
