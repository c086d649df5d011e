"""Batch scoring: a trained model applied to raw rows in Spark tasks, with the ETL's own preprocessing.

``score(spark, df, model) -> DataFrame`` is the Python API; ``etl/score_job.py``
is the job around it (read the source, check before any work, drift report,
atomic Hive partition publish) that ``hvdtrain score`` and spark-submit run.

Layering: pyspark belongs to ``etl/`` (and the Spark-side modules beside it).
This module never imports it: :func:`score` only calls methods of the
SparkSession and DataFrame it is given (``df.mapInPandas``,
``spark.sparkContext.broadcast``/``accumulator``, ``spark.conf.set``), so
``hvdtrain`` keeps its one-way imports and the pure parts below (model
bundles, reject rules, the per-batch scoring function, output schemas) test
without Spark. TensorFlow is imported only where a model is loaded.

One preprocessing: rows become features through
:class:`hvdtrain.data.features.FeatureEncoder`, the code the ETL wrote the TFRecords
with, using the tokenizer and statistics the ETL fitted (shipped with the model:
``labels.json`` and ``tokenizer.json`` in the training output / MLflow run).

On executors: an iterator-style pandas UDF (``mapInPandas``). The model file
travels as a broadcast and is loaded once per Python worker (Spark reuses
workers across tasks, ``spark.python.worker.reuse``), then kept in a
per-process cache; every load is counted in an accumulator. Each Arrow batch
(``score.arrow_batch`` rows) is predicted in chunks of ``score.predict_batch``
rows, so a worker holds one batch at a time whatever the number of rows.
"""
from __future__ import annotations

import datetime as dt
import gc
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Optional, Sequence

import numpy as np

from hvdtrain.core.errors import DataError
from hvdtrain.data import manifest as manifest_lib
from hvdtrain.data.features import FeatureEncoder
from hvdtrain.hadoop import fs
from hvdtrain.observe import tracking

try:
    from pandas import NA as _NA
except ImportError:  # pragma: no cover - pandas is a pyspark/mlflow dependency
    _NA = None
LABELS_FILE = "labels.json"
TOKENIZER_FILE = "tokenizer.json"
MODEL_FILE = "model.keras"
# Output columns after the key (and before any extra columns); the reject columns end the combined frame.
PREDICTION_COLUMNS = (("predicted_label", "string"), ("predicted_score", "float"), ("probabilities", "array<float>"))
PROVENANCE_COLUMNS = (("model_uri", "string"), ("model_version", "string"), ("manifest_digest", "string"),
                      ("scored_at", "timestamp"))
REJECT_COLUMNS = (("reject_reason", "string"), ("reject_input", "string"))
PROB_PREFIX = "__class_probability_"  # a scored batch's per-class columns, before they become one array


@dataclass(frozen=True)
class ModelBundle:
    """Everything scoring needs from a trained model: the Keras file and how its inputs were made."""

    model_bytes: bytes
    labels_doc: dict[str, Any]
    tokenizer_json: Optional[str]
    uri: str
    version: str = ""

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.model_bytes).hexdigest()[:16]

    @property
    def labels(self) -> list[str]:
        return list(self.labels_doc["labels"])

    @property
    def manifest_digest(self) -> str:
        return str(self.labels_doc.get("manifest_digest", ""))

    @property
    def preprocessing(self) -> dict[str, Any]:
        return self.labels_doc.get("preprocessing", {})

    @property
    def text_column(self) -> Optional[str]:
        return self.preprocessing.get("text", {}).get("column")

    @property
    def text_columns(self) -> list[str]:
        """Every text column (one input_ids sequence, [SEP] between them: ``source.text_columns``)."""
        text = self.preprocessing.get("text", {})
        return list(text.get("columns") or ([text["column"]] if text.get("column") else []))

    @property
    def tabular(self) -> Optional[dict[str, Any]]:
        return self.preprocessing.get("tabular")

    def feature_columns(self) -> list[str]:
        """The source columns the model's features are made from (text, numeric, categorical)."""
        tab = self.tabular or {}
        return self.text_columns + list(tab.get("numeric_columns", [])) \
            + list(tab.get("categorical_columns", [])) + list((tab.get("datetime") or {}).get("columns", []))


