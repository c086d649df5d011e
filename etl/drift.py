"""Drift statistics in Spark: counts of rows in the training reference's bins (math in hvdtrain.data.drift).

The ETL calls :func:`reference` on the training split (stored in the manifest);
scoring calls :func:`check` on the rows it is about to score. Both bin the
same way (decile edges; a category's own bin, "other", "missing"), so the two
distributions are comparable bin for bin. Every count is a grouped aggregation
in long format (:mod:`etl.stats`): the plan does not grow with the number of
categories, and only the bin counts reach the driver.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from etl import stats
from hvdtrain.core.config import ScoreConfig
from hvdtrain.data import drift as drift_lib
from hvdtrain.data.features import FeatureEncoder

DECILES = [i / 10 for i in range(1, 10)]


def bin_counts(df: Any, numeric: Mapping[str, Sequence[float]], categorical: Mapping[str, Sequence[str]]
               ) -> dict[str, dict[str, list[int]]]:
    """Rows per bin of every column: one grouped count per kind, in long format (:mod:`etl.stats`)."""
    out: dict[str, dict[str, list[int]]] = {"numeric": {}, "categorical": {}}
    if numeric:
        out["numeric"] = stats.gather_bins(stats.numeric_bin_frame(df, numeric), list(numeric),
                                           [len(e) + 2 for e in numeric.values()])
    if categorical:
        out["categorical"] = stats.gather_bins(stats.category_bin_frame(df, categorical), list(categorical),
                                               [len(k) + 2 for k in categorical.values()])
    return out


def reference(train: Any, edges: dict[str, list[float]], categories: dict[str, stats.CategoryCounts]
              ) -> dict[str, Any]:
    """The training split's distributions: decile bins of numeric columns, shares of the top categories.

    ``edges`` are the numeric columns' decile edges; ``categories`` the counted top values of each
    categorical column (the shares come from those counts, so only the numeric bins need a pass).
    """
    counts = bin_counts(train, edges, {})
    return {"numeric": {c: {"edges": edges[c], "shares": drift_lib.shares(counts["numeric"][c])} for c in edges},
            "categorical": {c: {"bins": drift_lib.category_bins(cc.values), "shares": drift_lib.shares(cc.bin_counts())}
                            for c, cc in categories.items()}}


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


def check(rows: Any, bundle: Any, score: ScoreConfig) -> dict[str, Any]:
    """The drift report of the rows about to be scored, against the model's training reference."""
    tab = bundle.tabular or {}
    ref = dict(tab.get("reference") or {})
    sample = _sample(rows, score.drift_sample_rows)
    observed: dict[str, Any] = bin_counts(sample, {c: r["edges"] for c, r in ref.get("numeric", {}).items()},
                                          {c: r["bins"][:-2] for c, r in ref.get("categorical", {}).items()})
    if bundle.text_column and bundle.tokenizer_json:
        observed["text"] = text_counts(sample, bundle.text_column, bundle.tokenizer_json)
        ref["text"] = {"column": bundle.text_column,
                       "unknown_token_rate": bundle.preprocessing.get("text", {}).get("unknown_token_rate", 0.0)}
    out = drift_lib.report(ref, observed, score.psi_threshold, score.unknown_token_threshold)
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
