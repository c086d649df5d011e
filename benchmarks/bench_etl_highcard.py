"""etl_high_cardinality: the whole ETL (read, validate, dedup, split, fit, tokenize, write TFRecords, publish) on
a generated table with a 1,000,000-distinct-value ID column (hashed), a 50,000-value column (a vocabulary capped
at etl.max_categories), a numeric column and a text column, on ``local[2]`` with Spark's default driver memory;
against Spark writing the same rows to Parquet, interleaved in the same run.
etl_high_cardinality_driver_memory: the driver's peak memory during the ETL with 1,000,000 distinct IDs vs the
same table with 100,000 (flat when distinct values grow 10x; the bounded aggregations of etl.stats).
etl_high_cardinality_driver_peak: that peak against the 1 GB target.
etl_high_cardinality_spark_floor: the passes over the rows the ETL's guarantees need, in bare Spark SQL with no
Python and Parquet out (:func:`spark_floor`), against the same Parquet write, interleaved with the two above: the
ratio a TFRecord ETL on Spark could reach on this machine with any encoder, even one costing nothing.

The group runs in a Python process of its own, so its Spark JVM starts with Spark's default driver heap
(``-Xmx1g``), whatever other groups started before it; the heap's maximum is in the notes.

The driver is two processes: the JVM and this Python process. The figure is the JVM's peak live heap, from one
ETL of each table run apart from the timed ones, on Spark's local cluster (:data:`MEMORY_MASTER`: the executors
in JVMs of their own, as on a cluster, where in ``local[2]`` the driver's heap also holds their cached rows and
task memory), with a full collection (System.gc(), through py4j) every half second and the heap in use read right
after it, plus this process's peak rise in resident memory. The heap in use between collections climbs towards the heap's
maximum (1g by default) whatever the job holds, so that peak (from the timed runs) and both RSS peaks are only in
the notes. Spark's Python workers are separate processes and not counted.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Any

from benchmarks.common import Entry

WORDS = 300  # the text column's vocabulary
# Where the memory figures run: Spark's local cluster, 2 executors of 1 core and 1 GB in JVMs of their own.
MEMORY_MASTER = "local-cluster[2,1,1024]"


def spark_home() -> str:
    from pyspark.find_spark_home import _find_spark_home

    return os.environ.get("SPARK_HOME") or _find_spark_home()


def make_table(spark: Any, path: str, rows: int, distinct_ids: int, items: int) -> None:
    """The source table as Parquet: id, user (distinct_ids values), item (items values), amount, text, label."""
    spark.range(rows).selectExpr(
        "concat('r', id) AS id",
        f"concat('u', CAST((id * 7919) % {distinct_ids} AS STRING)) AS user",
        f"concat('i', CAST((id * 104729) % {items} AS STRING)) AS item",
        "CAST((id % 1000) / 10.0 AS DOUBLE) AS amount",
        f"concat_ws(' ', transform(sequence(0, 7), j -> concat('w', CAST((id * (j + 3) + j) % {WORDS} AS STRING))))"
        " AS text",
        "CAST(id % 3 AS STRING) AS label").repartition(8).write.mode("overwrite").parquet(path)


def spark_floor(spark: Any, source: str, out: str, shards: int, tasks: int) -> None:
    """The ETL's passes over the rows, each as bare Spark SQL (what any ETL with its guarantees runs), no Python:

    read and cache, one count per rule; rows and distinct keys (dedup); the distinct labels; the top words of the
    text (lower-cased, split on spaces); mean, std and quantiles of the numeric column; the top 1,000 values and
    the distinct count of each categorical column; each row's shard and place by seeded hashes of its key, the
    rows moved to their shards' tasks and sorted there, written as Parquet (the TFRecord encoding left out).
    Validation's other rules, the split, the drift bins and tokenization are left out, so it is a floor.
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    rows = spark.read.parquet(source).withColumn(
        "rule", F.when(F.col("id").isNull(), "key_null").when(F.col("text").isNull(), "text_null")
        .when(F.col("label").isNull(), "label_null")).cache()
    try:
        rows.groupBy("rule").count().collect()
        rows.groupBy("id").count().agg(F.sum("count"), F.count(F.lit(1))).first()
        rows.select("label").distinct().collect()
        words = rows.select(F.explode(F.split(F.lower("text"), " ")).alias("w")).groupBy("w").count()
        words.orderBy(F.desc("count"), "w").limit(10_000).collect()
        rows.agg(F.mean("amount"), F.stddev_pop("amount"),
                 F.percentile_approx("amount", [i / 10 for i in range(11)], 10_000)).first()
        for column in ("user", "item"):
            counts = rows.groupBy(column).count().persist(StorageLevel.MEMORY_AND_DISK)
            counts.orderBy(F.desc("count"), column).limit(1000).collect()
            counts.count()
            counts.unpersist()
        shard = F.pmod(F.xxhash64("id"), F.lit(shards))
        (rows.withColumn("shard", shard).withColumn("order", F.xxhash64("id", F.lit(7)))
         .repartition(tasks, F.floor(F.col("shard") * tasks / shards)).sortWithinPartitions("shard", "order", "id")
         .write.mode("overwrite").parquet(out))
    finally:
        rows.unpersist()


