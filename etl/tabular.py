"""Tabular preprocessing: imputation, categorical indexing, standard scaling.

Statistics are fitted on the training split only (Spark aggregates) and stored
in the manifest, so serving applies exactly what training saw. Applying them
is a pure NumPy function, run in the Spark tasks that write shards.

Features written: ``numeric`` float32 [len(numeric_columns)] and
``categorical`` int64 [len(categorical_columns)], where index 0 is the
unknown bucket (missing, unseen, or rarer than the top ``max_categories``).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from hvdtrain.config import JobConfig


def fit(train: Any, cfg: JobConfig) -> dict[str, Any]:
    """Statistics of the training rows (a Spark DataFrame with the source column names)."""
    from pyspark.sql import functions as F

    src, etl = cfg.source, cfg.etl
    numeric: dict[str, dict[str, float]] = {}
    if src.numeric_columns:
        aggs = []
        for c in src.numeric_columns:
            x = F.col(f"`{c}`").cast("double")
            aggs += [F.avg(x).alias(f"{c}__mean"), F.stddev_pop(x).alias(f"{c}__std"),
                     F.expr(f"percentile(CAST(`{c}` AS DOUBLE), 0.5)").alias(f"{c}__median"),
                     F.count(x).alias(f"{c}__count")]
        row = train.agg(*aggs).first().asDict()
        for c in src.numeric_columns:
            numeric[c] = {k: (float(row[f"{c}__{k}"]) if row[f"{c}__{k}"] is not None else None)
                          for k in ("mean", "std", "median", "count")}
    categorical: dict[str, list[str]] = {}
    for c in src.categorical_columns:
        counts = (train.where(F.col(f"`{c}`").isNotNull())
                  .groupBy(F.col(f"`{c}`").cast("string").alias("v")).count()
                  .orderBy(F.desc("count"), F.asc("v")).limit(etl.max_categories).collect())
        categorical[c] = [r["v"] for r in counts]
    return {"numeric_columns": list(src.numeric_columns), "categorical_columns": list(src.categorical_columns),
            "impute": etl.impute, "impute_value": etl.impute_value, "scale": etl.scale,
            "numeric": numeric, "categories": categorical}


def fill_values(stats: dict[str, Any]) -> list[float]:
    """The value that replaces a missing entry, per numeric column."""
    out = []
    for c in stats["numeric_columns"]:
        s = stats["numeric"][c]
        if stats["impute"] == "constant" or s["count"] == 0:
            out.append(stats["impute_value"])
        else:
            out.append(s["mean"] if stats["impute"] == "mean" else s["median"])
    return out


def transform(stats: dict[str, Any], numeric: Sequence[Sequence[Optional[float]]],
              categorical: Sequence[Sequence[Optional[str]]]) -> tuple[np.ndarray, np.ndarray]:
    """Apply fitted statistics to rows: (numeric float32 [n, k], categorical int64 [n, m])."""
    n = len(numeric) if stats["numeric_columns"] else len(categorical)
    cols = stats["numeric_columns"]
    x = np.array([[np.nan if v is None else float(v) for v in row] for row in numeric],
                 dtype=np.float64).reshape(n, len(cols))
    fills = np.array(fill_values(stats), dtype=np.float64)
    x = np.where(np.isnan(x), fills[None, :], x)
    if stats["scale"] and cols:
        mean = np.array([stats["numeric"][c]["mean"] or 0.0 for c in cols])
        std = np.array([stats["numeric"][c]["std"] or 0.0 for c in cols])
        x = (x - mean) / np.where(std > 0, std, 1.0)
    lookups = [{v: i + 1 for i, v in enumerate(stats["categories"][c])} for c in stats["categorical_columns"]]
    cat = np.array([[lookups[j].get(None if v is None else str(v), 0) for j, v in enumerate(row)]
                    for row in categorical], dtype=np.int64).reshape(n, len(lookups))
    return x.astype(np.float32), cat


def feature_specs(stats: dict[str, Any]) -> dict[str, tuple[str, list[int]]]:
    """Manifest feature entries (dtype, shape) for the tabular features."""
    out = {}
    if stats["numeric_columns"]:
        out["numeric"] = ("float32", [len(stats["numeric_columns"])])
    if stats["categorical_columns"]:
        out["categorical"] = ("int64", [len(stats["categorical_columns"])])
    return out


def cardinalities(stats: dict[str, Any]) -> list[int]:
    """Embedding sizes the model needs: known categories + the unknown bucket."""
    return [len(stats["categories"][c]) + 1 for c in stats["categorical_columns"]]
