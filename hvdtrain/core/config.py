"""Typed job config: YAML in and out, ``key=value`` overrides, validation.

Each block is a dataclass that checks itself when built. Unknown keys and bad
values fail with one line naming the dotted field, the value and what is
allowed, e.g. ``train.batch_size must be > 0 (got 0)``.

Paths: a relative path in a YAML file resolves against that file's folder;
``{workdir}`` and ``{name}`` in a path expand to the job's values. Strings with
a scheme (``hdfs://...``) are left as they are.

This module imports no heavy dependency (no TensorFlow, Spark or Horovod).
"""
from __future__ import annotations

import dataclasses
import difflib
import hashlib
import ipaddress
import json
import math
import os
import posixpath
import re
import types
import typing
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union

import yaml

from hvdtrain.core import redaction, secrets, tasks
from hvdtrain.core.errors import ConfigError

SPLITS = ("train", "validation", "test")
MAX_HASH_BUCKETS = 2**31 - 2  # + the missing bucket, an embedding index still fits int32
# etl.datetime_parts: calendar parts of a date/timestamp feature (hvdtrain.data.features.DATETIME_PERIODS)
DATETIME_PARTS = ("year", "month", "day", "day_of_week", "day_of_year", "hour", "minute")


def path_field(default: Optional[str]) -> Any:
    """A config field holding a path: relative values resolve against the YAML file's folder,
    ``{workdir}`` and ``{name}`` expand (see :func:`path_fields`)."""
    return field(default=default, metadata={"path": True})


def _require(ok: bool, name: str, value: object, expected: str) -> None:
    if not ok:
        raise ConfigError(name, value, expected)


@dataclass
class SampleConfig:
    """A deterministic synthetic text-classification table (demo and tests).

    Each document mixes class-specific words with shared filler words; a known
    fraction of labels is replaced by a different class, so the best possible
    test accuracy is about ``1 - label_noise``.
    """

    rows: int = 6000
    num_classes: int = 4
    words_per_class: int = 40
    filler_words: int = 300
    class_word_rate: float = 0.3
    min_words: int = 12
    max_words: int = 40
    label_noise: float = 0.1
    seed: int = 7
    positive_rate: float = 0.02  # task binary: the fraction of positive rows
    noise_std: float = 0.5  # task regression: the target's Gaussian noise (the best possible RMSE)

    def __post_init__(self) -> None:
        _require(self.rows > 0, "rows", self.rows, "must be > 0")
        _require(self.num_classes >= 2, "num_classes", self.num_classes, "must be >= 2")
        _require(self.words_per_class > 0, "words_per_class", self.words_per_class, "must be > 0")
        _require(self.filler_words > 0, "filler_words", self.filler_words, "must be > 0")
        _require(0 < self.class_word_rate <= 1, "class_word_rate", self.class_word_rate, "must be in (0, 1]")
        _require(0 < self.min_words <= self.max_words, "min_words", self.min_words,
                 f"must be > 0 and <= max_words ({self.max_words})")
        _require(0 <= self.label_noise < 1, "label_noise", self.label_noise, "must be in [0, 1)")
        _require(0 < self.positive_rate < 1, "positive_rate", self.positive_rate, "must be in (0, 1)")
        _require(self.noise_std >= 0, "noise_std", self.noise_std, "must be >= 0")


# The character sets Spark 4 reads csv/json files in (its CSVOptions/JSONOptions refuse others).
Charset = Literal["utf-8", "iso-8859-1", "us-ascii", "utf-16", "utf-16be", "utf-16le", "utf-32"]


@dataclass
class SourceConfig:
    """Where the raw rows come from: a Hive table or files at a URI."""

    table: Optional[str] = None
    path: Optional[str] = path_field(None)
    format: Optional[Literal["parquet", "orc", "csv", "json"]] = None
    schema: Optional[str] = None  # Spark DDL for files, e.g. "id STRING, text STRING, label STRING"
    # The character set of csv/json files; null reads UTF-8. Spark reads these (others: convert with iconv).
    encoding: Optional[Charset] = None
    text_column: Optional[str] = "text"  # null for a tabular-only dataset
    # Several text columns (e.g. [title, body]) in one input_ids feature, [SEP] between them (hvdtrain.data.features
    # encode_columns); text_column then becomes the first of them.
    text_columns: list[str] = field(default_factory=list)
    label_column: str = "label"
    key_column: str = "id"
    numeric_columns: list[str] = field(default_factory=list)
    categorical_columns: list[str] = field(default_factory=list)
    # DATE / TIMESTAMP columns, each a numeric feature (days / seconds since 1970-01-01 UTC, scaled like the
    # numeric columns) plus the calendar parts etl.datetime_parts asks for (hvdtrain.data.features.datetime_values).
    datetime_columns: list[str] = field(default_factory=list)
    filter: Optional[str] = None  # a Spark SQL predicate applied at read time
    sample: Optional[SampleConfig] = None
    # A numeric column whose value (finite, >= 0) multiplies the row's loss; null: every row weighs 1.
    weight_column: Optional[str] = None

    def __post_init__(self) -> None:
        _require((self.table is None) != (self.path is None), "table", self.table,
                 "or source.path must be set, not both (a Hive table db.name, or files at a URI)")
        if self.table is not None:
            _require(all(p.isidentifier() for p in self.table.split(".")) and self.table.count(".") <= 1,
                     "table", self.table, "must be a Hive table name like db.name")
        if self.path is not None:
            _require(self.format is not None, "format", self.format,
                     "must be set when source.path is: one of parquet, orc, csv, json")
        _require(self.encoding is None or self.format in ("csv", "json"), "encoding", self.encoding,
                 "applies to csv and json files only: remove it (Hive tables, Parquet and ORC hold UTF-8)")
        if self.filter is not None:
            check_predicate("filter", self.filter)
        if self.text_columns:
            _require(len(set(self.text_columns)) == len(self.text_columns), "text_columns", self.text_columns,
                     "must not repeat a column")
            _require(self.text_column in (None, "text", self.text_columns[0]), "text_column", self.text_column,
                     f"and text_columns ({self.text_columns}) are both set: keep text_columns only")
            self.text_column = self.text_columns[0]
        _require(self.text_column is not None
                 or bool(self.numeric_columns or self.categorical_columns or self.datetime_columns),
                 "text_column", self.text_column, "may be null only when numeric_columns, categorical_columns or "
                 "datetime_columns name the features")
        roles = [c for c in (self.key_column, self.text_column, self.label_column, *self.text_columns) if c]
        features = self.numeric_columns + self.categorical_columns + self.datetime_columns
        clash = sorted({c for c in features if c in roles or features.count(c) > 1})
        _require(not clash, "numeric_columns", clash,
                 "must not repeat a column or name the key, text or label column")
        _require(self.weight_column is None or self.weight_column not in roles + features, "weight_column",
                 self.weight_column, "must be a column of its own, not the key, text, label or a feature column")


@dataclass
class RangeRule:
    min: Optional[float] = None
    max: Optional[float] = None

    def __post_init__(self) -> None:
        _require(self.min is not None or self.max is not None, "min", self.min, "or max must be set")
        _require(self.min is None or self.max is None or self.min <= self.max, "min", self.min,
                 f"must be <= max ({self.max})")


