"""Deterministic train/validation/test split by hashing the key column.

A row's split depends only on its key (CRC32 of the UTF-8 key, the same in
Spark and in Python's zlib), so it is stable across reruns, partition counts
and cluster sizes, and a row never moves between splits when data is added.
"""
from __future__ import annotations

import zlib
from typing import Any

from hvdtrain.core.config import SPLITS

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


# -- the order of rows inside a shard ----------------------------------------------------------------
# Rows are written in the order of a seeded hash of their key, never by the key itself: on a table whose key
# follows time or the target (auto-increment IDs, timestamps, sorted exports), key order puts near-identical rows
# side by side, and every training batch drawn from a window of them is a biased sample. The hash is SHA-256 of
# "<seed>:<key>" (the first 16 hex digits; the key breaks ties), the same in Spark SQL and in Python's hashlib, so a
# shard's contents and order are identical on every rerun and input partitioning, and tests can recompute them.
ORDER_DIGITS = 16


def row_order(seed: int) -> str:
    """The manifest's ``row_order`` for datasets written in seeded-hash order (see :func:`order_of`)."""
    return f"hash:{seed}"


def order_of(key: str, seed: int) -> str:
    """A row's place inside its shard (the reference the Spark expression of :func:`add_order` must match)."""
    import hashlib

    return hashlib.sha256(f"{seed}:{key}".encode("utf-8")).hexdigest()[:ORDER_DIGITS]


def add_order(df: Any, seed: int, column: str = "order") -> Any:
    """``df`` with ``column``: :func:`order_of` of its ``key`` column, computed by Spark SQL on the JVM."""
    from pyspark.sql import functions as F

    salted = F.concat(F.lit(f"{seed}:"), F.col("key"))
    return df.withColumn(column, F.substring(F.sha2(F.encode(salted, "UTF-8"), 256), 1, ORDER_DIGITS))