def bundle_from_folder(folder: str, uri: Optional[str] = None, version: str = "") -> ModelBundle:
    """A training output folder (``model.keras``, ``labels.json``, ``tokenizer.json``) as a bundle."""
    for name in (MODEL_FILE, LABELS_FILE):
        if not fs.exists(fs.join(folder, name)):
            raise DataError(f"model {folder} has no {name}: pass a training output folder (train.output, holding "
                            "model.keras and labels.json), an MLflow runs:/ or models:/ URI, or a registered name")
    labels_doc = json.loads(fs.read_bytes(fs.join(folder, LABELS_FILE)))
    return ModelBundle(fs.read_bytes(fs.join(folder, MODEL_FILE)), labels_doc,
                       _tokenizer_json(folder, labels_doc), uri or folder, version)


def _tokenizer_json(folder: str, labels_doc: dict[str, Any]) -> Optional[str]:
    """The model's tokenizer: saved beside it by training, else (older outputs) the dataset's, if unchanged."""
    if not labels_doc.get("preprocessing", {}).get("text"):
        return None
    own = fs.join(folder, TOKENIZER_FILE)
    if fs.exists(own):
        return fs.read_bytes(own).decode()

    dataset = labels_doc.get("dataset", "")
    m = manifest_lib.read(dataset) if dataset and fs.exists(manifest_lib.manifest_uri(dataset)) else None
    if m is None or not m.matches_digest(labels_doc.get("manifest_digest")):
        raise DataError(f"model {folder} has no {TOKENIZER_FILE}, and its dataset {dataset or '?'} is gone or was "
                        f"rewritten (manifest digest {m.digest() if m else 'none'}, the model's "
                        f"{labels_doc.get('manifest_digest')}): retrain with this hvdtrain version, which saves the "
                        "tokenizer with the model")
    return fs.read_bytes(fs.join(m.root, m.vocab.get("tokenizer", TOKENIZER_FILE))).decode()


def load_bundle(ref: str, tracking_cfg: Any = None, workdir: str = ".") -> ModelBundle:
    """MODEL as the command takes it: a training output folder, ``runs:/``, ``models:/`` or a registered name."""
    if not ref.startswith(("runs:/", "models:/")) and fs.exists(fs.join(ref, LABELS_FILE)):
        return bundle_from_folder(ref)
    if not ref.startswith(("runs:/", "models:/")) and ("/" in ref or fs.exists(ref)):
        raise DataError(f"--model {ref}: no labels.json there; pass a training output folder (train.output), "
                        "runs:/RUN_ID/model, models:/NAME/VERSION, models:/NAME@ALIAS or a registered model name")

    with tempfile.TemporaryDirectory(prefix="hvdtrain-model-") as local:
        uri, version = tracking.fetch_model(ref, local, tracking_cfg, workdir)
        return bundle_from_folder(local, uri, version)


@dataclass(frozen=True)
class ScoreOptions:
    """How to score: the key column, extra columns carried to the output, batch sizes, threads, the run's time."""

    key_column: str = "id"
    extra_columns: tuple[str, ...] = ()
    predict_batch: int = 256  # rows per model call
    arrow_batch: int = 2048  # rows per Arrow batch into a task (bounds a worker's memory)
    threads: int = 1  # TensorFlow threads per Python worker
    scored_at: Optional[dt.datetime] = None  # one timestamp for the whole run (default: now, UTC)


# -- pure per-batch work (runs in Spark tasks) -----------------------------------------------------------

@dataclass(frozen=True)
class ScoreSpec:
    """What a scoring task needs, as plain data (pickled into the task)."""

    key_column: str
    text_column: Optional[str]
    numeric_columns: tuple[str, ...]
    categorical_columns: tuple[str, ...]
    extra_columns: tuple[str, ...]
    labels: tuple[str, ...]
    tokenizer_json: Optional[str]
    tabular: Optional[dict[str, Any]]
    model_uri: str
    model_version: str
    manifest_digest: str
    model_digest: str
    scored_at: dt.datetime
    predict_batch: int = 256
    threads: int = 1
    input_names: tuple[str, ...] = field(default_factory=tuple)
    input_specs: dict[str, Any] = field(default_factory=dict)  # name -> {"dtype", "shape" without the batch axis}
    task: str = "multiclass"
    threshold: float = 0.5
    model_builder: Optional[str] = None  # model.kind custom: imported before loading (registers custom layers)
    datetime_columns: tuple[str, ...] = ()
    # FLOAT/DOUBLE feature columns, which reach the tasks as Spark's text of the double (input_exprs)
    double_text_columns: tuple[str, ...] = ()
    text_columns: tuple[str, ...] = ()  # more than one: their texts join in one sequence (features.encode_columns)

    @property
    def score_width(self) -> int:
        """Probability columns: one per class (multiclass), both classes (binary), one per label; none for regression."""
        return {"binary": 2, "regression": 0}.get(self.task, len(self.labels))


