"""TFRecord shards written by Spark tasks, published by the driver.

Commit protocol: each task writes its shards straight to the output filesystem
under ``_staging/<run>/`` with a name unique to the task attempt, and returns
a :class:`ShardResult` for each. ``collect()`` returns the results of the successful
attempt of each partition only, so the driver knows exactly which staged files
are the dataset: ``etl.publish`` moves those into place and the staging folder
(with any failed or speculative attempts' files) is deleted. The manifest is
written last.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional, Protocol

import numpy as np

from etl import faults
from etl.fitted import Fitted
from hvdtrain.core.config import SPLITS
from hvdtrain.data import tfrecord
from hvdtrain.data.contract import WEIGHT_FEATURE
from hvdtrain.data.features import TEXT_SEP, FeatureEncoder
from hvdtrain.hadoop import fs

BATCH = 1024
# Bytes per int64 token id in a record: varints of ids < 16384 take 1-2 bytes.
_EST_BYTES_PER_TOKEN = 2.2


@dataclass(frozen=True)
class ShardPlan:
    """How many shards each split gets; a shard's place in the plan (its ``partition``) names its split and index."""

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
    """What one write task reports about a shard it staged (the driver publishes from these only)."""

    partition: int  # the shard's place in the plan (ShardPlan.locate), whichever task wrote it
    split: str
    index: int
    staged: str  # the attempt's file under _staging/
    records: int
    bytes: int
    sha256: str
    class_counts: dict[int, int]  # label index -> records
    encoder: str = "native"  # the loops that encoded it (hvdtrain.data.tfrecord.encoder_kind in the task)


# What the write tasks hand back to the driver, one row per staged shard (mapInArrow's output schema).
RESULT_SCHEMA = ("partition int, split string, index int, staged string, records long, bytes long, sha256 string, "
                 "class_counts string, encoder string")


@dataclass(frozen=True)
class Columns:
    """The write tasks' input columns (made by Spark SQL in ``etl.job``): the shard and place of each row, then
    what the encoder reads. ``label`` is the label string (classes), or the target as a double (regression)."""

    numeric: tuple[str, ...]  # doubles, NaN or NULL missing: the numeric row of hvdtrain.data.features.transform
    categorical: tuple[str, ...]  # longs: each value's id, made in Spark SQL (etl.tabular.category_ids)
    several_texts: bool  # ``text`` joins a row's text columns with TEXT_SEP
    weight: Optional[str]  # the sample weight as a double
    # label string -> the value written (etl.labels.encoder); a regression's target comes as a double
    encode_label: Callable[[str], Any] = str


# The columns the ETL adds for the write tasks are named with this prefix, which no source column may use
# (etl.sources refuses it), so none can collide with a feature, key, label or weight column.
INTERNAL = "__hvd_"
SHARD, ORDER = f"{INTERNAL}shard", f"{INTERNAL}order"


def write_batches(batches: Iterable[Any], *, plan: ShardPlan, staging: str, fitted: Fitted, columns: Columns,
                  compression: str, fault: Optional[faults.Fault] = None) -> Iterator[Any]:
    """Runs in a Spark task (``mapInArrow``): encode Arrow batches of rows sorted by shard, then place, and write
    each shard the task holds; yields one result row (:data:`RESULT_SCHEMA`) per shard written.

    Rows arrive as Spark's JVM sorted them, in record batches; each stretch of one shard is encoded a
    :data:`BATCH` of rows at a time, column by column (:meth:`RecordEncoder.columns`), with no per-row
    Python but the tokenizer's. ``fault`` is the test-only hook (``etl.faults``); its partition is the shard's
    place in the plan.
    """
    fs.prepare_hdfs_client(staging)  # libhdfs in this executor: the Hadoop classpath, as training ranks get it
    with one_thread_tokenizer():
        yield from _write_all(batches, plan, staging, fitted, columns, compression, fault)


_PARALLELISM = "TOKENIZERS_PARALLELISM"


