"""Deterministic train/validation/test split by hashing the key column.

A row's split depends only on its key (CRC32 of the UTF-8 key, the same in
Spark and in Python's zlib), so it is stable across reruns, partition counts
and cluster sizes, and a row never moves between splits when data is added.
"""
from __future__ import annotations

import zlib
from typing import Any

from hvdtrain.config import SPLITS

BUCKETS = 10_000


def bucket_bounds(fractions: dict[str, float]) -> list[tuple[str, int, int]]:
    """(split, first bucket, end bucket) covering 0..BUCKETS in SPLITS order."""
    out, start = [], 0
    for i, name in enumerate(SPLITS):
        end = BUCKETS if i == len(SPLITS) - 1 else start + round(fractions[name] * BUCKETS)
        out.append((name, start, end))
        start = end
    return out


def split_of(key: str, fractions: dict[str, float]) -> str:
    """The split of one key (the reference the Spark expression must match)."""
    b = zlib.crc32(key.encode("utf-8")) % BUCKETS
    return next(name for name, lo, hi in bucket_bounds(fractions) if lo <= b < hi)


def add_split(df: Any, fractions: dict[str, float]) -> Any:
    from pyspark.sql import functions as F

    bucket = F.pmod(F.crc32(F.encode(F.col("key"), "UTF-8")), F.lit(BUCKETS))
    expr = None
    for name, lo, hi in bucket_bounds(fractions):
        cond = (bucket >= lo) & (bucket < hi)
        expr = F.when(cond, name) if expr is None else expr.when(cond, name)
    return df.withColumn("split", expr)


def count_by_split(df: Any) -> dict[str, int]:
    counts = {r["split"]: r["count"] for r in df.groupBy("split").count().collect()}
    return {s: counts.get(s, 0) for s in SPLITS}


def split_predicate(key_column: str, fractions: dict[str, float], split: str) -> str:
    """A Spark SQL predicate selecting one split's rows (the same bucket rule as :func:`add_split`)."""
    lo, hi = next((lo, hi) for name, lo, hi in bucket_bounds(fractions) if name == split)
    bucket = f"pmod(crc32(encode(CAST(`{key_column}` AS STRING), 'UTF-8')), {BUCKETS})"
    return f"({bucket} >= {lo} AND {bucket} < {hi})"