@dataclass
class ValidationConfig:
    """Row rules. A row that breaks one is quarantined in ``rejects/`` with the
    rule and the offending value; nothing is dropped silently."""

    required_columns: list[str] = field(default_factory=list)
    not_null: list[str] = field(default_factory=list)
    allowed_values: dict[str, list[str]] = field(default_factory=dict)
    ranges: dict[str, RangeRule] = field(default_factory=dict)
    regex: dict[str, str] = field(default_factory=dict)
    text_min_chars: int = 1
    text_max_chars: Optional[int] = 100_000  # longer texts are rejected (text_too_long); null: no limit
    unique_key: bool = True
    min_rows: int = 1
    fail_if_reject_fraction_over: Optional[float] = None

    def __post_init__(self) -> None:
        import re

        _require(self.text_min_chars >= 1, "text_min_chars", self.text_min_chars, "must be >= 1")
        _require(self.text_max_chars is None or self.text_max_chars >= self.text_min_chars, "text_max_chars",
                 self.text_max_chars, f"must be >= text_min_chars ({self.text_min_chars})")
        _require(self.min_rows >= 0, "min_rows", self.min_rows, "must be >= 0")
        frac = self.fail_if_reject_fraction_over
        _require(frac is None or 0 <= frac < 1, "fail_if_reject_fraction_over", frac, "must be in [0, 1)")
        for col, pattern in self.regex.items():
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ConfigError(f"regex.{col}", pattern, f"is not a valid regular expression ({exc})") from None


@dataclass
class HiveConfig:
    """Hive metastore. Embedded (Derby, local warehouse) unless the cluster's
    hive-site.xml is on Spark's classpath and ``embedded: false``."""

    embedded: bool = True
    warehouse_dir: str = path_field("{workdir}/hive/warehouse")
    metastore_dir: str = path_field("{workdir}/hive/metastore")


@dataclass
class SparkConfig:
    master: str = "local[2]"
    app_name: str = "hvdtrain-etl-{name}"
    conf: dict[str, str] = field(default_factory=dict)
    # Spark event logs for the history server (ETL, scoring, YARN launches): off when null. On a cluster, the
    # folder the history server reads (spark.history.fs.logDirectory), e.g. hdfs://namenode:8020/spark-history.
    event_log_dir: Optional[str] = path_field(None)


def event_log_conf(spark: SparkConfig) -> dict[str, str]:
    """The ``spark.eventLog.*`` settings ``spark.event_log_dir`` stands for (pure; empty when it is unset).

    A local folder is given as a ``file:`` URI: a bare path would resolve against the cluster's default
    filesystem (HDFS) once Hadoop's configuration is on Spark's classpath."""
    folder = spark.event_log_dir
    if not folder:
        return {}
    uri = folder if has_scheme(folder) else "file:" + os.path.abspath(folder)
    return {"spark.eventLog.enabled": "true", "spark.eventLog.dir": uri, "spark.eventLog.compress": "true"}


@dataclass
class TensorBoardConfig:
    """TensorBoard event files under ``<train.output>/tensorboard`` (rank 0; hvdtrain/observe/tensorboard.py)."""

    enabled: bool = True
    every_steps: int = 10  # per-step scalars every N optimizer steps (per-epoch scalars at every epoch end)
    graph: bool = True  # the model's graph, once per run

    def __post_init__(self) -> None:
        _require(self.every_steps >= 1, "every_steps", self.every_steps, "must be >= 1")


@dataclass
class EtlConfig:
    """How raw rows become TFRecord shards and a manifest."""

    output: str = path_field("{workdir}/data")
    splits: dict[str, float] = field(default_factory=lambda: {"train": 0.8, "validation": 0.1, "test": 0.1})
    max_length: int = 64
    vocab_size: int = 2000
    vocab_file: Optional[str] = path_field(None)
    lowercase: bool = True
    unicode_nfkc: bool = True
    strip_control_chars: bool = True
    truncation: Literal["right", "left"] = "right"
    impute: Literal["mean", "median", "constant"] = "mean"  # missing numeric values, fitted on train
    impute_value: float = 0.0  # with impute: constant
    scale: bool = True  # standard-scale numeric columns with train mean and std
    # Quantile bins per numeric feature for model.numeric_embedding: ple (edges recorded on the scaled values)
    ple_bins: int = 16
    max_categories: int = 1000  # per categorical column; rarer values share the unknown bucket (index 0)
    # Categorical columns hashed instead of indexed: column -> number of hash buckets (for IDs with millions of
    # values). Index 0 stays the missing bucket; a value goes to 1 + a stable hash mod buckets (hvdtrain.data.features).
    categorical_hash_buckets: dict[str, int] = field(default_factory=dict)
    # Calendar parts of each source.datetime_columns entry, in UTC: year (a number, scaled), and month, day,
    # day_of_week, day_of_year, hour, minute as sin/cos of their angle in the cycle (Dec is next to Jan).
    datetime_parts: list[str] = field(default_factory=list)
    target_shard_mb: float = 64.0
    # At least this many shards per split, so a large split spreads over many ranks (64: 16 hosts x 4 GPUs)...
    min_shards_per_split: int = 64
    # ...but never shards smaller than this (MB, estimated): a small split gets fewer, fuller shards. 0: no bound.
    min_shard_mb: float = 1.0
    # spark.sql.shuffle.partitions for the ETL's aggregations; null leaves it to Spark's adaptive execution.
    shuffle_partitions: Optional[int] = None
    compression: Literal["none", "gzip"] = "none"
    # input_ids / attention_mask stored packed, one bytes value per record (ids as uint8/uint16/int32, the
    # narrowest that holds the vocabulary; the mask as uint8): far cheaper to parse than int64 lists. false writes
    # int64 lists, which any TFRecord reader decodes without the manifest.
    packed_tokens: bool = True
    # Seeds the order of rows inside each shard: a hash of (seed, key), so that a table whose key follows time or
    # the target is not written in that order (etl/split.py: add_order). The same seed gives the same shards.
    seed: int = 1
    overwrite: bool = False

    def __post_init__(self) -> None:
        _require(set(self.splits) == set(SPLITS), "splits", self.splits,
                 f"must have exactly the keys {', '.join(SPLITS)}")
        _require(all(v >= 0 for v in self.splits.values()) and self.splits["train"] > 0, "splits", self.splits,
                 "fractions must be >= 0, with train > 0")
        _require(abs(sum(self.splits.values()) - 1.0) < 1e-6, "splits", self.splits, "fractions must sum to 1")
        _require(2 <= self.max_length <= 4096, "max_length", self.max_length, "must be in [2, 4096]")
        _require(self.vocab_size >= 10, "vocab_size", self.vocab_size, "must be >= 10")
        _require(self.target_shard_mb > 0, "target_shard_mb", self.target_shard_mb, "must be > 0")
        _require(self.max_categories >= 1, "max_categories", self.max_categories, "must be >= 1")
        _require(1 <= self.ple_bins <= 1024, "ple_bins", self.ple_bins, "must be in [1, 1024]")
        _require(all(p in DATETIME_PARTS for p in self.datetime_parts) and
                 len(set(self.datetime_parts)) == len(self.datetime_parts), "datetime_parts", self.datetime_parts,
                 f"must name each part once, out of {', '.join(DATETIME_PARTS)}")
        bad = {c: n for c, n in self.categorical_hash_buckets.items() if not 2 <= n <= MAX_HASH_BUCKETS}
        _require(not bad, "categorical_hash_buckets", bad,
                 f"must map each column to a bucket count in [2, {MAX_HASH_BUCKETS}], e.g. {{user_id: 1000000}}")
        _require(self.min_shards_per_split >= 1, "min_shards_per_split", self.min_shards_per_split, "must be >= 1")
        _require(self.shuffle_partitions is None or self.shuffle_partitions >= 1, "shuffle_partitions",
                 self.shuffle_partitions, "must be >= 1, or null to let Spark's adaptive execution choose")
        _require(self.min_shard_mb >= 0, "min_shard_mb", self.min_shard_mb, "must be >= 0 (0: no lower bound)")