def reject_reasons(frame: Any, spec: ScoreSpec) -> tuple[list[Optional[str]], dict[str, np.ndarray]]:
    """Why each row cannot be scored (None: it can), and the numeric columns as float arrays (pure pandas)."""
    n = len(frame)
    reasons: list[Optional[str]] = [None] * n

    def flag(mask: np.ndarray, reason: str) -> None:
        for i in np.flatnonzero(mask):
            if reasons[i] is None:
                reasons[i] = reason

    flag(frame[spec.key_column].isna().to_numpy(), f"null key ({spec.key_column})")
    text_columns = list(spec.text_columns) or ([spec.text_column] if spec.text_column else [])
    if text_columns:  # several: null or blank only when all are, as the ETL's validation checks their joined text
        named = ", ".join(text_columns)
        strings = [_strings(frame[c]) for c in text_columns]
        flag(np.logical_and.reduce([s.isna().to_numpy() for s in strings]), f"null text ({named})")
        flag(np.logical_and.reduce([(s.str.strip().fillna("") == "").to_numpy() for s in strings]),
             f"blank text ({named})")
        # U+FFFD: Spark read bytes the file's charset does not decode (a Latin-1 CSV read as UTF-8)
        flag(np.logical_or.reduce([s.str.contains("\ufffd", regex=False).fillna(False).to_numpy(dtype=bool)
                                   for s in strings]), f"undecodable text ({named}): set source.encoding")
    numeric: dict[str, np.ndarray] = {}
    for c in spec.numeric_columns:
        raw = frame[c]
        values = numeric_values(raw)
        bad = (raw.notna().to_numpy() & ~np.isfinite(values))  # NaN and infinities: the ETL rejects them too
        flag(bad, f"bad numeric value in {c}")
        numeric[c] = values
    return reasons, numeric


def _strings(texts: Any) -> Any:
    """A text column as pandas strings (a cast costs more than the check: Spark's Arrow strings need none)."""
    import pandas as pd

    return texts if pd.api.types.is_string_dtype(texts.dtype) and texts.dtype != object else texts.astype("string")


def numeric_values(raw: Any) -> np.ndarray:
    """A numeric column of a batch as float64 (NaN: missing or not a number): numbers as they are (booleans 0/1,
    decimals), text as Python's ``float`` parses it. :func:`input_exprs` sends a FLOAT/DOUBLE or STRING column as
    the text of the double Spark makes of it, which ``float`` parses back exactly: the ETL's writer reads the
    same doubles (Spark's cast)."""
    import pandas as pd

    if pd.api.types.is_numeric_dtype(raw.dtype):  # booleans included; an INT with NULLs is float64 already
        return raw.astype("float64").to_numpy()

    def number(v: Any) -> float:
        if v is None or v is _NA:
            return np.nan
        try:
            return float(v)
        except (TypeError, ValueError):
            return np.nan

    return np.array([number(v) for v in raw.tolist()], dtype=np.float64)


def _is_text_type(kind: Optional[str]) -> bool:
    """A Spark SQL type name of text: string, varchar(n), char(n)."""
    return kind is not None and (kind == "string" or kind.startswith(("varchar", "char")))


