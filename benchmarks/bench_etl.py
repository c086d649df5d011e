"""etl_write: the ETL's shard writer on local[2] vs a single-process TF loop.
vocab_driver_memory: the driver's peak memory while the ETL gathers vocabulary candidates from a text
column with 5 M distinct words (counts reduced on the executors, the top ones collected) vs collecting
every word's count to the driver (how the ETL did it before).

Both write the same rows (a key, 128 token ids, a label) as tf.train.Example TFRecords. The Spark side is
the ETL's write path: the rows as a cached DataFrame in 8 partitions, handed to the tasks as Arrow batches
(``mapInArrow``), each task writing its rows through ``etl.writer.write_shard`` (``BATCH`` rows at a time,
hvdtrain.data.tfrecord's vectorized encoder and framing, the key from Arrow's buffers) to a file through
hvdtrain.hadoop.fs. Tokenization is left out of both: each row's 128 ids are a fixed function of its index
(:func:`ids_of`), made in the task from the batch's indices as the ETL's tasks make ids from the batch's text,
so the JVM hands the task what the ETL's tasks get (a key, a label, a small column), not 1 KB of ids a row.
The notes also time, in the same interleaved rounds, the same encoder fed Python row tuples through an RDD
(how this bench, and until 2026-11-30 the ETL's write, fed it), and the same ``mapInArrow`` job with a task
that only counts its rows (``feed_floor``): what Spark's hand-over of the rows to Python costs alone, the most
any encoder in the tasks could reach. ``encoder`` notes which loops encoded (hvdtrain_native or NumPy).
The SparkSession is started and the input cached before timing, so JVM start-up is excluded.
"""
from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

from benchmarks.common import REPS, Entry, interleaved, median_time

TOKENS = 128


def ids_of(index: np.ndarray) -> np.ndarray:
    """Rows of :data:`TOKENS` token ids in [5, 30000) for the row indices ``index`` (vectorized, deterministic)."""
    mixed = (index.astype(np.uint64)[:, None] * np.uint64(0x9E3779B97F4A7C15)
             + np.arange(TOKENS, dtype=np.uint64)[None, :] * np.uint64(0xBF58476D1CE4E5B9))
    return ((mixed >> np.uint64(40)) % np.uint64(29995) + np.uint64(5)).astype(np.int64)


def label_of(index: np.ndarray) -> np.ndarray:
    return (index * 7 % 4).astype(np.int64)


def make_rows(n: int) -> tuple[np.ndarray, np.ndarray]:
    index = np.arange(n)
    return ids_of(index), label_of(index)


def key_of(i: int) -> str:
    return f"row-{i:09d}"


def tf_loop(ids: np.ndarray, labels: np.ndarray, path: str) -> None:
    """The baseline: one tf.train.Example per row, tf.io.TFRecordWriter."""
    import tensorflow as tf

    with tf.io.TFRecordWriter(path) as w:
        for i in range(len(labels)):
            ex = tf.train.Example(features=tf.train.Features(feature={
                "input_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=ids[i])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[labels[i]])),
                "key": tf.train.Feature(bytes_list=tf.train.BytesList(value=[key_of(i).encode()])),
            }))
            w.write(ex.SerializeToString())


class TaskIds:
    """The columns :class:`etl.writer.RecordEncoder` hands the writer: the ids as a 2-D int64 array (as the
    tokenizer's encoder returns them, here :func:`ids_of` the batch's indices), the label, the key from Arrow."""

    def write(self, writer: Any, batch: Any) -> None:
        from hvdtrain.data import tfrecord

        ids = ids_of(batch.column("id").to_numpy())
        writer.write_columns({"input_ids": tfrecord.int_column(ids), "label": (tfrecord.INT64, batch.column("label").to_numpy()),
                              "key": (tfrecord.BYTES, tfrecord.ragged_of(batch.column("key")))})


def arrow_task(out_dir: str):
    """A ``mapInArrow`` function: the task's rows through ``etl.writer.write_shard`` into one file."""

    def task(batches: Any) -> Any:
        import pyarrow as pa
        from pyspark import TaskContext

        from etl.writer import write_shard
        from hvdtrain.hadoop import fs

        path = fs.join(out_dir, f"part-{TaskContext.get().partitionId():05d}.tfrecord")
        stats = write_shard(batches, path, TaskIds(), "none")
        yield pa.RecordBatch.from_pylist([{"records": stats.records if stats else 0}],
                                         schema=pa.schema([("records", pa.int64())]))
    return task