@dataclass
class ModelConfig:
    """Keras model by name.

    ``transformer`` (text: ``input_ids`` + ``attention_mask``) uses ``embed_dim``,
    ``num_heads``, ``ff_dim``, ``num_layers``: tiny by default, DistilBERT-shaped
    with ``embed_dim: 768, num_heads: 12, ff_dim: 3072, num_layers: 6``.
    ``mlp`` (tabular: ``numeric`` and/or ``categorical``) uses ``hidden_units``,
    ``categorical_embed_dim`` (a width, or ``auto``: by each column's cardinality) and
    ``numeric_embedding`` (``auto``, the default: ``ple`` when the dataset has the ETL's quantile edges, else
    ``none``; ``none``: the scaled values as they are; ``ple``: piecewise-linear encoding over the ETL's
    quantile bins; ``periodic``: trainable sin/cos frequencies; each followed by a per-feature linear layer +
    ReLU of width ``numeric_embed_dim``; see docs/models.md). ``dropout`` applies to both.
    ``custom`` calls ``builder`` (``package.module:function``) with the dataset's
    :class:`hvdtrain.data.contract.ModelContract` and ``params`` (free-form, also
    merged into a built-in kind's settings); see docs/models.md.
    """

    kind: Literal["transformer", "mlp", "custom"] = "transformer"
    embed_dim: int = 64
    num_heads: int = 2
    ff_dim: int = 128
    num_layers: int = 1
    dropout: float = 0.1
    hidden_units: list[int] = field(default_factory=lambda: [128, 64])  # mlp: one Dense layer per entry
    # mlp: embedding width of each categorical column; auto: min(32, round(1.6 * cardinality ** 0.56)) per column
    categorical_embed_dim: Union[int, Literal["auto"]] = 8
    # mlp: how the numeric features enter (Gorishniy et al., NeurIPS 2022): none, ple (needs the ETL's
    # preprocessing.tabular.ple_edges, etl.ple_bins), periodic; then a per-feature Dense(numeric_embed_dim) + ReLU.
    # auto: ple when the manifest has the edges (every dataset of this version's ETL), else none; chosen by
    # measurement (benchmarks/README.md, "quality": test ROC AUC 0.70 -> 0.77 on flights, MAE -3.5 % on diamonds).
    numeric_embedding: Literal["auto", "none", "ple", "periodic"] = "auto"
    numeric_embed_dim: int = 24
    periodic_frequencies: int = 48  # periodic: sin/cos pairs per feature
    periodic_sigma: float = 0.01  # periodic: the frequencies start from N(0, sigma) (rtdl_num_embeddings' default)
    builder: Optional[str] = None  # custom: "package.module:function" returning an uncompiled keras.Model
    params: dict[str, Any] = field(default_factory=dict)  # passed to the builder (hvdtrain tune can search them)
    code: Optional[str] = path_field(None)  # a folder holding the builder's package; shipped to YARN and Spark
    # Embeddings with at least this many rows send sparse gradients (Horovod allgather of the touched rows);
    # smaller ones are densified and all-reduced. 0: always dense (see docs/models.md "Sparse embeddings").
    sparse_embedding_rows: int = 100_000

    def __post_init__(self) -> None:
        if self.kind == "custom":
            _require(_is_builder_path(self.builder), "builder", self.builder,
                     'must be "package.module:function" when model.kind is custom, e.g. "examples.wide_deep:build"')
        else:
            _require(self.builder is None, "builder", self.builder,
                     f"is only read with model.kind: custom (model.kind is {self.kind}); set model.kind=custom or "
                     "remove model.builder")
        _require(self.sparse_embedding_rows >= 0, "sparse_embedding_rows", self.sparse_embedding_rows,
                 "must be >= 0 (0: every embedding gradient dense)")
        for name in ("embed_dim", "num_heads", "ff_dim", "num_layers"):
            _require(getattr(self, name) > 0, name, getattr(self, name), "must be > 0")
        _require(self.embed_dim % self.num_heads == 0, "embed_dim", self.embed_dim,
                 f"must be divisible by model.num_heads ({self.num_heads})")
        _require(0 <= self.dropout < 1, "dropout", self.dropout, "must be in [0, 1)")
        _require(bool(self.hidden_units) and all(u > 0 for u in self.hidden_units), "hidden_units",
                 self.hidden_units, "must be a non-empty list of layer widths > 0, e.g. [128, 64]")
        _require(self.categorical_embed_dim == "auto" or self.categorical_embed_dim > 0, "categorical_embed_dim",
                 self.categorical_embed_dim, "must be > 0, or auto (a width per column by its cardinality)")
        for name in ("numeric_embed_dim", "periodic_frequencies"):
            _require(getattr(self, name) > 0, name, getattr(self, name), "must be > 0")
        _require(math.isfinite(self.periodic_sigma) and self.periodic_sigma > 0, "periodic_sigma",
                 self.periodic_sigma, "must be a finite number > 0, e.g. 0.01 (0.01 to 100 are usual)")


def _is_builder_path(value: Optional[str]) -> bool:
    module, sep, func = (value or "").partition(":")
    return bool(sep) and all(p.isidentifier() for p in module.split(".")) and func.isidentifier()


@dataclass
class TaskConfig:
    """What the model predicts (:mod:`hvdtrain.core.tasks`); ``task: binary`` is short for ``task: {kind: binary}``.

    ``label_delimiter`` splits a multilabel string column (an array column needs none); ``threshold``
    turns a probability into a yes for binary and multilabel; ``class_weights: balanced`` weighs each
    class (binary, multiclass) by ``records / (classes * class records)`` of the training split, a mapping
    ``{label: weight}`` by the weights given (training checks the labels against the dataset's).
    ``target_transform`` (regression): the model learns the target standardized with the training split's mean
    and standard deviation (``standardize``), or ``log1p`` of it standardized (``log``, for positive skewed
    targets such as prices), or as it is (``none``); metrics, the exported model and scoring are in the target's
    own units either way (:mod:`hvdtrain.model.heads`). ``positive_label`` (binary): the label encoded 1 (the manifest
    lists it second, ``labels[1]``); null keeps the second label in sorted order.
    """

    kind: Literal["multiclass", "binary", "multilabel", "regression"] = "multiclass"
    label_delimiter: str = "|"
    threshold: float = 0.5
    # none, balanced, or {label: weight} (labels absent from the mapping weigh 1, as in Keras's class_weight)
    class_weights: Union[str, dict[str, float]] = "none"
    target_transform: Literal["standardize", "log", "none"] = "standardize"
    positive_label: Optional[str] = None

    def __post_init__(self) -> None:
        _require(0 < self.threshold < 1, "threshold", self.threshold, "must be in (0, 1)")
        _require(self.positive_label is None or self.kind == "binary", "positive_label", self.positive_label,
                 f"applies to binary tasks only (task is {self.kind}); remove it")
        _require(bool(self.label_delimiter), "label_delimiter", self.label_delimiter, "must be a non-empty string")
        _require(self.class_weights in ("none", "balanced") if isinstance(self.class_weights, str) else
                 bool(self.class_weights) and all(math.isfinite(w) and w >= 0 for w in self.class_weights.values()),
                 "class_weights", self.class_weights, "must be none, balanced or a mapping {label: weight >= 0}")
        _require(self.class_weights == "none" or self.kind in ("binary", "multiclass"), "class_weights",
                 self.class_weights, f"applies to binary and multiclass tasks only (task is {self.kind}); use none")
        _require(self.target_transform != "log" or self.kind == "regression", "target_transform",
                 self.target_transform, f"log applies to regression only (task is {self.kind}); remove it")