def job_config(source: str, output: str, workdir: str) -> Any:
    from hvdtrain.core import config

    return config.from_dict({
        "name": "highcard", "workdir": workdir,
        "source": {"path": source, "format": "parquet", "numeric_columns": ["amount"],
                   "categorical_columns": ["user", "item"]},
        "etl": {"output": output, "max_length": 16, "vocab_size": 1000, "max_categories": 1000,
                "categorical_hash_buckets": {"user": 1_000_000}, "overwrite": True}}, base_dir=workdir)


class DriverMemory:
    """Peak JVM heap in use, peak live heap, and peak resident memory of the JVM and of this process, sampled in a
    thread. With ``full_gc`` every sample first runs a full collection (``System.gc()``), so the heap in use
    right after it is what the driver holds (its live set); without, the heap in use between collections climbs
    towards the heap's maximum whatever the job holds (the timing runs sample that, and nothing slows them)."""

    def __init__(self, spark: Any, interval: float = 0.1, full_gc: bool = False):
        import psutil

        jvm = spark.sparkContext._jvm
        self._bean = jvm.java.lang.management.ManagementFactory.getMemoryMXBean()
        self._system = jvm.java.lang.System
        self._runtime = jvm.java.lang.Runtime.getRuntime()
        self._jvm = psutil.Process(int(jvm.java.lang.ProcessHandle.current().pid()))
        self._me = psutil.Process()
        self.interval, self.full_gc = interval, full_gc
        self.heap = self.live = self.jvm_rss = self.py_rss = 0
        self.py_start = self._me.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def heap_max(self) -> int:
        return int(self._runtime.maxMemory())

    def _sample(self) -> None:
        self.jvm_rss = max(self.jvm_rss, self._jvm.memory_info().rss)  # before a collection shrinks it
        if self.full_gc:
            self._system.gc()
            self.live = max(self.live, int(self._bean.getHeapMemoryUsage().getUsed()))
        else:
            self.heap = max(self.heap, int(self._bean.getHeapMemoryUsage().getUsed()))
        self.py_rss = max(self.py_rss, self._me.memory_info().rss)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> "DriverMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    @property
    def mb(self) -> float:
        """The driver's figure (``full_gc`` runs): the peak live heap + this process's peak rise (MB)."""
        return (self.live + max(self.py_rss - self.py_start, 0)) / 1e6

    def notes(self) -> dict[str, float]:
        return {"heap_live_peak_mb": round(self.live / 1e6, 1), "heap_max_mb": round(self.heap_max / 1e6, 1),
                "jvm_rss_peak_mb": round(self.jvm_rss / 1e6, 1), "python_rss_peak_mb": round(self.py_rss / 1e6, 1),
                "python_rise_mb": round(max(self.py_rss - self.py_start, 0) / 1e6, 1)}


def run(quick: bool, extra: dict) -> list[Entry]:
    """The group, measured in a fresh Python process (:func:`measure`): its Spark JVM starts with Spark's default
    driver heap. In ``make bench`` every group runs in one process, and a JVM outlives its SparkSession there:
    this group used to run in the JVM the ``etl`` group had started with a 4 GB heap, and say "1g"."""
    import dataclasses
    import json
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-m", "benchmarks.bench_etl_highcard", *(["--quick"] if quick else [])],
                          cwd=root, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"etl_highcard's process exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    fields = {f.name for f in dataclasses.fields(Entry)}
    return [Entry(**{k: v for k, v in d.items() if k in fields}) for d in json.loads(done.stdout.splitlines()[-1])]