def count_task(batches: Any) -> Any:
    """A ``mapInArrow`` function that only counts its rows: the feed without a writer."""
    import pyarrow as pa

    yield pa.RecordBatch.from_pylist([{"records": sum(b.num_rows for b in batches)}],
                                     schema=pa.schema([("records", pa.int64())]))


def write_partition(index: int, rows: Any, out_dir: str):
    """Spark task, the previous feed: Python row tuples (key, index, label) through an RDD, batched into the
    same encoder, the ids made from the batch's indices as in :class:`TaskIds`."""
    from etl.writer import BATCH
    from hvdtrain.data import tfrecord
    from hvdtrain.hadoop import fs

    with fs.open_output(fs.join(out_dir, f"part-{index:05d}.tfrecord")) as stream:
        w = tfrecord.TFRecordWriter(stream)
        batch: list = []

        def flush() -> None:
            w.write_columns({
                "input_ids": (tfrecord.INT64, ids_of(np.array([r[1] for r in batch], dtype=np.int64))),
                "label": (tfrecord.INT64, np.array([r[2] for r in batch], dtype=np.int64)),
                "key": (tfrecord.BYTES, [r[0].encode() for r in batch]),
            })
            batch.clear()

        for row in rows:
            batch.append(row)
            if len(batch) >= BATCH:
                flush()
        if batch:
            flush()
        yield w.finish().records


def check_output(out_dir: str, ids: np.ndarray, labels: np.ndarray) -> None:
    """Every row written once, with its own ids and label (the TF parser reads the files)."""
    import glob

    import tensorflow as tf

    seen = 0
    for path in sorted(glob.glob(os.path.join(out_dir, "part-*.tfrecord"))):
        for raw in tf.data.TFRecordDataset(path).as_numpy_iterator():
            f = tf.train.Example.FromString(raw).features.feature
            i = int(f["key"].bytes_list.value[0][4:])
            assert list(f["input_ids"].int64_list.value) == ids[i].tolist(), i
            assert f["label"].int64_list.value[0] == labels[i], i
            seen += 1
    assert seen == len(labels), (seen, len(labels))


def run(quick: bool, extra: dict) -> list[Entry]:
    from pyspark.sql import SparkSession

    # Spark's Python workers must run this interpreter (the venv), as etl/session.py arranges for jobs.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    n = 20_000 if quick else 200_000
    ids, labels = make_rows(n)
    tmp = tempfile.mkdtemp(prefix="bench-etl-")
    try:
        spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
                 .config("spark.driver.memory", "4g").config("spark.sql.adaptive.enabled", "true")
                 .getOrCreate())
        frame = spark.range(n).selectExpr("format_string('row-%09d', id) AS key", "id",
                                          "CAST(id * 7 % 4 AS BIGINT) AS label").repartition(8).cache()
        frame.count()
        rows = [(key_of(i), i, int(labels[i])) for i in range(n)]
        rdd = spark.sparkContext.parallelize(rows, 8).cache()
        rdd.count()
        counter = iter(range(1000))
        checked: list = []

        def arrow_write() -> None:
            out = os.path.join(tmp, f"arrow-{next(counter)}")
            written = sum(r["records"] for r in frame.mapInArrow(arrow_task(out), "records long").collect())
            assert written == n, (written, n)
            if not checked:  # the first (warm-up) round's files, read back outside the timed rounds' files
                check_output(out, ids, labels)
                checked.append(out)
            shutil.rmtree(out)

        def rdd_write() -> None:
            out = os.path.join(tmp, f"rdd-{next(counter)}")
            written = sum(rdd.mapPartitionsWithIndex(lambda i, it: write_partition(i, it, out)).collect())
            assert written == n, (written, n)
            shutil.rmtree(out)

        def feed() -> None:
            assert sum(r["records"] for r in frame.mapInArrow(count_task, "records long").collect()) == n

        started = time.perf_counter()
        times = interleaved({"tf_loop": lambda: tf_loop(ids, labels, os.path.join(tmp, "base.tfrecord")),
                             "arrow": arrow_write, "rdd": rdd_write, "feed": feed}, reps=REPS)
        spark_s = time.perf_counter() - started
        from google.protobuf.internal import api_implementation

        from hvdtrain.data.tfrecord import encoder_kind

        per_row_us = _serialize_cost_us(ids[:4096], labels[:4096])
        vocab = _vocab_driver_memory(spark, 50_000 if quick else 5_000_000)
        spark.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    vs_rdd = [r / a for a, r in zip(times["arrow"], times["rdd"])]
    vs_feed = [f / a for a, f in zip(times["arrow"], times["feed"])]
    return [Entry.paired("etl_write", [n / t for t in times["arrow"]], "rows/s", "tf.io.TFRecordWriter loop, 1 process",
                         [n / t for t in times["tf_loop"]], 1.5,
                         notes={"rows": n, "tokens_per_row": TOKENS, "serialize_us_per_row": round(per_row_us, 2),
                                "protobuf_backend": api_implementation.Type(), "spark_master": "local[2]",
                                "row_rdd_rows_per_s": round(n / statistics.median(times["rdd"])),
                                "vs_row_rdd": round(statistics.median(vs_rdd), 3),
                                "vs_row_rdd_range": [round(min(vs_rdd), 3), round(max(vs_rdd), 3)],
                                "feed_floor_rows_per_s": round(n / statistics.median(times["feed"])),
                                "vs_feed_floor": round(statistics.median(vs_feed), 3),
                                "vs_feed_floor_range": [round(min(vs_feed), 3), round(max(vs_feed), 3)],
                                "encoder": encoder_kind(),
                                "interleaved_rounds": REPS, "timing_s": round(spark_s, 1)}),
            vocab]