@dataclass
class EarlyStoppingConfig:
    """Stop when the validation ``metric`` has not improved for ``patience`` epochs.

    Decided from metrics summed over all ranks, so every rank stops at the same
    epoch. ``mode: auto`` minimizes loss and maximizes accuracy and macro F1.
    """

    metric: str = "loss"  # one of the task's metrics (hvdtrain.core.tasks.METRICS), e.g. roc_auc, rmse
    patience: int = 3
    mode: Literal["auto", "min", "max"] = "auto"
    min_delta: float = 0.0  # an improvement must beat the best by more than this
    restore_best: bool = True  # end with (and export) the best epoch's weights

    def __post_init__(self) -> None:
        _require(self.patience >= 0, "patience", self.patience, "must be >= 0 epochs")
        _require(self.min_delta >= 0, "min_delta", self.min_delta, "must be >= 0")
        natural = tasks.direction(self.metric)
        _require(self.mode in ("auto", natural), "mode", self.mode,
                 f"must be auto or {natural} for metric {self.metric} (a {'lower' if natural == 'min' else 'higher'}"
                 " value is better)")

    @property
    def direction(self) -> str:
        """``min`` or ``max``, with ``auto`` resolved from the metric."""
        return tasks.direction(self.metric) if self.mode == "auto" else self.mode


@dataclass
class TimelineConfig:
    """Record Horovod's timeline (Chrome trace JSON) for ``steps`` optimizer steps from global step
    ``start_step`` on; rank 0 attaches it to the MLflow run (``hvdtrain timeline summarize FILE`` reads it)."""

    start_step: int = 1
    steps: int = 10

    def __post_init__(self) -> None:
        _require(self.start_step >= 1, "start_step", self.start_step, "must be >= 1 (a global optimizer step)")
        _require(self.steps >= 1, "steps", self.steps, "must be >= 1 optimizer steps to record")


@dataclass
class ElasticConfig:
    """Horovod elastic training (docs/cluster.md): the job keeps going from ``min_ranks`` to ``max_ranks`` ranks.

    The data plan and the global batch are fixed at ``max_ranks`` "virtual ranks" (``max_ranks x batch_size``
    records per step, at the learning rate of ``max_ranks`` ranks), whatever the current size; the ranks
    commit their state every ``commit_every_steps`` and roll back to the last commit when one is lost.
    ``discovery`` prints the available ``host:slots`` lines (horovodrun --host-discovery-script); a host whose
    rank failed sits out a cooldown of ``blacklist_cooldown`` seconds (low, high), growing with each failure.
    """

    min_ranks: int = 1
    max_ranks: int = 2
    commit_every_steps: int = 10
    discovery: Optional[str] = path_field(None)  # default: this host with max_ranks slots
    blacklist_cooldown: list[int] = field(default_factory=lambda: [10, 300])

    def __post_init__(self) -> None:
        _require(self.min_ranks >= 1, "min_ranks", self.min_ranks, "must be >= 1")
        _require(self.max_ranks >= self.min_ranks, "max_ranks", self.max_ranks,
                 f"must be >= train.elastic.min_ranks ({self.min_ranks})")
        _require(self.commit_every_steps >= 1, "commit_every_steps", self.commit_every_steps, "must be >= 1")
        low_high = len(self.blacklist_cooldown) == 2 and 1 <= self.blacklist_cooldown[0] <= self.blacklist_cooldown[1]
        _require(low_high, "blacklist_cooldown", self.blacklist_cooldown,
                 "must be [low, high] seconds with 1 <= low <= high (Horovod's --blacklist-cooldown-range)")


