"""Tabular preprocessing: imputation, categorical indexing, standard scaling.

Statistics are fitted here on the training split only (Spark aggregates) and
stored in the manifest, so serving applies exactly what training saw. Applying
them is pure NumPy code in :mod:`hvdtrain.data.features` (shared with scoring),
re-exported here, but for categorical ids: the ETL makes them in Spark SQL
(:func:`category_ids`), held to scoring's :func:`~hvdtrain.data.features.category_ids_of`
by a test on the same values.

Features written: ``numeric`` float32 [len(numeric_columns)] and
``categorical`` int64 [len(categorical_columns)], where index 0 is the
unknown bucket (missing, unseen, or rarer than the top ``max_categories``);
a column in ``etl.categorical_hash_buckets`` holds 1 + its stable hash bucket.

``ple_edges`` (one list per slot of ``numeric``, in ``numeric_features`` order) holds the distinct
``etl.ple_bins`` quantile edges of each numeric feature (minimum and maximum included) on the values the model
sees: the raw quantiles of the training rows put through :func:`transform` itself, so an edge is exactly the
float32 value a raw value at that quantile becomes in the shards. ``model.numeric_embedding: ple`` encodes
over them (:mod:`hvdtrain.model.models`).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from etl import drift, stats
from hvdtrain.core.config import EtlConfig, SourceConfig
from hvdtrain.data.features import HASH, cardinalities, feature_specs, fill_values, numeric_names, transform  # noqa: F401


def fit(train: Any, src: SourceConfig, etl: EtlConfig) -> dict[str, Any]:
    """Statistics of the training rows (a Spark DataFrame with the source column names).

    Bounded aggregations only (:mod:`etl.stats`): one pass for the numeric summaries (mean, std, count and
    approximate median, deciles and the ``etl.ple_bins`` quantile edges), one grouped count of every categorical
    column in long format of which only the top ``etl.max_categories`` values per column reach the driver, and
    one pass for the numeric drift bins. A column in ``etl.categorical_hash_buckets`` keeps no vocabulary (its
    top values serve the drift reference only).
    """
    ple = ple_quantiles(etl.ple_bins)
    deciles = slice(1, 1 + len(drift.DECILES))
    summary = stats.numeric_summary(train, src.numeric_columns, [0.5, *drift.DECILES, *ple])
    numeric = {c: {"mean": s["mean"], "std": s["std"], "median": (s["quantiles"] or [None])[0], "count": s["count"]}
               for c, s in summary.items()}
    edges = {c: sorted(set(s["quantiles"][deciles])) for c, s in summary.items()}
    raw_ple = {c: s["quantiles"][deciles.stop:] for c, s in summary.items()}
    counted = stats.category_counts(train, src.categorical_columns, etl.max_categories)
    hashed = {c: n for c, n in etl.categorical_hash_buckets.items() if c in counted}
    if src.datetime_columns:  # their features summarized as numeric columns (no drift bins: not source columns)
        derived, names = stats.datetime_frame(train, src.datetime_columns, etl.datetime_parts)
        derived_summary = stats.numeric_summary(derived, names, [0.5, *ple])
        numeric.update({c: {"mean": s["mean"], "std": s["std"], "median": (s["quantiles"] or [None])[0],
                            "count": s["count"]} for c, s in derived_summary.items()})
        raw_ple.update({c: s["quantiles"][1:] for c, s in derived_summary.items()})
    out: dict[str, Any] = {
        "numeric_columns": list(src.numeric_columns), "categorical_columns": list(src.categorical_columns),
        "datetime": {"columns": list(src.datetime_columns), "parts": list(etl.datetime_parts),
                     "kinds": {c: stats.datetime_kind(train, c) for c in src.datetime_columns}},
        "numeric_features": numeric_names({"numeric_columns": src.numeric_columns,
                                           "datetime": {"columns": src.datetime_columns,
                                                        "parts": etl.datetime_parts}}),
        "impute": etl.impute, "impute_value": etl.impute_value, "scale": etl.scale,
        "numeric": numeric, "categories": {c: cc.values for c, cc in counted.items() if c not in hashed},
        "hash_buckets": hashed, "hash": HASH if hashed else None,
        "distinct_values": {c: cc.distinct for c, cc in counted.items()},
        # the training distributions scoring's drift check compares its input with
        "reference": drift.reference(train, edges, counted)}
    if out["numeric_features"]:
        out["ple_bins"] = etl.ple_bins
        out["ple_edges"] = ple_edges(out, [raw_ple[c] for c in out["numeric_features"]])
    return out


def ple_quantiles(bins: int) -> list[float]:
    """The quantiles whose values bound ``bins`` equal-frequency bins: 0, 1/bins, ..., 1 (pure)."""
    return [i / bins for i in range(bins + 1)]


def ple_edges(tab: dict[str, Any], raw: Sequence[Sequence[Optional[float]]]) -> list[list[float]]:
    """Per slot of ``numeric``, the sorted distinct bin edges on the scale the model sees (pure).

    ``raw`` holds each slot's quantiles in the training rows' units (empty when the column had no value). They go
    through :func:`transform`, the code the shard writer runs, with the slots as plain numeric columns (a datetime
    column's features are already derived), so the imputation of a missing quantile and the scaling are the
    shards' own.
    """
    names = tab["numeric_features"]
    depth = max((len(q) for q in raw), default=0) or 1
    grid = np.full((depth, len(names)), np.nan)  # [quantile, slot]; NaN: imputed like a missing value
    for j, q in enumerate(raw):
        grid[:len(q), j] = [np.nan if v is None else v for v in q]
    view = {**tab, "numeric_columns": list(names), "datetime": {}, "categorical_columns": []}
    scaled, _ = transform(view, grid.tolist(), [])
    return [sorted({float(v) for v in scaled[:, j]}) for j in range(len(names))]


def category_ids(df: Any, stats: dict[str, Any], values: Sequence[str], names: Sequence[str]) -> Any:
    """``df`` with column ``names[j]``: the int64 id of categorical column ``j`` (long), from its values as
    strings in column ``values[j]`` (:func:`etl.stats.category_value`), computed in Spark SQL.

    The same ids as :func:`hvdtrain.data.features.category_ids_of`, the code scoring runs: a hashed column's is
    ``pmod(xxhash64(value), buckets) + 1`` (the scheme :data:`~hvdtrain.data.features.HASH`); a vocabulary
    column's is 1 + the value's index in its fitted vocabulary, found by a broadcast join with the vocabulary
    as a small DataFrame (so the plan does not grow with the categories); 0 for a missing, unseen or rare value.
    """
    from pyspark.sql import functions as F

    columns = stats["categorical_columns"]
    buckets = stats.get("hash_buckets") or {}
    if buckets and stats.get("hash") != HASH:
        raise ValueError(f"statistics hashed with {stats.get('hash')!r}; the ETL buckets with {HASH!r}")
    vocab = [(j, c) for j, c in enumerate(columns) if c not in buckets]
    index = df.sparkSession.createDataFrame(
        [(j, v, i + 1) for j, c in vocab for i, v in enumerate(stats["categories"][c])], "c int, v string, id long")
    zero = F.lit(0).cast("long")
    for j, c in enumerate(columns):
        value = F.col(values[j])
        if c in buckets:
            df = df.withColumn(names[j], F.when(value.isNull(), zero)
                               .otherwise(F.pmod(F.xxhash64(value), F.lit(buckets[c]).cast("long")) + 1))
            continue
        v, i = f"{names[j]}_v", f"{names[j]}_i"
        lookup = F.broadcast(index.where(F.col("c") == j).select(F.col("v").alias(v), F.col("id").alias(i)))
        df = df.join(lookup, value == F.col(v), "left").withColumn(names[j], F.coalesce(F.col(i), zero)).drop(v, i)
    return df