def input_exprs(types: dict[str, str], spec: ScoreSpec, columns: Sequence[str]) -> tuple[list[str], tuple[str, ...]]:
    """(Spark SQL select expressions, FLOAT/DOUBLE feature columns sent as text) for the rows to score (pure).

    Feature columns leave Spark in the form the ETL fitted them in, so no pandas conversion can change them:
    a categorical column as ``CAST(c AS STRING)``, the fit's own expression (``etl.stats.category_value``; an INT
    with NULLs would otherwise arrive as float64, ``5.0``); a FLOAT/DOUBLE column (numeric or categorical) as
    the JVM's text of the double, which Python parses back exactly, keeping NaN apart from NULL (one NaN in
    pandas); a STRING numeric column as the text of Spark's parse of it (the ETL's), 'NaN' when it has none;
    a datetime column as ``unix_date``/``unix_micros`` (``hvdtrain.data.features.datetime_values``). A
    column also asked for as an extra output column keeps its own type.
    """
    extra = set(spec.extra_columns)
    double_text = tuple(c for c in (*spec.numeric_columns, *spec.categorical_columns)
                        if c not in extra and types.get(c) in ("float", "double"))
    out = []
    for c in columns:
        q = f"`{c}`"
        if c in extra:
            out.append(q)
        elif c in double_text:  # a FLOAT widened first: its own text is not the double's ("3.4E38")
            out.append(f"CAST(CAST({q} AS DOUBLE) AS STRING) AS {q}")
        elif c in spec.numeric_columns and _is_text_type(types.get(c)):
            # Spark's parse, as the ETL's validation, fit and writer read the column ("1d", " 7 ", "0x1p3"), as
            # the double's text; a value Spark cannot parse as 'NaN', which rejects the row as validation does
            out.append(f"CASE WHEN {q} IS NOT NULL AND try_cast({q} AS DOUBLE) IS NULL THEN 'NaN' "
                       f"ELSE CAST(try_cast({q} AS DOUBLE) AS STRING) END AS {q}")
        elif c in spec.categorical_columns:
            out.append(f"CAST({q} AS STRING) AS {q}")
        elif c in spec.datetime_columns:
            fn = "unix_date" if types.get(c) == "date" else "unix_micros"
            out.append(f"{fn}({q if fn == 'unix_date' else f'CAST({q} AS TIMESTAMP)'}) AS {q}")
        else:
            out.append(q)
    return out, double_text


def _input_json(frame: Any, i: int, spec: ScoreSpec) -> str:
    cols = [c for c in (*(spec.text_columns or [spec.text_column]), *spec.numeric_columns, *spec.categorical_columns,
                        *spec.datetime_columns) if c]
    row = {c: frame[c].iloc[i] for c in cols}
    return json.dumps({k: (None if v is None or (isinstance(v, float) and np.isnan(v)) else str(v))
                       for k, v in row.items()})


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-np.clip(x.astype(np.float64), -60, 60)))).astype(np.float32)


def probabilities(outputs: np.ndarray, task: str) -> np.ndarray:
    """The model's scores as the task's probability columns (``[rows, score_width]``); regression: none."""
    outputs = np.asarray(outputs)
    if task == "multiclass":
        return softmax(outputs)
    if task == "binary":
        p = _sigmoid(outputs[:, 0])
        return np.stack([1 - p, p], axis=1)
    if task == "multilabel":
        return _sigmoid(outputs)
    return np.zeros((len(outputs), 0), np.float32)


def decide(probs: np.ndarray, values: np.ndarray, spec: "ScoreSpec") -> tuple[list[Any], np.ndarray]:
    """(predicted_label, predicted_score) per row: the class and its probability (multiclass); the positive
    class's probability (binary, label at ``threshold``); the label set joined by ``|`` and the highest label
    probability (multilabel); no label and the predicted value (regression)."""
    labels = np.array(spec.labels, dtype=object)
    if spec.task == "regression":
        return [None] * len(values), np.asarray(values, np.float32).reshape(-1)
    if spec.task == "binary":
        return list(labels[(probs[:, 1] >= spec.threshold).astype(int)]), probs[:, 1]
    if spec.task == "multilabel":
        return (["|".join(labels[row >= spec.threshold]) for row in probs],
                probs.max(axis=1) if probs.shape[1] else np.zeros(len(probs), np.float32))
    return list(labels[probs.argmax(axis=1)]), probs.max(axis=1)


def encode_rows(frame: Any, spec: ScoreSpec, encoder: Any, numeric: Optional[dict[str, np.ndarray]] = None
                ) -> dict[str, np.ndarray]:
    """Model inputs for rows that passed :func:`reject_reasons` (the ETL's FeatureEncoder)."""
    texts: Optional[list[Any]] = frame[spec.text_column].astype(str).tolist() if spec.text_column else None
    if len(spec.text_columns) > 1:  # a tuple of the row's texts, a missing one None (as the ETL's writer passes)
        texts = [tuple(None if v is None or v is _NA or (isinstance(v, float) and np.isnan(v)) else str(v)
                       for v in row) for row in frame[list(spec.text_columns)].itertuples(index=False)]
    if numeric is None:
        numeric = {c: numeric_values(frame[c]) for c in spec.numeric_columns}
    # the numeric row as the ETL's writer passes it: numeric columns, then datetime columns (unix_date/micros)
    numeric = {**numeric, **{c: numeric_values(frame[c]) for c in spec.datetime_columns}}
    num_cols = [*spec.numeric_columns, *spec.datetime_columns]
    num_rows = [[None if np.isnan(numeric[c][i]) else float(numeric[c][i]) for c in num_cols]
                for i in range(len(frame))]
    # values as they come (a bool stays a bool, input_exprs sends Spark's strings): the encoder makes the string
    # the ETL counted (hvdtrain.data.features.category_string); a double sent as the JVM's text is parsed back first
    cat_rows = [[_category(v, c in spec.double_text_columns) for v, c in zip(row, spec.categorical_columns)]
                for row in frame[list(spec.categorical_columns)].itertuples(index=False)] \
        if spec.categorical_columns else [[] for _ in range(len(frame))]
    feats = encoder.encode(texts, num_rows, cat_rows)
    return {name: feats[name] for name in spec.input_names} if spec.input_names else feats