def measure(quick: bool) -> list[Entry]:
    """The figures, in this process (``python -m benchmarks.bench_etl_highcard``, which :func:`run` starts)."""
    import statistics

    from etl import job as etl_job
    from etl import session

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Three interleaved pairs at full size (median and range): on 2 cores one 1M-row ETL takes most of a minute.
    rows, ids, items, reps = (5_000, 5_000, 1_000, 1) if quick else (1_000_000, 1_000_000, 50_000, 3)
    tmp = tempfile.mkdtemp(prefix="bench-highcard-")
    try:
        big = job_config(os.path.join(tmp, "src-big"), os.path.join(tmp, "out"), tmp)
        small = job_config(os.path.join(tmp, "src-small"), os.path.join(tmp, "out"), tmp)
        spark = session.get_session(big, "local[2]")  # spark.driver.memory left at Spark's default
        make_table(spark, big.source.path, rows, ids, items)
        make_table(spark, small.source.path, rows, ids // 10, items)
        counter = iter(range(1000))

        def floor() -> None:
            spark_floor(spark, big.source.path, os.path.join(tmp, f"floor{next(counter)}"), shards, tasks)

        def parquet() -> None:
            spark.read.parquet(big.source.path).write.mode("overwrite").parquet(os.path.join(tmp, f"pq{next(counter)}"))

        stages: list[dict] = []
        last: dict[str, int] = {}
        shards: Any = None
        tasks = 0

        def etl(cfg: Any, full_gc: bool = False) -> tuple[float, DriverMemory]:
            started = time.perf_counter()
            with DriverMemory(spark, interval=0.5 if full_gc else 0.1, full_gc=full_gc) as mem:
                report = etl_job.run(spark, cfg)
            last["shards"] = sum(report["shards_by_split"].values())
            assert report["rows_written"] == rows, report
            if not full_gc:
                stages.append(report["stage_seconds"])
            return time.perf_counter() - started, mem

        parquet()  # warm-up: JVM code paths and the source files' page cache, outside the figures
        etl_s, pq_s, floor_s, mems = [], [], [], []
        for _ in range(reps):
            seconds, mem = etl(big)
            etl_s.append(seconds)
            mems.append(mem)
            if shards is None:  # the ETL's own shard and task counts, from its first run's report
                shards = last["shards"]
                tasks = etl_job.write_tasks(shards, spark.sparkContext.defaultParallelism)
            started = time.perf_counter()
            parquet()
            pq_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            floor()
            floor_s.append(time.perf_counter() - started)
        big_stages = list(stages)
        spark.stop()
        # The memory figures: one ETL of each table with a full collection every half second (not timed), with
        # the executors in JVMs of their own, as on a cluster: in local[2] the driver's JVM also holds the
        # executors' cached rows and task memory, which grow with the data, not with what the driver keeps.
        spark = session.get_session(big, MEMORY_MASTER)
        memory_master = spark.sparkContext.master
        worker_dir = os.path.join(spark_home(), "work", spark.sparkContext.applicationId)
        _, big_mem = etl(big, full_gc=True)
        small_s, small_mem = etl(small, full_gc=True)
        spark.stop()
        # The local cluster's workers run in this JVM, which fixed their folder at its start: $SPARK_HOME/work,
        # inside pyspark's install. The executors' folders (their logs) go with the run.
        shutil.rmtree(worker_dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(worker_dir))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    in_use_peak_mb = round(max(m.heap for m in mems) / 1e6, 1)  # the timing runs' heap in use (no forced collection)
    load = os.getloadavg()
    heap_max_mb = round(big_mem.heap_max / 1e6)
    common = {"rows": rows, "distinct_ids": ids, "item_values": items, "spark_master": "local[2]",
              "driver_memory": f"Spark default (spark.driver.memory unset): heap max {heap_max_mb} MB",
              "load_average_1_5_15": [round(x, 2) for x in load]}
    memory = {**common, "spark_master": memory_master}
    stage_median = {k: round(statistics.median(s[k] for s in big_stages), 2) for k in big_stages[0]}
    return [Entry.paired("etl_high_cardinality", [rows / s for s in etl_s], "rows/s",
                         "Spark writing the same rows to Parquet", [rows / s for s in pq_s], 0.25,
                         notes={**common, "stretch_target": 0.5, "etl_seconds": [round(s, 1) for s in etl_s],
                                "heap_in_use_peak_mb": in_use_peak_mb,
                                "parquet_seconds": [round(s, 2) for s in pq_s], "stage_seconds_median": stage_median,
                                "etl_stage_seconds": big_stages}),
            Entry.paired("etl_high_cardinality_spark_floor", [rows / s for s in floor_s], "rows/s",
                         "Spark writing the same rows to Parquet", [rows / s for s in pq_s], None,
                         notes={**common, "floor_seconds": [round(s, 2) for s in floor_s], "shards": shards,
                                "write_tasks": tasks, "passes": "rule counts, dedup counts, labels, top words, numeric "
                                "summary, top values and distinct count per categorical, shard sort and write"}),
            Entry("etl_high_cardinality_driver_memory", big_mem.mb, "MB",
                  f"the same ETL with {ids // 10:,} distinct IDs", small_mem.mb, 1.1, lower_is_better=True,
                  notes={**memory, "at_distinct_ids": big_mem.notes(), "at_tenth_distinct_ids": small_mem.notes(),
                         "tenth_seconds_with_full_gcs": round(small_s, 1)}),
            Entry("etl_high_cardinality_driver_peak", big_mem.mb, "MB", "the 1 GB target", 1000.0, 1.0,
                  lower_is_better=True, notes={**memory, "at_distinct_ids": big_mem.notes()})]


if __name__ == "__main__":
    import json

    print(json.dumps([e.to_dict() for e in measure("--quick" in sys.argv[1:])]))
