"""Batch scoring: ``score_throughput`` and ``score_vs_pyfunc`` on one local[2] SparkSession.

The model is the demo's transformer shape (untrained weights: speed does not
depend on them), saved as a training output folder (model.keras, labels.json,
tokenizer.json) with a WordPiece vocabulary learned from demo-like rows, and
logged to a throwaway MLflow store with hvdtrain's Keras flavor logging.

- score_throughput: rows/s of hvdtrain.score.score (read parquet, tokenize, predict in the pandas UDF,
  rows written to Spark's noop sink) ÷ rows/s of one plain process reading the same parquet with pyarrow,
  tokenizing with the same tokenizer and calling the same compiled model graph
  (:func:`hvdtrain.score.compile_predict`) in batches of the same size (TensorFlow and the tokenizer free to
  use every core). 100,000 rows: a nightly job scores millions, and at 20,000 rows (two tasks of about a
  second) Spark's fixed costs per job and per task were a large share of the time measured.
- score_vs_pyfunc: on the same cached pre-tokenized rows (the first 20,000), hvdtrain.score.predict_features
  ÷ mlflow.pyfunc.spark_udf of the logged model.

Spark start-up, the first (model-loading) pass and caching are excluded: both
sides get a warm-up run, then ``REPS`` runs of each, interleaved (A, B, A, B,
...) so a change in the machine's load hits both; the figure is the median,
and the notes give min/median/max.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Callable


from benchmarks.common import Entry

REPS = 3
PREDICT_BATCH = 256
ROWS = 100_000
PYFUNC_ROWS = 20_000


def make_model(folder: str, rows: list[tuple[str, str, str]]) -> tuple[Any, dict]:
    """A demo-shaped transformer and its tokenizer, saved as a training output folder."""
    from hvdtrain import features, models
    from hvdtrain.config import ModelConfig
    from hvdtrain.data.contract import InputShape

    opts = features.TextOptions(max_length=48)
    base = features.base(opts)
    counts: dict[str, int] = {}
    for _, text, _ in rows:
        for w in features.words(base, text):
            counts[w] = counts.get(w, 0) + 1
    tok = features.from_vocab(features.learn_vocab(counts, 1000), opts)
    labels = sorted({r[2] for r in rows})
    shape = InputShape(48, tok.get_vocab_size(with_added_tokens=True), len(labels), "label")
    model = models.build_model(ModelConfig(embed_dim=64, num_heads=2, ff_dim=128, num_layers=1), shape)
    os.makedirs(folder, exist_ok=True)
    model.save(os.path.join(folder, "model.keras"))
    with open(os.path.join(folder, "tokenizer.json"), "w") as fh:
        fh.write(tok.to_str())
    doc = {"labels": labels, "inputs": list(shape.inputs), "manifest_digest": "bench",
           "input_specs": {k: {"dtype": d, "shape": s} for k, (d, s) in shape.input_specs().items()},
           "preprocessing": {"text": {"column": "text", **opts.describe()}}}
    with open(os.path.join(folder, "labels.json"), "w") as fh:
        json.dump(doc, fh)
    return model, {"shape": shape, "tokenizer": tok}


def plain_process(parquet: str, folder: str) -> Any:
    """The baseline: one process, pyarrow read, the same tokenizer, the model in batches."""
    import pyarrow.parquet as pq

    from hvdtrain import score as score_lib
    from hvdtrain.features import FeatureEncoder

    bundle = score_lib.bundle_from_folder(folder)
    predict = score_lib.compile_predict(score_lib.load_keras(bundle.model_bytes),
                                        bundle.labels_doc["input_specs"])
    enc = FeatureEncoder(bundle.tokenizer_json, None)

    def run() -> int:
        texts = pq.read_table(parquet, columns=["id", "text"]).column("text").to_pylist()
        done = 0
        for start in range(0, len(texts), PREDICT_BATCH):
            x = enc.encode(texts[start:start + PREDICT_BATCH])
            score_lib.softmax(predict(x))
            done += len(x["input_ids"])
        return done

    return run


def run(quick: bool, extra: dict) -> list[Entry]:
    from pyspark.sql import SparkSession

    from etl import sample
    from hvdtrain import score as score_lib
    from hvdtrain.config import SampleConfig

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    n = 2_000 if quick else ROWS
    tmp = tempfile.mkdtemp(prefix="bench-score-")
    try:
        rows = list(sample.generate(SampleConfig(rows=n, num_classes=4, seed=7)))
        folder = os.path.join(tmp, "model")
        model, made = make_model(folder, rows)
        spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
                 .config("spark.python.worker.reuse", "true").config("spark.driver.memory", "2g").getOrCreate())
        parquet = os.path.join(tmp, "rows.parquet")
        spark.createDataFrame([(str(i), t, lab) for i, t, lab in rows], "id string, text string, label string") \
            .repartition(4).write.parquet(parquet)
        baseline_fn = plain_process(parquet, folder)
        bundle = score_lib.bundle_from_folder(folder)
        raw = spark.read.parquet(parquet)

        def ours() -> None:
            score_lib.score(spark, raw, bundle, score_lib.ScoreOptions(predict_batch=PREDICT_BATCH)) \
                .write.format("noop").mode("overwrite").save()

        ours_t, base_t = interleaved(ours, baseline_fn, REPS)
        entries = [Entry("score_throughput", n / statistics.median(ours_t), "rows/s",
                         "1 process: tokenize + model in batches", n / statistics.median(base_t), 1.3,
                         notes={"rows": n, "spark_master": "local[2]", "predict_batch": PREDICT_BATCH,
                                "threads_per_task": 1, "tasks": raw.rdd.getNumPartitions(),
                                **spread("ours", n, ours_t), **spread("baseline", n, base_t),
                                "load_average": os.getloadavg()[0]})]
        entries.append(_vs_pyfunc(spark, tmp, bundle, made, model, rows[:min(n, PYFUNC_ROWS)]))
        spark.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return entries


def interleaved(a: Callable[[], Any], b: Callable[[], Any], reps: int) -> tuple[list[float], list[float]]:
    """Wall seconds of ``reps`` runs of a and of b, alternated after one warm-up run of each."""
    a()
    b()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(reps):
        for fn, out in ((a, times[0]), (b, times[1])):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return times


def spread(name: str, n: int, times: list[float]) -> dict[str, list[float]]:
    """rows/s at min/median/max of the runs' times (slowest first)."""
    return {f"{name}_rows_per_s_min_median_max": [round(n / t) for t in (max(times), statistics.median(times),
                                                                           min(times))]}