@dataclass
class TrainConfig:
    """Training loop. ``batch_size`` is per rank; the learning rate is per rank
    too and is multiplied by the number of ranks.

    With ``grad_accum_steps: k`` each optimizer step consumes k batches per rank
    and all-reduces once, so the global batch is ``batch_size * k * ranks`` and an
    epoch has ``floor(train_records / (batch_size * k * ranks))`` optimizer steps
    (warm-up and decay count optimizer steps too).
    """

    # auto: by the train split's size, ceil(4000 / sqrt(records)) capped at 100 (hvdtrain.data.plan.auto_epochs):
    # 8 epochs for 270,000 records, 20 for 43,000, 4 for a million, 1 from 16 million; chosen by measurement
    # (docs/models.md)
    epochs: Union[int, Literal["auto"]] = "auto"
    batch_size: int = 64
    learning_rate: float = 1e-3
    warmup_steps: int = 0
    # Records per shuffle window (hvdtrain.data.pipeline.shuffled_windows), at most a rank's share and 128 MB of
    # parsed records (hvdtrain.data.plan.shuffle_window); MosaicML Streaming's default block is the same 262,144.
    shuffle_buffer: int = 262_144
    seed: int = 1234
    output: str = path_field("{workdir}/runs/{name}")
    lr_schedule: Literal["constant", "cosine", "linear"] = "constant"  # after warm-up, to epochs x steps
    min_lr_ratio: float = 0.0  # cosine/linear decay ends at learning rate x this
    clip_norm: Optional[float] = None  # clip gradients by global norm (after the all-reduce)
    grad_accum_steps: int = 1
    fp16_allreduce: bool = False  # send gradients as float16 (Horovod fp16 compression)
    # grouped: one all-reduce of all gradients after the backward pass; overlap: one per gradient, issued as soon
    # as it exists, so communication overlaps backprop (hvdtrain.training.steps.Reduction; README "Overlapped all-reduce");
    # beyond 2 ranks only grouped is bit-reproducible (overlap's fusion groups depend on timing)
    allreduce: Literal["grouped", "overlap"] = "grouped"
    # Optimizer steps per compiled call (Keras's steps_per_execution): fewer Python round trips per step. A call
    # ends at every checkpoint and epoch end, so resume and accounting are per step; 1 with monitoring.step_breakdown
    steps_per_call: int = 1
    mixed_precision: Literal["none", "bfloat16", "float16"] = "none"
    validate_every_epoch: bool = False
    early_stopping: Optional[EarlyStoppingConfig] = None
    progress: Literal["auto", "bar", "log", "off"] = "auto"  # auto: a bar on a terminal, else log lines
    progress_every_steps: int = 50
    progress_every_seconds: float = 30.0
    # TensorFlow op determinism (tf.config.experimental.enable_op_determinism): the same results run to run on
    # GPU too, at some speed. On CPU, runs and mid-epoch resumes are bit-exact without it.
    deterministic: bool = False
    # Audit the data order: each rank appends the record keys of every batch it trains on to
    # <record_trace>/rank<R>.keys (local folder; costs a little speed). Off when null.
    record_trace: Optional[str] = path_field(None)
    timeline: Optional[TimelineConfig] = None  # Horovod timeline of a few steps, on demand; off when null
    elastic: Optional[ElasticConfig] = None  # Horovod elastic mode (docs/cluster.md); off when null

    @property
    def epoch_count(self) -> int:
        """``epochs`` as a number, once training has resolved ``auto`` from the dataset
        (hvdtrain.data.plan.with_epochs)."""
        if self.epochs == "auto":
            raise RuntimeError("train.epochs is still auto: resolve it from the manifest first "
                               "(hvdtrain.data.plan.with_epochs)")
        return self.epochs

    def __post_init__(self) -> None:
        _require(self.epochs == "auto" or self.epochs > 0, "epochs", self.epochs,
                 "must be > 0, or auto (by the train split's size)")
        _require(self.batch_size > 0, "batch_size", self.batch_size, "must be > 0")
        _require(self.learning_rate > 0, "learning_rate", self.learning_rate, "must be > 0")
        _require(self.warmup_steps >= 0, "warmup_steps", self.warmup_steps, "must be >= 0")
        _require(self.shuffle_buffer >= 1, "shuffle_buffer", self.shuffle_buffer, "must be >= 1")
        _require(0 <= self.min_lr_ratio <= 1, "min_lr_ratio", self.min_lr_ratio, "must be in [0, 1]")
        _require(self.clip_norm is None or self.clip_norm > 0, "clip_norm", self.clip_norm,
                 "must be > 0, or null for no clipping")
        _require(self.grad_accum_steps >= 1, "grad_accum_steps", self.grad_accum_steps,
                 "must be >= 1 (1 = no accumulation)")
        _require(self.steps_per_call >= 1, "steps_per_call", self.steps_per_call,
                 "must be >= 1 (optimizer steps per compiled call; 1 = one step per call)")
        _require(self.progress_every_steps >= 1, "progress_every_steps", self.progress_every_steps, "must be >= 1")
        _require(self.progress_every_seconds > 0, "progress_every_seconds", self.progress_every_seconds,
                 "must be > 0")
        if self.elastic is not None:  # what hvdtrain.training.elastic's loop does not do (yet): refused, never ignored
            unsupported = {"early_stopping": self.early_stopping is not None,
                           "validate_every_epoch": self.validate_every_epoch,
                           "grad_accum_steps": self.grad_accum_steps > 1, "fp16_allreduce": self.fp16_allreduce,
                           "allreduce": self.allreduce != "grouped", "steps_per_call": self.steps_per_call > 1,
                           "timeline": self.timeline is not None}
            on = [k for k, v in unsupported.items() if v]
            _require(not on, "elastic", {k: getattr(self, k) for k in on},
                     f"does not work with train.{', train.'.join(on)} yet (elastic jobs "
                     "validate and test at the end, with one grouped float32 all-reduce of one batch per virtual rank "
                     "a step): "
                     f"turn {'them' if len(on) > 1 else 'it'} off, or train.elastic off")

    @property
    def validates_each_epoch(self) -> bool:
        return self.validate_every_epoch or self.early_stopping is not None


@dataclass
class CheckpointConfig:
    """Checkpoints: atomic on any filesystem, published in the background, resumed exactly."""

    dir: str = path_field("{workdir}/checkpoints/{name}")
    every_steps: int = 0  # 0: only at epoch ends
    at_epoch_end: bool = True
    keep_last: int = 3
    keep_best: int = 1
    # auto: validation_accuracy when the run validates every epoch, else train_loss (see JobConfig)
    best_metric: str = "auto"
    best_mode: Literal["auto", "max", "min"] = "auto"  # auto: min for a loss, max otherwise
    resume: str = "auto"  # auto (newest valid), never, or a checkpoint folder
    enabled: bool = True

    def __post_init__(self) -> None:
        _require(self.every_steps >= 0, "every_steps", self.every_steps, "must be >= 0 (0: epoch ends only)")
        _require(self.keep_last >= 1, "keep_last", self.keep_last, "must be >= 1 (the newest is needed to resume)")
        _require(self.keep_best >= 0, "keep_best", self.keep_best, "must be >= 0")


@dataclass
class FaultConfig:
    """Fail fast, never hang: how long a job may make no progress, and Horovod's own timers."""

    stall_timeout: int = 300  # seconds without a finished step (or input) before dumping stacks and exiting
    peer_timeout: int = 60  # seconds a rank waits for a lost peer before exiting (HOROVOD_GLOO_TIMEOUT_SECONDS)
    start_timeout: int = 120  # horovodrun/horovod.spark start-up timeout
    stall_check_warning: int = 60  # Horovod's own stall warning (HOROVOD_STALL_CHECK_TIME_SECONDS)
    checkpoint_timeout: int = 1800  # seconds a checkpoint publish or restore may take (slow storage) before the
    # watchdog calls it a stall; every rank waits for rank 0 under this limit
    max_restarts: int = 0  # relaunch a failed job (lost rank, stall, storage) up to this many times; it resumes
    restart_backoff: float = 10.0  # seconds before the first relaunch, doubling each time (at most 300)

    def __post_init__(self) -> None:
        for name in ("stall_timeout", "peer_timeout", "start_timeout", "stall_check_warning", "checkpoint_timeout"):
            _require(getattr(self, name) > 0, name, getattr(self, name), "must be > 0 seconds")
        _require(self.max_restarts >= 0, "max_restarts", self.max_restarts, "must be >= 0 (0: never relaunch)")
        _require(self.restart_backoff >= 0, "restart_backoff", self.restart_backoff, "must be >= 0 seconds")


@dataclass
class TrackingConfig:
    """MLflow. ``uri`` falls back to $MLFLOW_TRACKING_URI, then a local store."""

    uri: Optional[str] = path_field(None)
    experiment: str = "hvdtrain-{name}"
    enabled: bool = True
    log_every_steps: int = 50  # per-step metrics (loss, samples/s, step time, data wait); 0 = off
    registered_model_name: Optional[str] = None  # also register the logged model under this name
    max_outage_seconds: float = 600.0  # a server outage is ridden out (metrics buffered) this long, then tracking
    # is given up for the run; training never waits on it

    def __post_init__(self) -> None:
        _require(self.max_outage_seconds >= 0, "max_outage_seconds", self.max_outage_seconds, "must be >= 0")
        _require(self.log_every_steps >= 0, "log_every_steps", self.log_every_steps,
                 "must be >= 0 (0 turns per-step metrics off)")
        _require(self.registered_model_name is None or bool(self.registered_model_name.strip()),
                 "registered_model_name", self.registered_model_name, "must be a non-empty name, or null")


