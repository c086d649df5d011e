"""Drift statistics in Spark: counts of rows in the training reference's bins (math in hvdtrain.drift).

The ETL calls :func:`reference` on the training split (stored in the manifest);
scoring calls :func:`check` on the rows it is about to score. Both bin with
the same expressions, so the two distributions are comparable bin for bin.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from hvdtrain import drift as drift_lib
from hvdtrain.config import JobConfig
from hvdtrain.features import FeatureEncoder

DECILES = [i / 10 for i in range(1, 10)]


def _numeric_bucket(col: str, edges: Sequence[float]) -> Any:
    """Spark expression: the bin of hvdtrain.drift.numeric_bin (missing or non-numeric last)."""
    from pyspark.sql import functions as F

    x = F.col(f"`{col}`").cast("double")
    expr = F.when(x.isNull() | F.isnan(x), len(edges) + 1)
    for i, edge in enumerate(edges):
        expr = expr.when(x < F.lit(float(edge)), i)
    return expr.otherwise(len(edges))


def _category_bucket(col: str, known: Sequence[str]) -> Any:
    from pyspark.sql import functions as F

    x = F.col(f"`{col}`").cast("string")
    index = F.create_map(*[F.lit(v) for i, k in enumerate(known) for v in (k, i)]) if known else None
    expr = F.when(x.isNull(), len(known) + 1)
    if index is not None:
        expr = expr.when(index[x].isNotNull(), index[x])
    return expr.otherwise(len(known))


def bin_counts(df: Any, numeric: Mapping[str, Sequence[float]], categorical: Mapping[str, Sequence[str]]
               ) -> dict[str, dict[str, list[int]]]:
    """Rows per bin of every column, in one aggregation over ``df``."""
    from pyspark.sql import functions as F

    aggs: list[Any] = []
    names: list[tuple[str, str, int]] = []  # (kind, column, bins)
    groups: list[tuple[str, Mapping[str, Sequence[Any]], Callable[[str, Any], Any]]] = [
        ("numeric", numeric, _numeric_bucket), ("categorical", categorical, _category_bucket)]
    for kind, cols, bucket in groups:
        for col, spec in cols.items():
            b, width = bucket(col, spec), len(spec) + 2  # edges or known values, plus two bins
            for i in range(width):
                aggs.append(F.sum(F.when(b == i, 1).otherwise(0)).alias(f"b{len(names)}_{i}"))
            names.append((kind, col, width))
    out: dict[str, dict[str, list[int]]] = {"numeric": {}, "categorical": {}}
    if not aggs:
        return out
    row = df.agg(*aggs).first()
    for j, (kind, col, width) in enumerate(names):
        out[kind][col] = [int(row[f"b{j}_{i}"] or 0) for i in range(width)]
    return out


def reference(train: Any, numeric_columns: Sequence[str], categories: dict[str, list[str]]) -> dict[str, Any]:
    """The training split's distributions: decile bins of numeric columns, shares of categories."""
    from pyspark.sql import functions as F

    edges: dict[str, list[float]] = {}
    if numeric_columns:
        aggs = [F.expr(f"percentile_approx(CAST(`{c}` AS DOUBLE), array({', '.join(map(str, DECILES))}), 1000)")
                .alias(c) for c in numeric_columns]
        row = train.agg(*aggs).first()
        for c in numeric_columns:
            edges[c] = sorted({float(v) for v in (row[c] or [])})
    counts = bin_counts(train, edges, categories)
    return {"numeric": {c: {"edges": edges[c], "shares": drift_lib.shares(counts["numeric"][c])} for c in edges},
            "categorical": {c: {"bins": drift_lib.category_bins(categories[c]),
                                "shares": drift_lib.shares(counts["categorical"][c])} for c in categories}}


def text_counts(rows: Any, column: str, tokenizer_json: str) -> dict[str, int]:
    """[UNK] and real tokens of a text column, tokenized with the model's tokenizer in Spark tasks."""
    def count(batches):
        import pandas as pd

        enc = FeatureEncoder(tokenizer_json, None)
        for frame in batches:
            texts = frame[column].dropna().astype(str).tolist()
            ids = enc.encode(texts)
            unk, real = enc.unknown_tokens(ids["input_ids"], ids["attention_mask"]) if texts else (0, 0)
            yield pd.DataFrame({"unknown": [unk], "tokens": [real], "rows": [len(texts)]})

    row = rows.select(f"`{column}`").mapInPandas(count, "unknown long, tokens long, rows long") \
        .groupBy().sum().first()
    return {"unknown": int(row[0] or 0), "tokens": int(row[1] or 0), "rows": int(row[2] or 0)}


def check(rows: Any, bundle: Any, cfg: JobConfig) -> dict[str, Any]:
    """The drift report of the rows about to be scored, against the model's training reference."""
    tab = bundle.tabular or {}
    ref = dict(tab.get("reference") or {})
    sample = _sample(rows, cfg.score.drift_sample_rows)
    observed: dict[str, Any] = bin_counts(sample, {c: r["edges"] for c, r in ref.get("numeric", {}).items()},
                                          {c: r["bins"][:-2] for c, r in ref.get("categorical", {}).items()})
    if bundle.text_column and bundle.tokenizer_json:
        observed["text"] = text_counts(sample, bundle.text_column, bundle.tokenizer_json)
        ref["text"] = {"column": bundle.text_column,
                       "unknown_token_rate": bundle.preprocessing.get("text", {}).get("unknown_token_rate", 0.0)}
    out = drift_lib.report(ref, observed, cfg.score.psi_threshold, cfg.score.unknown_token_threshold)
    if tab and not tab.get("reference"):
        out["notes"] = ["the model's manifest has no tabular reference distributions (ETL older than scoring): "
                        "numeric and categorical drift not checked; rerun the ETL and retrain to enable it"]
    return out


def _sample(rows: Any, limit: int) -> Any:
    """At most ``limit`` rows spread over the whole input (0: all rows)."""
    if limit <= 0:
        return rows
    total = rows.count()
    return rows if total <= limit else rows.sample(fraction=min(1.0, 1.2 * limit / total), seed=17).limit(limit)