def _category(value: Any, double_text: bool) -> Any:
    """A categorical cell as the encoder takes it (None: missing)."""
    if value is None or value is _NA or (isinstance(value, float) and np.isnan(value)):
        return None
    return float(value) if double_text else value


def score_frame(frame: Any, spec: ScoreSpec, encoder: Any, predict: Any, counters: Any = None) -> Any:
    """One Arrow batch of raw rows -> its rows of :func:`batch_ddl` (predictions, and rejects with their reason).

    Scored rows come first, then rejects. The class probabilities leave as one
    float32 column per class and the run's constants (model URI, version,
    manifest digest, ``scored_at``) are not repeated per row: :func:`finish_exprs`
    builds the output columns from these on the JVM, where that costs nothing
    per row, while an array column from pandas is converted row by row.
    """
    import pandas as pd

    reasons, numeric = reject_reasons(frame, spec)
    ok = np.array([r is None for r in reasons], dtype=bool)
    good = frame.reset_index(drop=True) if ok.all() else frame[ok].reset_index(drop=True)
    bad_idx = np.flatnonzero(~ok)
    n_bad = len(bad_idx)
    probs = np.full((len(good) + n_bad, spec.score_width), np.nan, dtype=np.float32)  # NaN: a reject's row
    values = np.full(len(good), np.nan, dtype=np.float32)  # the raw output (regression's prediction)
    for start in range(0, len(good), spec.predict_batch):
        chunk = good.iloc[start:start + spec.predict_batch]
        nums = {c: v[ok][start:start + spec.predict_batch] for c, v in numeric.items()}
        raw = np.asarray(predict(encode_rows(chunk, spec, encoder, nums)))
        probs[start:start + len(chunk)] = probabilities(raw, spec.task)
        values[start:start + len(chunk)] = raw[:, 0]
    predicted, scores = decide(probs[:len(good)], values, spec)

    def ordered(col: str) -> np.ndarray:  # scored rows first, then rejects; object arrays (see _column)
        return np.concatenate([_values(good[col]), _values(frame[col].iloc[bad_idx])])

    key = ordered(spec.key_column)
    out = pd.DataFrame({spec.key_column: _column([v if v is None or isinstance(v, str) else str(v) for v in key])})
    out["predicted_label"] = _column(predicted + [None] * n_bad)
    out["predicted_score"] = np.concatenate([np.asarray(scores, np.float32), np.full(n_bad, np.nan, np.float32)])
    for name, column in zip(prob_columns(spec.score_width), probs.T):
        out[name] = column
    for c in spec.extra_columns:
        out[c] = _column(list(ordered(c)))
    none: list[Optional[str]] = [None] * len(good)  # the good rows come first, unrejected
    out["reject_reason"] = _column(none + [reasons[i] for i in bad_idx])
    out["reject_input"] = _column(none + [_input_json(frame, int(i), spec) for i in bad_idx])
    if counters is not None:
        counters.count(rows_in=len(frame), scored=len(good), rejected=n_bad)
    return out


def prob_columns(num_classes: int) -> list[str]:
    """The per-class probability columns of a scored batch (see :func:`score_frame`)."""
    return [f"{PROB_PREFIX}{i}" for i in range(num_classes)]


def batch_ddl(key_column: str, num_classes: int, extra: Sequence[tuple[str, str]]) -> str:
    """The schema of :func:`score_frame`'s batches, as Spark DDL."""
    cols = [(key_column, "string"), ("predicted_label", "string"), ("predicted_score", "float"),
            *[(name, "float") for name in prob_columns(num_classes)], *extra, *REJECT_COLUMNS]
    return ", ".join(f"`{name}` {kind}" for name, kind in cols)