@dataclass
class MonitoringConfig:
    """Live metrics for the cluster's Prometheus (see hvdtrain/observe/monitoring.py and the README).

    With ``enabled``, every rank writes its metrics in the Prometheus text
    format to ``<textfile_dir>/hvdtrain_<job>_rank<R>.prom`` (atomically, every
    ``interval_seconds``, from a background thread) for node_exporter's
    textfile collector: on a cluster, point ``textfile_dir`` at the collector's
    folder on each host (a local path). With ``port``, rank 0 also serves
    ``/metrics`` there. ``step_breakdown`` times each step's all-reduce apart
    from the gradient computation and logs, per epoch, where the time went; it
    is off by default because the step then runs as three compiled calls
    instead of one fused call (up to a few ms more per step).
    """

    enabled: bool = True
    interval_seconds: float = 15.0
    textfile_dir: str = path_field("{workdir}/metrics")
    port: Optional[int] = None  # rank 0 serves /metrics here; it must be free
    addr: str = "127.0.0.1"  # the interface /metrics binds to ("0.0.0.0": every interface, for a remote scraper)
    job: str = "{name}"  # the `job` label on every metric
    step_breakdown: bool = False

    def __post_init__(self) -> None:
        _require(self.interval_seconds > 0, "interval_seconds", self.interval_seconds, "must be > 0 seconds")
        _require(not has_scheme(self.textfile_dir), "textfile_dir", self.textfile_dir,
                 "must be a local folder (node_exporter's textfile collector reads local files)")
        _require(self.port is None or 1 <= self.port <= 65535, "port", self.port,
                 "must be a TCP port in 1-65535, or null for no /metrics endpoint")
        _require(bool(self.job.strip()), "job", self.job, "must be a non-empty label value")
        _require(_is_ip(self.addr), "addr", self.addr, "must be an IP address of this host's interface "
                 "(127.0.0.1 by default; 0.0.0.0 for every interface)")


@dataclass
class YarnConfig:
    """Training on YARN through Spark: ``hvdtrain yarn submit`` (see yarn/submit.py)."""

    num_workers: int = 2
    gpus_per_worker: int = 0
    executor_cores: int = 4
    executor_memory: str = "8g"
    # A training job's rank runs as a Python process beside each executor's JVM (TensorFlow, the input pipeline,
    # the model): YARN counts it against the container, so it is added to spark.executor.memoryOverhead
    # (yarn/resources.py). Raise it when YARN kills containers for their memory.
    rank_memory: str = "4g"
    driver_memory: str = "4g"
    queue: Optional[str] = None
    deploy_mode: Literal["client", "cluster"] = "client"
    principal: Optional[str] = None
    keytab: Optional[str] = path_field(None)
    env_archive: Optional[str] = path_field(None)  # a packed env to use as is; built with venv-pack when unset
    env_cache: str = path_field("{workdir}/envs")  # where packed envs are uploaded once per content hash (an HDFS folder)
    python: Optional[str] = None  # an interpreter at this path on every host (a shared install): nothing is shipped
    start_timeout: int = 600
    spark_conf: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # passed to every rank (NCCL_*, GLOO_*, HOROVOD_*)

    def __post_init__(self) -> None:
        _require(self.num_workers >= 1, "num_workers", self.num_workers, "must be >= 1 (pass --num-workers N)")
        _require(self.gpus_per_worker >= 0, "gpus_per_worker", self.gpus_per_worker, "must be >= 0")
        _require(self.executor_cores >= 1, "executor_cores", self.executor_cores, "must be >= 1")
        _require(self.start_timeout > 0, "start_timeout", self.start_timeout, "must be > 0 seconds")
        _require(self.python is None or os.path.isabs(self.python), "python", self.python,
                 "must be an absolute path present on every host (e.g. /opt/conda/envs/ml/bin/python), or null to "
                 "ship the packed environment")
        _require((self.principal is None) == (self.keytab is None), "principal", self.principal,
                 "and yarn.keytab must be set together, for the job's Kerberos login "
                 "(pass --principal user@REALM --keytab /path/user.keytab)")


def checkpoint_metrics(train: TrainConfig, task: str = "multiclass") -> set[str]:
    """The metric names an epoch-end checkpoint records (``validation_roc_auc`` of multiclass: two classes only)."""
    names = {"train_loss", "train_accuracy"}
    if train.validates_each_epoch:
        names |= set(tasks.validation_metrics(task))
    return names


@dataclass
class ScoreConfig:
    """Batch scoring (``hvdtrain score``): the model applied to ``source`` rows, predictions to a Hive table.

    ``source`` (with ``source.filter``) is the input; ``filter`` narrows it further
    (a Spark SQL predicate) and ``columns`` names extra source columns copied to
    the output beside the key. Command-line flags win over ``model``,
    ``output_table``, ``partition`` and ``overwrite``.
    """

    model: Optional[str] = None  # training output folder, runs:/..., models:/name/version|@alias, or a registered name
    output_table: Optional[str] = None  # db.name, created when missing
    partition: Optional[str] = None  # k=v[,k=v], e.g. ds=2026-11-23; default ds=<UTC date of the run>
    rejects_table: Optional[str] = None  # default <output_table>_rejects (same partitions)
    filter: Optional[str] = None
    columns: list[str] = field(default_factory=list)
    overwrite: bool = False  # replace a non-empty partition (atomically); refused otherwise
    predict_batch: int = 256  # rows per model call in a Spark task
    arrow_batch: int = 2048  # rows per Arrow batch handed to a task's iterator (bounds worker memory)
    threads_per_task: int = 1  # TensorFlow threads in each Python worker (Spark runs one worker per core)
    partitions: int = 0  # spread the input over this many tasks before scoring (0: keep the input's partitioning)
    report_dir: str = path_field("{workdir}/score")  # score_report.json and drift_report.json
    drift_sample_rows: int = 20000  # input rows sampled for the drift statistics (0: all)
    psi_threshold: float = 0.2  # population stability index above this is drift (0.1-0.25 is "moderate")
    unknown_token_threshold: float = 0.05  # unknown-token rate above training's by more than this is drift
    fail_on_drift: bool = False  # stop before scoring instead of warning
    min_rows: int = 1  # fewer scored rows than this publishes nothing (an empty input never replaces a partition)
    max_reject_fraction: float = 0.5  # more rejected rows than this fraction of the input publishes nothing

    def __post_init__(self) -> None:
        _require(self.min_rows >= 0, "min_rows", self.min_rows, "must be >= 0 (0: an empty partition may publish)")
        _require(0 <= self.max_reject_fraction <= 1, "max_reject_fraction", self.max_reject_fraction,
                 "must be in [0, 1] (1: any share of rejects publishes)")
        if self.filter is not None:
            check_predicate("filter", self.filter)
        for name in ("output_table", "rejects_table"):
            value = getattr(self, name)
            if value is not None:
                _require(all(p.isidentifier() for p in value.split(".")) and value.count(".") <= 1, name, value,
                         "must be a Hive table name like db.predictions")
        if self.partition is not None:
            try:
                parse_partition(self.partition)
            except ValueError as exc:
                raise ConfigError("partition", self.partition, str(exc)) from None
        for name in ("predict_batch", "arrow_batch", "threads_per_task"):
            _require(getattr(self, name) >= 1, name, getattr(self, name), "must be >= 1")
        _require(self.partitions >= 0, "partitions", self.partitions, "must be >= 0 (0: the input's partitioning)")
        _require(self.drift_sample_rows >= 0, "drift_sample_rows", self.drift_sample_rows, "must be >= 0 (0: all)")
        _require(self.psi_threshold > 0, "psi_threshold", self.psi_threshold, "must be > 0")
        _require(0 < self.unknown_token_threshold <= 1, "unknown_token_threshold", self.unknown_token_threshold,
                 "must be in (0, 1]")
        _require(len(set(self.columns)) == len(self.columns), "columns", self.columns, "must not repeat a column")