def _vs_pyfunc(spark: Any, tmp: str, bundle: Any, made: dict, model: Any, rows: list) -> Entry:
    from hvdtrain import config, score as score_lib, tracking
    from hvdtrain.features import FeatureEncoder

    cfg = config.from_dict({"name": "benchscore", "workdir": tmp, "tracking": {"uri": os.path.join(tmp, "mlflow")}})
    tracker = tracking.Tracker(cfg)
    tracker.start({})
    uri = tracker.log_keras_model(model, made["shape"].input_specs(), made["shape"].num_classes)
    tracker.end()
    n = len(rows)
    enc = FeatureEncoder(bundle.tokenizer_json, None)
    feats = enc.encode([t for _, t, _ in rows])
    tokenized = spark.createDataFrame(
        [(str(i), feats["input_ids"][i].tolist(), feats["attention_mask"][i].tolist()) for i in range(n)],
        "id string, input_ids array<bigint>, attention_mask array<bigint>").repartition(4).cache()
    tokenized.count()
    udf = tracking.pyfunc_spark_udf(spark, uri)

    def ours() -> None:
        score_lib.predict_features(spark, tokenized, bundle, score_lib.ScoreOptions(predict_batch=PREDICT_BATCH)) \
            .write.format("noop").mode("overwrite").save()

    def pyfunc() -> None:
        tokenized.select("id", udf("input_ids", "attention_mask").alias("logits")) \
            .write.format("noop").mode("overwrite").save()

    started = time.perf_counter()
    ours_t, pyfunc_t = interleaved(ours, pyfunc, REPS)
    return Entry("score_vs_pyfunc", n / statistics.median(ours_t), "rows/s", "mlflow.pyfunc.spark_udf",
                 n / statistics.median(pyfunc_t), 1.2,
                 notes={"rows": n, "spark_master": "local[2]", "model_uri": uri,
                        **spread("ours", n, ours_t), **spread("pyfunc", n, pyfunc_t),
                        "timing_s": round(time.perf_counter() - started, 1), "load_average": os.getloadavg()[0]})
