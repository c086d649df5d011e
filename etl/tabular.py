"""Tabular preprocessing: imputation, categorical indexing, standard scaling.

Statistics are fitted here on the training split only (Spark aggregates) and
stored in the manifest, so serving applies exactly what training saw. Applying
them is pure NumPy code in :mod:`hvdtrain.features` (shared with scoring),
re-exported here.

Features written: ``numeric`` float32 [len(numeric_columns)] and
``categorical`` int64 [len(categorical_columns)], where index 0 is the
unknown bucket (missing, unseen, or rarer than the top ``max_categories``);
a column in ``etl.categorical_hash_buckets`` holds 1 + its stable hash bucket.
"""
from __future__ import annotations

from typing import Any

from etl import drift, stats
from hvdtrain.config import JobConfig
from hvdtrain.features import HASH, cardinalities, feature_specs, fill_values, numeric_names, transform  # noqa: F401


def fit(train: Any, cfg: JobConfig) -> dict[str, Any]:
    """Statistics of the training rows (a Spark DataFrame with the source column names).

    Bounded aggregations only (:mod:`etl.stats`): one pass for the numeric summaries (mean, std, count and
    approximate median and deciles), one grouped count of every categorical column in long format of which
    only the top ``etl.max_categories`` values per column reach the driver, and one pass for the numeric
    drift bins. A column in ``etl.categorical_hash_buckets`` keeps no vocabulary (its top values serve the
    drift reference only).
    """
    src, etl = cfg.source, cfg.etl
    summary = stats.numeric_summary(train, src.numeric_columns, [0.5, *drift.DECILES])
    numeric = {c: {"mean": s["mean"], "std": s["std"], "median": (s["quantiles"] or [None])[0], "count": s["count"]}
               for c, s in summary.items()}
    edges = {c: sorted(set(s["quantiles"][1:])) for c, s in summary.items()}
    counted = stats.category_counts(train, src.categorical_columns, etl.max_categories)
    hashed = {c: n for c, n in etl.categorical_hash_buckets.items() if c in counted}
    if src.datetime_columns:  # their features summarized as numeric columns (no drift bins: not source columns)
        derived, names = stats.datetime_frame(train, src.datetime_columns, etl.datetime_parts)
        numeric.update({c: {"mean": s["mean"], "std": s["std"], "median": (s["quantiles"] or [None])[0],
                            "count": s["count"]} for c, s in stats.numeric_summary(derived, names, [0.5]).items()})
    return {"numeric_columns": list(src.numeric_columns), "categorical_columns": list(src.categorical_columns),
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
