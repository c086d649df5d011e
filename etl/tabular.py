"""Tabular preprocessing: imputation, categorical indexing, standard scaling.

Statistics are fitted here on the training split only (Spark aggregates) and
stored in the manifest, so serving applies exactly what training saw. Applying
them is pure NumPy code in :mod:`hvdtrain.features` (shared with scoring),
re-exported here.

Features written: ``numeric`` float32 [len(numeric_columns)] and
``categorical`` int64 [len(categorical_columns)], where index 0 is the
unknown bucket (missing, unseen, or rarer than the top ``max_categories``).
"""
from __future__ import annotations

from typing import Any, Optional

from etl import drift
from hvdtrain.config import JobConfig
from hvdtrain.features import cardinalities, feature_specs, fill_values, transform  # noqa: F401


def fit(train: Any, cfg: JobConfig) -> dict[str, Any]:
    """Statistics of the training rows (a Spark DataFrame with the source column names)."""
    from pyspark.sql import functions as F

    src, etl = cfg.source, cfg.etl
    numeric: dict[str, dict[str, Optional[float]]] = {}  # None: no non-null value in the column
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
            "numeric": numeric, "categories": categorical,
            # the training distributions scoring's drift check compares its input with
            "reference": drift.reference(train, list(src.numeric_columns), categorical)}
