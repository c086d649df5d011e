"""Batch scoring: ``score_throughput`` and ``score_vs_pyfunc`` on one local[2] SparkSession.

The model is the demo's transformer shape (untrained weights: speed does not
depend on them), saved as a training output folder (model.keras, labels.json,
tokenizer.json) with a WordPiece vocabulary learned from demo-like rows, and
logged to a throwaway MLflow store with hvdtrain's Keras flavor logging.

- score_throughput: rows/s of hvdtrain.score.score (read parquet, tokenize, predict in the pandas UDF,
  rows written to Spark's noop sink) ÷ rows/s of one plain process reading the same parquet with pyarrow,
  tokenizing with the same tokenizer and calling the model in batches of the same size (TensorFlow free
  to use every core).
- score_vs_pyfunc: on the same cached pre-tokenized rows, hvdtrain.score.predict_features ÷
  mlflow.pyfunc.spark_udf of the logged model.

Spark start-up, the first (model-loading) pass and caching are excluded: both
sides get a warm-up run, then the median of ``REPS`` runs.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any


from benchmarks.common import Entry, median_time

REPS = 3
PREDICT_BATCH = 256


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
    import tensorflow as tf

    from hvdtrain import score as score_lib
    from hvdtrain.features import FeatureEncoder

    bundle = score_lib.bundle_from_folder(folder)
    model = score_lib.load_keras(bundle.model_bytes)
    predict = tf.function(lambda x: model(x, training=False), reduce_retracing=True)
    enc = FeatureEncoder(bundle.tokenizer_json, None)

    def run() -> int:
        texts = pq.read_table(parquet, columns=["id", "text"]).column("text").to_pylist()
        done = 0
        for start in range(0, len(texts), PREDICT_BATCH):
            x = enc.encode(texts[start:start + PREDICT_BATCH])
            score_lib.softmax(predict(x).numpy())
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
    n = 2_000 if quick else 20_000
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
        base_s = median_time(baseline_fn, REPS)
        bundle = score_lib.bundle_from_folder(folder)
        raw = spark.read.parquet(parquet)

        def ours() -> None:
            score_lib.score(spark, raw, bundle, score_lib.ScoreOptions(predict_batch=PREDICT_BATCH)).write.format("noop").mode("overwrite") \
                .save()

        ours_s = median_time(ours, REPS)
        entries = [Entry("score_throughput", n / ours_s, "rows/s", "1 process: tokenize + model in batches",
                         n / base_s, 1.3, notes={"rows": n, "spark_master": "local[2]", "predict_batch": PREDICT_BATCH,
                                                 "threads_per_task": 1})]
        entries.append(_vs_pyfunc(spark, tmp, bundle, made, model, rows, n))
        spark.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return entries


def _vs_pyfunc(spark: Any, tmp: str, bundle: Any, made: dict, model: Any, rows: list, n: int) -> Entry:
    from hvdtrain import config, score as score_lib, tracking
    from hvdtrain.features import FeatureEncoder

    cfg = config.from_dict({"name": "benchscore", "workdir": tmp, "tracking": {"uri": os.path.join(tmp, "mlflow")}})
    tracker = tracking.Tracker(cfg)
    tracker.start({})
    uri = tracker.log_keras_model(model, made["shape"].input_specs(), made["shape"].num_classes)
    tracker.end()
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
    pyfunc_s = median_time(pyfunc, REPS)
    ours_s = median_time(ours, REPS)
    return Entry("score_vs_pyfunc", n / ours_s, "rows/s", "mlflow.pyfunc.spark_udf", n / pyfunc_s, 1.2,
                 notes={"rows": n, "spark_master": "local[2]", "model_uri": uri,
                        "timing_s": round(time.perf_counter() - started, 1)})