_PARTITION_VALUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:+-]{0,127}")
_PREDICATE_FORBIDDEN = (";", "${", "--", "/*")  # a second statement, variable substitution, comments


def check_predicate(name: str, predicate: str) -> None:
    """A Spark SQL filter from a config: one expression, no statement separator, substitution or comment."""
    bad = [t for t in _PREDICATE_FORBIDDEN if t in predicate]
    if bad:
        raise ConfigError(name, predicate, f"must be one Spark SQL predicate without {' or '.join(bad)} "
                          "(e.g. \"lang = 'en' AND ds >= '2026-11-01'\")")


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def parse_partition(spec: str) -> dict[str, str]:
    """``ds=2026-11-23,region=eu`` -> {"ds": "2026-11-23", "region": "eu"} (pure; ValueError says what is wrong)."""
    out: dict[str, str] = {}
    for part in spec.split(","):
        key, sep, value = part.strip().partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key.isidentifier() or not value:
            raise ValueError(f"must be column=value pairs separated by commas, e.g. ds=2026-11-23 (bad part {part!r})")
        if not _PARTITION_VALUE.fullmatch(value):
            raise ValueError(f"partition value {value!r} may hold only letters, digits and . _ : + - "
                             "(e.g. ds=2026-11-23)")
        if key in out:
            raise ValueError(f"names column {key!r} twice")
        out[key.lower()] = value
    return out


@dataclass
class TuneConfig:
    """``hvdtrain tune``: where the Optuna study lives. ``trial`` and ``parent_run_id`` are set by the tune
    driver on each trial's command line (a trial run reports to the study after each epoch); leave them unset."""

    storage: Optional[str] = None  # an Optuna RDB URL (sqlite:///..., mysql://, postgresql://); default below
    study: str = "{name}"  # the study's name in the storage
    output: str = path_field("{workdir}/tune")  # the default SQLite storage, trial outputs and the study's plot
    heartbeat_seconds: int = 30  # a RUNNING trial whose driver is silent 2x this long is failed and re-queued
    max_retries: int = 1  # times a trial whose driver died is re-queued
    trial: Optional[int] = None
    parent_run_id: Optional[str] = None
    metric: str = "auto"  # auto: the task's default (validation_accuracy for multiclass; hvdtrain.core.tasks)

    def __post_init__(self) -> None:
        _require(self.heartbeat_seconds > 0, "heartbeat_seconds", self.heartbeat_seconds, "must be > 0 seconds")
        _require(self.max_retries >= 0, "max_retries", self.max_retries, "must be >= 0")
        _require(bool(self.study) and "/" not in self.study, "study", self.study, "must be a non-empty name")