@contextlib.contextmanager
def one_thread_tokenizer() -> Iterator[None]:
    """The ``tokenizers`` library on the calling thread only, until the block ends however it ends.

    Spark runs one task per core: the tokenizer's own thread pool would only contend with the other tasks (its
    CPU time in the write tasks fell 23% without it, 200,000 rows on local[2]). The library reads the variable at
    each call; its earlier value (or its absence) is restored.
    """
    import os

    prior = os.environ.get(_PARALLELISM)
    os.environ[_PARALLELISM] = "false"
    try:
        yield
    finally:
        if prior is None:
            os.environ.pop(_PARALLELISM, None)
        else:
            os.environ[_PARALLELISM] = prior


def _write_all(batches: Iterable[Any], plan: ShardPlan, staging: str, fitted: Fitted, columns: Columns,
               compression: str, fault: Optional[faults.Fault]) -> Iterator[Any]:
    """:func:`write_batches`' work."""
    import json

    import pyarrow as pa
    from pyspark import TaskContext

    ctx = TaskContext.get()
    attempt = f"{ctx.stageId()}-{ctx.taskAttemptId()}" if ctx else "driver"
    encode = RecordEncoder(fitted, columns)
    for shard, pieces in _by_shard(_drop_key(batches, fault)):
        split, index = plan.locate(shard)
        path = fs.join(staging, f"{split}-{index:05d}-attempt-{attempt}.tfrecord")
        if fault and fault.fails_write(shard, ctx.attemptNumber() if ctx else 0):
            write_shard([next(iter(pieces)).slice(0, 1)], path, encode, compression)  # part reaches storage
            raise faults.InjectedFault(f"fail_write_once: attempt 0 of partition {shard} dies after one record")
        if fault and fault.writes_twice(shard):
            kept = list(pieces)  # a speculative copy: the same rows written whole to a second attempt's file
            write_shard(kept, fs.join(staging, f"{split}-{index:05d}-attempt-{attempt}-copy.tfrecord"), encode,
                         compression)
            pieces = iter(kept)
        stats = write_shard(pieces, path, encode, compression)
        if stats is not None:
            counts = json.dumps({str(k): v for k, v in sorted(stats.class_counts.items())})
            yield pa.RecordBatch.from_pylist([{
                "partition": shard, "split": split, "index": index, "staged": path, "records": stats.records,
                "bytes": stats.bytes, "sha256": stats.sha256, "class_counts": counts,
                "encoder": tfrecord.encoder_kind()}],
                schema=pa.schema([("partition", pa.int32()), ("split", pa.string()), ("index", pa.int32()),
                                  ("staged", pa.string()), ("records", pa.int64()), ("bytes", pa.int64()),
                                  ("sha256", pa.string()), ("class_counts", pa.string()), ("encoder", pa.string())]))


def result_of(row: Any) -> ShardResult:
    """A :class:`ShardResult` from one row the write tasks returned."""
    import json

    return ShardResult(partition=row["partition"], split=row["split"], index=row["index"], staged=row["staged"],
                       records=row["records"], bytes=row["bytes"], sha256=row["sha256"],
                       class_counts={int(k): v for k, v in json.loads(row["class_counts"]).items()},
                       encoder=row["encoder"])


def _drop_key(batches: Iterable[Any], fault: Optional[faults.Fault]) -> Iterator[Any]:
    """The batches without the hook's ``write``-stage row (as they are when no hook drops there)."""
    drop = fault.drops("write") if fault else None
    if drop is None:
        yield from batches
        return
    import pyarrow.compute as pc

    for batch in batches:
        yield batch.filter(pc.not_equal(batch.column("key"), drop))


def _by_shard(batches: Iterable[Any]) -> Iterator[tuple[int, Iterator[Any]]]:
    """(shard, its stretches of rows as batch slices) for a stream of batches sorted by :data:`SHARD`."""
    import itertools

    import numpy as np

    def stretches() -> Iterator[tuple[int, Any]]:
        for batch in batches:
            shard = batch.column(SHARD).to_numpy()
            cuts = [0, *(np.flatnonzero(np.diff(shard)) + 1).tolist(), len(shard)]
            for lo, hi in zip(cuts[:-1], cuts[1:]):
                if hi > lo:
                    yield int(shard[lo]), batch.slice(lo, hi - lo)

    for shard, group in itertools.groupby(stretches(), key=lambda item: item[0]):
        yield shard, (piece for _, piece in group)