def finish_exprs(spec: ScoreSpec) -> list[str]:
    """Spark SQL expressions from :func:`batch_ddl` columns to the :func:`output_ddl` columns, in order."""
    scored = "`reject_reason` IS NULL"
    probs = ", ".join(f"`{name}`" for name in prob_columns(spec.score_width))
    array = f"CASE WHEN {scored} THEN array({probs}) END" if probs else "CAST(NULL AS array<float>)"
    return [f"`{spec.key_column}`", "`predicted_label`",
            f"CASE WHEN {scored} THEN `predicted_score` END AS `predicted_score`",
            f"{array} AS `probabilities`",
            *[f"`{c}`" for c in spec.extra_columns],
            f"{_sql_string(spec.model_uri)} AS `model_uri`", f"{_sql_string(spec.model_version)} AS `model_version`",
            f"{_sql_string(spec.manifest_digest)} AS `manifest_digest`",
            f"TIMESTAMP {_sql_string(_timestamp_text(spec.scored_at))} AS `scored_at`",
            "`reject_reason`", "`reject_input`"]


def _sql_string(value: str) -> str:
    """A Spark SQL string literal (backslash escapes are on by default: spark.sql.parser.escapedStringLiterals)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _timestamp_text(when: dt.datetime) -> str:
    """An instant with its offset; a naive time stays naive (Spark reads it in the session time zone, as before)."""
    text = when.strftime("%Y-%m-%d %H:%M:%S.%f")
    offset = when.utcoffset()
    if offset is None:
        return text
    minutes = int(offset.total_seconds()) // 60
    return f"{text}{'+' if minutes >= 0 else '-'}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def _values(series: Any) -> np.ndarray:
    import pandas as pd

    if pd.api.types.is_string_dtype(series.dtype) and series.dtype != object:  # Spark's Arrow strings: no loop
        return series.to_numpy(dtype=object, na_value=None)
    return np.array([None if v is None or v is _NA or (isinstance(v, float) and np.isnan(v)) else v
                     for v in series.tolist()], dtype=object)


def _column(values: list) -> Any:
    """An object column: pandas 3's arrow-backed strings reach Arrow as chunked arrays, which Spark refuses."""
    import pandas as pd

    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return pd.Series(arr, dtype=object)


# -- the worker side ------------------------------------------------------------------------------------

_MODELS: dict[str, tuple[Any, Any]] = {}  # model digest -> (predict function, encoder); one per Python worker


def worker_model(spec: ScoreSpec, model_bytes: Any, counters: Any = None) -> tuple[Any, Any]:
    """This worker's (predict, encoder), loaded on first use and kept for later tasks."""
    if spec.model_digest in _MODELS:
        return _MODELS[spec.model_digest]
    limit_threads(spec.threads)  # one Spark core per task: TensorFlow must not spread over the others' cores

    import_user_code(spec.model_builder)

    model = load_keras(model_bytes.value if hasattr(model_bytes, "value") else model_bytes)
    _MODELS[spec.model_digest] = (compile_predict(model, spec.input_specs),
                                  FeatureEncoder(spec.tokenizer_json, spec.tabular))
    if counters is not None:
        counters.count(model_loads=1)
    # PySpark's reused worker runs gc.collect() after every task, and Python's own full collections walk the
    # whole heap too: with TensorFlow and Keras loaded that is ~0.3 s of CPU per task. Moving what exists now
    # (modules, the model, the tokenizer: kept for the worker's life) to the permanent generation spares it.
    gc.freeze()
    return _MODELS[spec.model_digest]


