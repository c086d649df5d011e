"""TFRecord shards written by Spark tasks, published by the driver.

Commit protocol: each task writes its shard straight to the output filesystem
under ``_staging/<run>/`` with a name unique to the task attempt, and returns
the shard's stats. ``collect()`` returns the results of the successful
attempt of each partition only, so the driver knows exactly which staged files
are the dataset: it moves those into place and the staging folder (with any
failed or speculative attempts' files) is deleted. The manifest is written
last, by the caller.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Optional

import numpy as np

from hvdtrain import fs, tfrecord
from hvdtrain.config import SPLITS
from hvdtrain.features import FeatureEncoder

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


def plan_shards(rows: dict[str, int], max_length: int, target_mb: float, min_shards: int) -> ShardPlan:
    """Shards per split: enough for the target size, and at least ``min_shards``
    (so every planned rank gets a shard), never more than one per row."""
    est_record = 2 * max_length * _EST_BYTES_PER_TOKEN + 64
    counts = {}
    for split in SPLITS:
        n = rows.get(split, 0)
        by_size = math.ceil(n * est_record / (target_mb * 1e6))
        counts[split] = max(1, min(max(by_size, min_shards), n)) if n else 0
    return ShardPlan(counts)


def shard_name(split: str, index: int, count: int, compression: str) -> str:
    ext = ".tfrecord.gz" if compression == "gzip" else ".tfrecord"
    return f"{split}/part-{index:05d}-of-{count:05d}{ext}"


def write_partition(partition: int, rows: Iterable, *, plan: ShardPlan, staging: str,
                    tokenizer_json: Optional[str], tabular_stats: Optional[dict], compression: str,
                    encodings: Optional[dict[str, str]] = None) -> Iterator[dict]:
    """Runs in a Spark task: encode sorted rows and write one shard.

    ``rows`` are ((partition, key), (text, label_id, numeric values, categorical
    values)) pairs. Yields one stats dict for the shard (nothing for an empty
    partition). ``encodings`` maps features to their packed encoding (``FeatureSpec.encoding``).
    """
    from pyspark import TaskContext

    split, index = plan.locate(partition)
    ctx = TaskContext.get()
    attempt = f"{ctx.stageId()}-{ctx.taskAttemptId()}" if ctx else "driver"
    path = fs.join(staging, f"{split}-{index:05d}-attempt-{attempt}.tfrecord")
    encode = RecordEncoder(tokenizer_json, tabular_stats, encodings)
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
            return
        if batch:
            encode.write(writer, batch)
        stats = writer.finish()
    finally:
        if stream is not None:
            stream.close()
    yield {"partition": partition, "split": split, "index": index, "staged": path, "records": stats.records,
           "bytes": stats.bytes, "sha256": stats.sha256,
           "class_counts": {str(k): v for k, v in sorted(stats.class_counts.items())}}


class RecordEncoder:
    """Turns a batch of rows into tf.train.Example records: the model features from
    :class:`hvdtrain.features.FeatureEncoder` (the code scoring runs too), the label index and the key."""

    def __init__(self, tokenizer_json: Optional[str], tabular_stats: Optional[dict],
                 encodings: Optional[dict[str, str]] = None):
        self.features = FeatureEncoder(tokenizer_json, tabular_stats)
        self.encodings = encodings or {}

    def columns(self, batch: list) -> dict[str, tuple[str, Any]]:
        keys = [k for (_, k), _ in batch]
        labels = np.array([v[1] for _, v in batch], dtype=np.int64)
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
        cols["label"] = (tfrecord.INT64, labels)
        cols["key"] = (tfrecord.BYTES, [k.encode() for k in keys])
        return cols

    def write(self, writer: tfrecord.TFRecordWriter, batch: list) -> None:
        cols = self.columns(batch)
        writer.write_columns(cols)
        writer.count_labels(cols["label"][1])
