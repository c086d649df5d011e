"""Input drift against the training data: population stability index and unknown-token rate (pure).

The ETL stores reference distributions of the training split in the manifest
(``preprocessing.tabular.reference``: decile bins of each numeric column, the
share of each known category; see ``etl/tabular.py``), and scoring compares
the rows it is about to score with them (``etl/drift.py`` gathers the counts in
Spark). Text drift is the rate of ``[UNK]`` tokens among real tokens: a learned
vocabulary spells every training word, so its training rate is 0; a manifest
may record another (``preprocessing.text.unknown_token_rate``).

PSI = sum over bins of (actual - expected) * ln(actual / expected), shares
floored at ``EPS`` so an empty bin counts as rare rather than infinite. Usual
reading: < 0.1 stable, 0.1-0.25 moderate shift, > 0.25 large shift.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

EPS = 1e-4
MISSING, OTHER = "__missing__", "__other__"


def psi(expected: Sequence[float], actual: Sequence[float]) -> float:
    """Population stability index of two distributions over the same bins (shares, each summing to ~1)."""
    if len(expected) != len(actual):
        raise ValueError(f"PSI needs the same bins: {len(expected)} expected shares, {len(actual)} actual")
    total = 0.0
    for e, a in zip(expected, actual):
        e, a = max(e, EPS), max(a, EPS)
        total += (a - e) * math.log(a / e)
    return total


def shares(counts: Sequence[float]) -> list[float]:
    n = float(sum(counts))
    return [c / n for c in counts] if n > 0 else [0.0 for _ in counts]


def numeric_bin(value: Optional[float], edges: Sequence[float]) -> int:
    """Bin index of a value: 0..len(edges) by the edges (left-closed), len(edges)+1 for missing."""
    if value is None or math.isnan(value):
        return len(edges) + 1
    i = 0
    while i < len(edges) and value >= edges[i]:
        i += 1
    return i


def category_bins(known: Sequence[str]) -> list[str]:
    """The bins of a categorical column: its known categories, then everything else, then missing."""
    return [*known, OTHER, MISSING]


def report(reference: dict[str, Any], observed: dict[str, Any], psi_threshold: float,
           unknown_threshold: float) -> dict[str, Any]:
    """The drift report: per-column PSI and the text unknown-token rate, with alerts above thresholds.

    ``observed`` holds, per numeric/categorical column, counts in the reference's bins, and
    ``text`` {"unknown": n, "tokens": n}.
    """
    columns: dict[str, Any] = {}
    alerts: list[str] = []
    for kind in ("numeric", "categorical"):
        for col, ref in reference.get(kind, {}).items():
            counts = observed.get(kind, {}).get(col)
            if counts is None:
                continue
            value = psi(ref["shares"], shares(counts))
            columns[col] = {"kind": kind, "psi": round(value, 4), "expected": ref["shares"],
                            "actual": [round(s, 4) for s in shares(counts)]}
            if value > psi_threshold:
                alerts.append(f"{kind} column {col}: PSI {value:.3f} > {psi_threshold}")
    text = None
    if "text" in observed:
        tokens = observed["text"]["tokens"]
        rate = observed["text"]["unknown"] / tokens if tokens else 0.0
        base = float(reference.get("text", {}).get("unknown_token_rate", 0.0))
        text = {"column": reference.get("text", {}).get("column"), "unknown_token_rate": round(rate, 5),
                "training_rate": base, "tokens": tokens, "rows": observed["text"].get("rows")}
        if rate - base > unknown_threshold:
            alerts.append(f"text column {text['column']}: unknown-token rate {rate:.3f} vs {base:.3f} in training "
                          f"(threshold +{unknown_threshold})")
    return {"drifted": bool(alerts), "alerts": alerts, "columns": columns, "text": text,
            "thresholds": {"psi": psi_threshold, "unknown_token_rate": unknown_threshold},
            "rows": observed.get("rows")}