def limit_threads(threads: int) -> None:
    """A scoring worker's thread budget: ``threads`` TensorFlow intra- and inter-op threads, and as many
    tokenizer (Rayon) threads. Takes effect only before TensorFlow and the tokenizer's pool first run."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("RAYON_NUM_THREADS", str(threads))  # the tokenizer's thread pool
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    except RuntimeError:
        pass  # already initialized in this process (driver-side use): keep its settings


def compile_predict(model: Any, input_specs: dict[str, Any]) -> Any:
    """``model(x, training=False)`` as one graph traced for any batch size; returns logits as numpy.

    With the inputs' signature known (labels.json ``input_specs``) the graph is
    traced once, up front: a short last batch does not retrace, and a call skips
    tf.function's per-call signature matching. Without it, tf.function traces
    on first use and relaxes the batch axis after the first other size.
    """
    import tensorflow as tf

    fn = tf.function(lambda x: model(x, training=False), reduce_retracing=True)
    if not input_specs:
        return lambda x: fn(x).numpy()
    dtypes = {name: np.dtype(s["dtype"]) for name, s in input_specs.items()}
    graph = fn.get_concrete_function({name: tf.TensorSpec([None, *s["shape"]], s["dtype"], name=name)
                                      for name, s in input_specs.items()})
    return lambda x: graph({name: np.asarray(x[name], dtype) for name, dtype in dtypes.items()}).numpy()


def release_zip_finders() -> None:
    """Drop zip-archive finders from ``sys.path_importer_cache`` (a cache: they are rebuilt when next needed).

    PySpark's worker calls ``importlib.invalidate_caches()`` before every task;
    on Python 3.10/3.11 that makes every cached ``zipimporter`` re-read its whole
    archive (CPython gh-103200, lazy from 3.12). The worker imports pyspark from
    ``pyspark.zip``, leaving one finder per imported sub-package: 14 full reads
    of a 1,200-entry archive, about 0.1 s of CPU per task on an idle core. Loaded
    modules keep their own loaders, so nothing already imported is affected.
    """
    import sys
    import zipimport

    if sys.version_info >= (3, 12):
        return
    for path, finder in list(sys.path_importer_cache.items()):
        if isinstance(finder, zipimport.zipimporter):
            sys.path_importer_cache.pop(path, None)


def import_user_code(builder: Optional[str]) -> None:
    """Import a custom model's module, so its ``@keras.saving.register_keras_serializable`` layers load.

    The module comes with the job: ``model.code`` is shipped to Spark's executors
    (``SparkContext.addPyFile``) and to YARN containers with the project's code.
    """
    if not builder:
        return
    import importlib

    module = builder.partition(":")[0]
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise DataError(f"the model was built by {builder}, whose module {module} does not import here ({exc}): "
                        "set model.code to the folder holding it (it is shipped to the executors), or install it "
                        "where the model runs") from None


def load_keras(model_bytes: bytes) -> Any:
    """A Keras model from the bytes of a ``.keras`` file (Keras loads from a path)."""
    import keras

    with tempfile.TemporaryDirectory(prefix="hvdtrain-score-") as tmp:
        path = os.path.join(tmp, MODEL_FILE)
        with open(path, "wb") as fh:
            fh.write(model_bytes)
        return keras.saving.load_model(path, compile=False)


class Counters:
    """Spark accumulators for the row accounting, each added where the rows are counted."""

    NAMES = ("rows_in", "scored", "rejected", "model_loads", "tasks", "batches")

    def __init__(self, spark: Any):
        self._acc = {name: spark.sparkContext.accumulator(0) for name in self.NAMES}

    def count(self, **amounts: int) -> None:
        for name, n in amounts.items():
            self._acc[name].add(n)

    def values(self) -> dict[str, int]:
        return {name: int(acc.value) for name, acc in self._acc.items()}


# -- schema and the Spark plan ------------------------------------------------------------------------

def output_ddl(key_column: str, extra: Sequence[tuple[str, str]], rejects: bool = True) -> str:
    """The scored frame's schema as Spark DDL (key, predictions, extra columns, provenance[, reject columns])."""
    cols = [(key_column, "string"), *PREDICTION_COLUMNS, *extra, *PROVENANCE_COLUMNS,
            *(REJECT_COLUMNS if rejects else ())]
    return ", ".join(f"`{name}` {kind}" for name, kind in cols)