def write_shard(pieces: Iterable[Any], path: str, encode: "BatchEncoder", compression: str) -> Optional[Any]:
    """Write a shard's rows (Arrow batch slices, in order) to ``path``, :data:`BATCH` rows at a time, each
    through ``encode.write`` (a :class:`RecordEncoder` in the ETL); the writer's stats, or None when there were
    no rows."""
    stream = None
    writer = None
    try:
        for piece in pieces:
            for start in range(0, piece.num_rows, BATCH):
                if writer is None:
                    stream = fs.open_output(path)
                    writer = tfrecord.TFRecordWriter(stream, compression)
                encode.write(writer, piece.slice(start, BATCH))
        return writer.finish() if writer is not None else None
    finally:
        if stream is not None:
            stream.close()


class BatchEncoder(Protocol):
    """What :func:`write_shard` needs of an encoder: the records of an Arrow batch, written through ``writer``."""

    def write(self, writer: tfrecord.TFRecordWriter, batch: Any) -> None: ...


class RecordEncoder:
    """Turns a batch of rows into tf.train.Example records: the model features from
    :class:`hvdtrain.data.features.FeatureEncoder` (the code scoring runs too), the encoded label and the key.

    The label is an int64 class index (multiclass, binary), a float32 multi-hot
    vector (multilabel) or a float32 target (regression): see etl/labels.py. With
    ``source.weight_column``, the row's sample weight is the float32 ``weight`` feature.
    """

    def __init__(self, fitted: Fitted, columns: Columns):
        self.features = FeatureEncoder(fitted.tokenizer_json, fitted.tabular_stats)
        self.encodings = fitted.encodings
        self.task = fitted.task
        self.weighted = fitted.weighted
        self.input = columns

    def features_of(self, batch: Any) -> dict[str, Any]:
        """The model features of an Arrow batch of rows (:class:`Columns`), as :class:`FeatureEncoder` makes them."""
        n = batch.num_rows
        texts = None
        if self.features.tok is not None:
            texts = batch.column("text").to_pylist()
            if self.input.several_texts:
                texts = [tuple(t.split(TEXT_SEP)) if t else t for t in texts]
        numeric = (np.stack([batch.column(c).to_numpy(zero_copy_only=False) for c in self.input.numeric], axis=1)
                   if self.input.numeric else np.zeros((n, 0)))
        categorical = (np.stack([batch.column(c).to_numpy() for c in self.input.categorical], axis=1)
                       if self.input.categorical else np.zeros((n, 0), np.int64))
        return self.features.encode_arrays(texts, numeric, categorical, n)

    def columns(self, batch: Any) -> dict[str, tuple[str, Any]]:

        if self.task == "regression":
            labels = batch.column("label").to_numpy(zero_copy_only=False).astype(np.float32)
        else:
            encoded = [self.input.encode_label(v) for v in batch.column("label").to_pylist()]
            labels = np.array(encoded, dtype=np.float32 if self.task == "multilabel" else np.int64)
        feats = self.features_of(batch)
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
            weights = batch.column(self.input.weight).to_numpy(zero_copy_only=False)
            cols[WEIGHT_FEATURE] = (tfrecord.FLOAT, weights.astype(np.float32))
        cols["key"] = (tfrecord.BYTES, tfrecord.ragged_of(batch.column("key")))  # never null: validation's key_null
        return cols

    def write(self, writer: tfrecord.TFRecordWriter, batch: Any) -> None:
        cols = self.columns(batch)
        writer.write_columns(cols)
        labels = cols["label"][1]
        if self.task == "multilabel":  # occurrences of each label
            writer.count_labels(np.nonzero(labels)[1])
        elif self.task != "regression":
            writer.count_labels(labels)