@dataclass
class JobConfig:
    name: str = "job"
    workdir: str = path_field("work/{name}")
    source: SourceConfig = field(default_factory=lambda: SourceConfig(table="default.rows"))
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    hive: HiveConfig = field(default_factory=HiveConfig)
    spark: SparkConfig = field(default_factory=SparkConfig)
    etl: EtlConfig = field(default_factory=EtlConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    monitoring: MonitoringConfig = field(default_factory=MonitoringConfig)
    tensorboard: TensorBoardConfig = field(default_factory=TensorBoardConfig)
    yarn: YarnConfig = field(default_factory=YarnConfig)
    score: ScoreConfig = field(default_factory=ScoreConfig)
    tune: TuneConfig = field(default_factory=TuneConfig)
    task: TaskConfig = field(default_factory=TaskConfig)

    def __post_init__(self) -> None:
        _require(bool(self.name) and self.name.replace("-", "_").isidentifier(), "name", self.name,
                 "must be letters, digits, '_' or '-'")
        self._check_task_metrics()
        self._resolve_best_metric()
        self._check_hashed_columns()

    def check_output_folders(self) -> None:
        """``train.output`` is replaced whole when a run publishes: checkpoints inside it would be refused at the
        end of training (or lost), so refuse them before anything runs (paths resolved first: see from_dict)."""
        if self.checkpoint.enabled and is_within(self.checkpoint.dir, self.train.output):
            raise ConfigError("checkpoint.dir", self.checkpoint.dir,
                              f"is inside train.output ({self.train.output}), which each run replaces whole: put "
                              "the checkpoints beside it, e.g. in a sibling folder")

    def _check_task_metrics(self) -> None:
        """Early stopping and tuning name a metric this task's evaluation produces."""
        kind, known = self.task.kind, tasks.METRICS[self.task.kind]
        stop = self.train.early_stopping
        if stop is not None and stop.metric not in known:
            raise ConfigError("train.early_stopping.metric", stop.metric,
                              f"must be one of {', '.join(known)} (the {kind} task's metrics)")
        if self.tune.metric == "auto":
            self.tune.metric = f"validation_{tasks.DEFAULT_METRIC[kind]}"
        if self.tune.metric not in tasks.validation_metrics(kind):
            raise ConfigError("tune.metric", self.tune.metric, f"must be one of "
                              f"{', '.join(tasks.validation_metrics(kind))} (the {kind} task's metrics)")

    def _resolve_best_metric(self) -> None:
        """Pick ``checkpoint.best_metric``/``best_mode`` when auto; refuse a metric this run never records."""
        ck, produced = self.checkpoint, checkpoint_metrics(self.train, self.task.kind)
        if ck.best_metric == "auto":
            ck.best_metric = (f"validation_{tasks.DEFAULT_METRIC[self.task.kind]}" if self.train.validates_each_epoch
                              else "train_loss")
        if ck.best_mode == "auto":
            ck.best_mode = tasks.direction(ck.best_metric)
        if ck.enabled and ck.keep_best > 0 and ck.best_metric not in produced:
            how = ("record validation metrics with train.validate_every_epoch: true (or train.early_stopping), "
                   if not self.train.validates_each_epoch else "")
            raise ConfigError("checkpoint.best_metric", ck.best_metric,
                              f"is never recorded by this run, so keep_best {ck.keep_best} would keep nothing: "
                              f"{how}use one of {', '.join(sorted(produced))}, or set checkpoint.keep_best: 0")

    def _check_hashed_columns(self) -> None:
        """Every column of ``etl.categorical_hash_buckets`` must be one of ``source.categorical_columns``."""
        stray = sorted(set(self.etl.categorical_hash_buckets) - set(self.source.categorical_columns))
        if stray:
            raise ConfigError("etl.categorical_hash_buckets", stray,
                              "names columns that are not in source.categorical_columns "
                              f"({', '.join(self.source.categorical_columns) or 'none'}): add them there, "
                              "or drop them from etl.categorical_hash_buckets")

    # -- derived values -------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self, redacted: bool = False) -> str:
        """The config as YAML; ``redacted`` masks secrets (:func:`hvdtrain.core.secrets.redact`) for logs and artifacts."""
        data = self.to_dict()
        return yaml.safe_dump(secrets.redact(data) if redacted else data, sort_keys=False)

    def flat(self, redacted: bool = False) -> dict[str, Any]:
        """Dotted keys to leaf values (MLflow params); ``redacted`` masks secrets."""
        flat = _flatten(self.to_dict())
        return {k: secrets.redact(v, k) for k, v in flat.items()} if redacted else flat

    def section_hash(self, *sections: str) -> str:
        """A stable hash of some config sections (e.g. the ETL's inputs)."""
        data = {s: self.to_dict()[s] for s in sections}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


# -- loading ------------------------------------------------------------

HDFS_SCHEMES = ("hdfs", "webhdfs", "swebhdfs", "viewfs")  # one namespace, several ways to write its paths


def _place(uri: str) -> tuple[str, str]:
    """(the filesystem, the normalized path) a path or URI names, to compare folders (pure). The HDFS schemes
    count as one filesystem per NameNode host (``hdfs://nn:8020`` and ``webhdfs://nn:9870`` are one namespace;
    ``hdfs:///`` names the default one, whatever its host)."""
    if uri.startswith("file:"):
        uri = "/" + uri[len("file:"):].lstrip("/")
    if "://" not in uri:
        return "local", posixpath.normpath(uri)
    parsed = urllib.parse.urlparse(uri)
    where = f"hdfs:{parsed.hostname or ''}" if parsed.scheme in HDFS_SCHEMES else f"{parsed.scheme}:{parsed.netloc}"
    return where, posixpath.normpath(parsed.path or "/")


def is_within(path: str, folder: str) -> bool:
    """``path`` is ``folder`` or below it, on the same filesystem (pure; see :func:`_place`)."""
    (where, inner), (where_folder, outer) = _place(path), _place(folder)
    both_hdfs = where.startswith("hdfs:") and where_folder.startswith("hdfs:")
    if where != where_folder and not (both_hdfs and "hdfs:" in (where, where_folder)):  # hdfs:/// is any host's
        return False
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def path_fields(cls: Optional[type] = None, prefix: str = "") -> list[str]:
    """Dotted names of every field marked with :func:`path_field`, derived from the dataclasses."""
    cls = cls or JobConfig
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        dotted = f"{prefix}{f.name}"
        if f.metadata.get("path"):
            out.append(dotted)
        elif dataclasses.is_dataclass(hints[f.name]):
            out += path_fields(hints[f.name], dotted + ".")
    return out


def load(path: str | os.PathLike, overrides: list[str] | tuple[str, ...] = ()) -> JobConfig:
    """Load a YAML job config, apply ``key=value`` overrides, validate, resolve paths."""
    path = os.fspath(path)
    try:
        with open(path) as fh:
            data = yaml.safe_load(fh) or {}
    except FileNotFoundError:
        raise ConfigError("config", path, "file not found; pass a YAML file such as configs/demo.yaml") from None
    except yaml.YAMLError as exc:
        raise ConfigError("config", path, f"is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError("config", path, "must be a YAML mapping of sections (name, source, etl, train, ...)")
    for item in overrides:
        apply_override(data, item)
    return from_dict(data, base_dir=os.path.dirname(os.path.abspath(path)))


def from_dict(data: dict[str, Any], base_dir: str = ".") -> JobConfig:
    if isinstance(data.get("task"), str):  # ``task: binary`` is short for ``task: {kind: binary}``
        data = {**data, "task": {"kind": data["task"]}}
    cfg = _resolve_paths(_build(JobConfig, data, ""), base_dir)
    cfg.check_output_folders()
    return cfg


def apply_override(data: dict[str, Any], item: str) -> None:
    """Apply one ``a.b.c=value`` override; the value is parsed as YAML."""
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise ConfigError("override", item, "must look like section.key=value, e.g. train.epochs=2")
    parts = key.strip().split(".")
    node = data
    for part in parts[:-1]:
        nxt = node.setdefault(part, {})
        if nxt is None:
            nxt = node[part] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(key, item, f"cannot set a key inside {part!r}, which is not a section")
        node = nxt
    node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else None


def _build(cls: type, data: Any, prefix: str) -> Any:
    name = prefix or "config"
    if not isinstance(data, dict):
        raise ConfigError(name, data, "must be a mapping")
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            shown = redaction.MASK if redaction.looks_secret_key(dotted) else value  # a misspelt password's value
            raise ConfigError(dotted, shown, f"is not a known key; allowed: {', '.join(known)}{hint}")
        kwargs[key] = _coerce(hints[key], value, dotted)
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        raise exc.under(prefix) if prefix else exc from None


def _coerce(tp: Any, value: Any, dotted: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if any(typing.get_origin(a) is Literal and value in typing.get_args(a) for a in inner):
            return value  # a word the field takes besides its type (model.categorical_embed_dim: auto)
        inner = [a for a in inner if typing.get_origin(a) is not Literal] or inner
        if isinstance(value, dict):  # a field that takes a word or a mapping (task.class_weights)
            inner = [a for a in inner if typing.get_origin(a) is dict] or inner
        return _coerce(inner[0], value, dotted)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):  # a config block's class
        return _build(tp, value if value is not None else {}, dotted)
    if origin is Literal:
        if value not in args:
            raise ConfigError(dotted, value, f"must be one of {', '.join(map(str, args))}")
        return value
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(dotted, value, "must be a mapping")
        return {str(k): _coerce(args[1], v, f"{dotted}.{k}") for k, v in value.items()}
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(dotted, value, "must be a list")
        return [_coerce(args[0], v, f"{dotted}[{i}]") for i, v in enumerate(value)]
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(dotted, value, "must be true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(dotted, value, "must be an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(dotted, value, "must be a number")
        return float(value)
    if tp is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(dotted, value, "must be a string")
        return str(value)
    return value


def has_scheme(path: str) -> bool:
    return "://" in path or path.startswith("file:")


def _resolve_paths(cfg: JobConfig, base_dir: str) -> JobConfig:
    def expand(value: str) -> str:
        value = value.replace("{name}", cfg.name)
        if "{workdir}" in value:
            value = value.replace("{workdir}", cfg.workdir)
        if has_scheme(value) or os.path.isabs(value):
            return value
        return os.path.normpath(os.path.join(base_dir, value))

    def resolve(value: Optional[str]) -> Optional[str]:
        return None if value is None else expand(value)

    cfg.workdir = expand(cfg.workdir)  # first: the other paths expand {workdir}
    for dotted in path_fields():
        if dotted == "workdir":
            continue
        section, attr = dotted.split(".")
        block = getattr(cfg, section)
        setattr(block, attr, resolve(getattr(block, attr)))
    cfg.spark.app_name = cfg.spark.app_name.replace("{name}", cfg.name)
    cfg.tracking.experiment = cfg.tracking.experiment.replace("{name}", cfg.name)
    cfg.monitoring.job = cfg.monitoring.job.replace("{name}", cfg.name)
    cfg.tune.study = cfg.tune.study.replace("{name}", cfg.name)
    return cfg


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and value:
            out.update(_flatten(value, dotted))
        else:
            out[dotted] = value
    return out