def score(spark: Any, df: Any, model: Any, options: Optional[ScoreOptions] = None,
          counters: Optional[Counters] = None) -> Any:
    """Score a DataFrame of raw rows; returns predictions and rejects (``reject_reason`` not null) as one frame.

    Args:
        df: rows with the key column and the model's source columns (its labels.json names them).
        model: a :class:`ModelBundle` or a MODEL reference (folder, runs:/, models:/, registered name).
        counters: accumulators for rows in / scored / rejected, tasks and model loads (read after an action).
    """
    opts = options or ScoreOptions()
    key_column, extra_columns = opts.key_column, list(opts.extra_columns)
    bundle = model if isinstance(model, ModelBundle) else load_bundle(model)
    missing = [c for c in [key_column, *bundle.feature_columns(), *extra_columns] if c not in df.columns]
    if missing:
        raise DataError(f"the rows to score lack column(s) {', '.join(missing)} that model {bundle.uri} (manifest "
                        f"{bundle.manifest_digest}) reads; they have {', '.join(df.columns)}")
    spec = make_spec(bundle, opts)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(opts.arrow_batch))
    model_bc = spark.sparkContext.broadcast(bundle.model_bytes)
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    schema = batch_ddl(key_column, spec.score_width, [(c, types[c]) for c in extra_columns])
    cols = list(dict.fromkeys([key_column, *bundle.feature_columns(), *extra_columns]))
    exprs, double_text = input_exprs(types, spec, cols)
    spec = replace(spec, double_text_columns=double_text)

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        predict, encoder = worker_model(spec, model_bc, counters)
        if counters is not None:
            counters.count(tasks=1)
        for frame in batches:
            if counters is not None:
                counters.count(batches=1)
            yield score_frame(frame, spec, encoder, predict, counters)
        release_zip_finders()  # this worker's next task starts cheaper (see the function)

    return df.selectExpr(*exprs).mapInPandas(run, schema).selectExpr(*finish_exprs(spec))


def make_spec(bundle: ModelBundle, options: Optional[ScoreOptions] = None) -> ScoreSpec:
    """The plain-data task spec of a bundle and options."""
    opts = options or ScoreOptions()
    tab = bundle.tabular or {}
    return ScoreSpec(
        key_column=opts.key_column, text_column=bundle.text_column, text_columns=tuple(bundle.text_columns),
        numeric_columns=tuple(tab.get("numeric_columns", [])),
        categorical_columns=tuple(tab.get("categorical_columns", [])), extra_columns=tuple(opts.extra_columns),
        labels=tuple(bundle.labels), tokenizer_json=bundle.tokenizer_json, tabular=bundle.tabular,
        model_uri=bundle.uri, model_version=bundle.version, manifest_digest=bundle.manifest_digest,
        model_digest=bundle.digest,
        scored_at=opts.scored_at or dt.datetime.now(dt.timezone.utc).replace(microsecond=0),
        predict_batch=opts.predict_batch, threads=opts.threads, input_names=tuple(bundle.labels_doc.get("inputs", ())),
        input_specs=dict(bundle.labels_doc.get("input_specs", {})), task=bundle.labels_doc.get("task", "multiclass"),
        threshold=float(bundle.labels_doc.get("threshold", 0.5)), model_builder=bundle.labels_doc.get("model_builder"),
        datetime_columns=tuple((tab.get("datetime") or {}).get("columns", [])))


def predict_features(spark: Any, df: Any, model: Any, options: Optional[ScoreOptions] = None) -> Any:
    """Predict on rows that already hold the model's inputs (e.g. ``input_ids`` / ``attention_mask`` arrays).

    The same per-worker model cache and batched predict as :func:`score`, without
    preprocessing: for inputs made elsewhere with the ETL's code, and for
    comparing with ``mlflow.pyfunc.spark_udf`` on equal terms. Returns key + ``probabilities``.
    """
    opts = options or ScoreOptions()
    key_column = opts.key_column
    bundle = model if isinstance(model, ModelBundle) else load_bundle(model)
    spec = make_spec(bundle, opts)
    names = list(spec.input_names)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(opts.arrow_batch))
    model_bc = spark.sparkContext.broadcast(bundle.model_bytes)
    dtypes = {n: v["dtype"] for n, v in bundle.labels_doc.get("input_specs", {}).items()}

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pandas as pd

        predict, _ = worker_model(spec, model_bc)
        for frame in batches:
            probs = np.zeros((len(frame), spec.score_width), dtype=np.float32)
            for start in range(0, len(frame), spec.predict_batch):
                chunk = frame.iloc[start:start + spec.predict_batch]
                x = {n: np.stack(chunk[n].to_numpy()).astype(dtypes.get(n, "int64")) for n in names}
                probs[start:start + len(chunk)] = probabilities(np.asarray(predict(x)), spec.task)
            out = pd.DataFrame({key_column: _column(list(_values(frame[key_column])))})
            for name, values in zip(probs_cols, probs.T):  # one float column per class: see score_frame
                out[name] = values
            yield out
        release_zip_finders()

    probs_cols = prob_columns(spec.score_width)
    schema = ", ".join([f"`{key_column}` string", *[f"`{c}` float" for c in probs_cols]])
    return df.select(key_column, *names).mapInPandas(run, schema).selectExpr(
        f"`{key_column}`", f"array({', '.join(f'`{c}`' for c in probs_cols)}) AS `probabilities`")