class PeakRss:
    """The peak resident memory of this process (the Spark driver's Python side) while in the block, and
    its rise above where it started (``mb``)."""

    def __init__(self, interval: float = 0.01):
        import threading

        self.interval, self.start, self.peak = interval, _rss(), 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, _rss())

    def __enter__(self) -> "PeakRss":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())

    @property
    def mb(self) -> float:
        return max(self.peak - self.start, 0) / 1e6


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _vocab_driver_memory(spark, distinct: int) -> Entry:
    """Driver peak memory: top vocabulary candidates (etl.job.top_word_counts) vs every count collected."""
    import gc

    from etl import job as etl_job
    from etl import text
    from hvdtrain.data import wordpiece

    opts, vocab_size = text.TextOptions(), 2000
    # Ten distinct words per row (a base-36 serial) plus a few common ones, as a long-tailed column has.
    texts = spark.range(distinct // 10).selectExpr(
        "concat_ws(' ', 'the', 'data', transform(sequence(0, 9), j -> concat('w', conv(id * 10 + j, 10, 36)))) "
        "AS text").repartition(8).cache()
    texts.count()
    etl_job.top_word_counts(texts.limit(10), opts, vocab_size)  # imports and Arrow set-up, outside the figure
    gc.collect()
    started = time.perf_counter()
    with PeakRss() as top:
        counts = etl_job.top_word_counts(texts, opts, vocab_size)
    top_s = time.perf_counter() - started
    started = time.perf_counter()
    with PeakRss() as learning:
        vocab = text.learn_vocab(counts, vocab_size)
    learn_s = time.perf_counter() - started
    del counts
    gc.collect()
    started = time.perf_counter()
    with PeakRss() as every:
        everything = _collect_all_counts(texts, opts)
    all_s = time.perf_counter() - started
    assert len(everything) == distinct + 2, len(everything)
    del everything
    texts.unpersist()
    return Entry("vocab_driver_memory", top.peak / 1e6, "MB", "every word's count collected to the driver",
                 every.peak / 1e6, 0.5, lower_is_better=True,
                 notes={"distinct_words": distinct, "candidates": wordpiece.candidates_limit(vocab_size),
                        "measured": "peak RSS of the driver's Python process", "rise_mb": round(top.mb, 1),
                        "baseline_rise_mb": round(every.mb, 1), "top_seconds": round(top_s, 1),
                        "collect_all_seconds": round(all_s, 1), "vocab_size": len(vocab),
                        "learn_seconds": round(learn_s, 1), "learn_rise_mb": round(learning.mb, 1)})


def _collect_all_counts(texts, opts) -> dict:
    """The ETL's vocabulary counting before #16: reduceByKey, then every (word, count) to the driver."""
    from etl import text

    base_json = text.base(opts).to_str()

    def count_words(rows):
        from tokenizers import Tokenizer

        tok = Tokenizer.from_str(base_json)
        for r in rows:
            for w in text.words(tok, r.text):
                yield w, 1

    return texts.rdd.mapPartitions(count_words).reduceByKey(lambda a, b: a + b).collectAsMap()


def _serialize_cost_us(ids: np.ndarray, labels: np.ndarray) -> float:
    """Per-row cost of the ETL's encoder and TFRecord framing alone (one process, no I/O)."""
    from hvdtrain.data import tfrecord

    keys = [b"row-%09d" % i for i in range(len(labels))]
    sec = median_time(lambda: tfrecord.encode_framed({
        "input_ids": (tfrecord.INT64, ids), "label": (tfrecord.INT64, labels), "key": (tfrecord.BYTES, keys)}))
    return sec / len(labels) * 1e6
