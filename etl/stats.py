"""Column statistics in Spark whose plans do not grow with the number of distinct values.

Every statistic the ETL fits (category vocabularies and counts, numeric summaries, drift bins) and the
drift check of scoring are computed here. Categorical columns are unpivoted to long format, one
``(c, v)`` row per cell (``c`` the column's index, ``v`` its value as a string, in the one form encoding
looks up: :func:`hvdtrain.data.features.category_string`), and counted with one
``groupBy``: a plan holds a few expressions per *column*, never one per category, and the count of
a value lives in a shuffle on the executors. Only bounded results reach the driver: the ``limit``
most frequent values of each column (ties by value) and per-column totals. Known categories that a
drift check bins by travel as a small DataFrame joined to the counts, not as literals in the plan.

A plan that grew with the categories is what made a 4,000-value column fail with
``java.lang.OutOfMemoryError: Java heap space`` (one aggregate per category, each holding a map of
all of them); ``tests/spark/test_etl_high_cardinality.py`` checks the plan sizes stay flat.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from hvdtrain.data.features import category_string, datetime_feature_names, datetime_values

QUANTILE_ACCURACY = 10_000  # percentile_approx: rank error at most 1/10,000 of the rows, bounded memory
OTHER_BIN, MISSING_BIN = -2, -1  # the last two drift bins (category_bins: ..., other, missing)


@dataclass(frozen=True)
class CategoryCounts:
    """The counted values of one categorical column (bounded: ``top`` holds at most ``limit`` values)."""

    top: list[tuple[str, int]]  # the most frequent values and their counts (count desc, then value asc)
    rows: int  # rows with a value
    missing: int  # rows without one (NULL)
    distinct: int  # distinct values

    @property
    def values(self) -> list[str]:
        return [v for v, _ in self.top]

    def bin_counts(self) -> list[int]:
        """Rows per drift bin of :func:`hvdtrain.data.drift.category_bins` over ``values``: each value, other, missing."""
        known = [n for _, n in self.top]
        return [*known, self.rows - sum(known), self.missing]


def _col(name: str) -> Any:
    from pyspark.sql import functions as F

    return F.col(f"`{name}`")


def long_format(df: Any, columns: Sequence[str], value: Callable[[str], Any]) -> Any:
    """``(c int, v)`` rows, one per cell of ``columns`` (``c``: index in ``columns``, ``v``: ``value(name)``)."""
    from pyspark.sql import functions as F

    cells = F.array(*[F.struct(F.lit(i).alias("c"), value(name).alias("v")) for i, name in enumerate(columns)])
    return df.select(F.explode(cells).alias("cell")).select("cell.c", "cell.v")


def category_value(df: Any, name: str) -> Any:
    """Column ``name`` of ``df`` as the strings encoding looks up (:func:`hvdtrain.data.features.category_string`).

    Spark's cast to string, except for FLOAT and DOUBLE: their digits come from the JVM's
    ``Double.toString`` (``1.0E10``, and before Java 19 not always the shortest: ``8.409999999999999E21``),
    which Python cannot reproduce, so those columns are made strings by ``category_string`` itself in a
    pandas UDF, over the exact double (a FLOAT widened, as Python receives it). NULL stays NULL.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, FloatType

    column = _col(name)
    if isinstance(df.schema[name].dataType, (FloatType, DoubleType)):
        return F.when(column.isNull(), F.lit(None).cast("string")).otherwise(_python_string(column.cast("double")))
    return column.cast("string")


def _python_string(column: Any) -> Any:
    """A double column through :func:`hvdtrain.data.features.category_string` (a pandas UDF: one Arrow batch a call)."""
    import pandas as pd
    from pyspark.sql.functions import pandas_udf

    def strings(values: Any) -> Any:
        return values.map(category_string)

    strings.__annotations__ = {"values": pd.Series, "return": pd.Series}  # Series to Series: a scalar pandas UDF
    return pandas_udf(strings, "string")(column)  # type: ignore[call-overload]  # hints set just above


def value_counts(df: Any, columns: Sequence[str]) -> Any:
    """``(c, v, n)``: rows per value of each column (:func:`category_value`), NULL (missing) as its own ``v``."""
    from pyspark.sql import functions as F

    cells = long_format(df, columns, lambda name: category_value(df, name))
    return cells.groupBy("c", "v").agg(F.count(F.lit(1)).alias("n"))


def top_frame(counts: Any, limit: int) -> Any:
    """``(c, v, n)``: the ``limit`` most frequent values of each column (ties by value), from :func:`value_counts`."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    rank = F.row_number().over(Window.partitionBy("c").orderBy(F.desc("n"), F.asc("v")))
    return counts.where(F.col("v").isNotNull()).withColumn("r", rank).where(F.col("r") <= limit).select("c", "v", "n")


def totals_frame(counts: Any) -> Any:
    """``(c, rows, missing, distinct)`` per column, from :func:`value_counts`."""
    from pyspark.sql import functions as F

    present = F.col("v").isNotNull()
    return counts.groupBy("c").agg(F.sum(F.when(present, F.col("n")).otherwise(0)).alias("rows"),
                                   F.sum(F.when(~present, F.col("n")).otherwise(0)).alias("missing"),
                                   F.count("v").alias("distinct"))


def category_counts(df: Any, columns: Sequence[str], limit: int) -> dict[str, CategoryCounts]:
    """The ``limit`` most frequent values of each column with their counts, and its totals (two small collects)."""
    from pyspark import StorageLevel

    if not columns:
        return {}
    counts = value_counts(df, columns).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        top: dict[int, list[tuple[str, int]]] = {i: [] for i in range(len(columns))}
        for r in top_frame(counts, limit).collect():
            top[r["c"]].append((r["v"], int(r["n"])))
        totals = {r["c"]: r for r in totals_frame(counts).collect()}
    finally:
        counts.unpersist()
    out: dict[str, CategoryCounts] = {}
    for i, name in enumerate(columns):
        t = totals.get(i)
        out[name] = CategoryCounts(sorted(top[i], key=lambda vn: (-vn[1], vn[0])), int(t["rows"]) if t else 0,
                                   int(t["missing"]) if t else 0, int(t["distinct"]) if t else 0)
    return out


def numeric_summary(df: Any, columns: Sequence[str], quantiles: Sequence[float]) -> dict[str, dict[str, Any]]:
    """Mean, population std, count of values and approximate ``quantiles`` of each column, in one aggregation."""
    from pyspark.sql import functions as F

    if not columns:
        return {}
    qs = ", ".join(repr(float(q)) for q in quantiles)
    aggs = []
    for i, name in enumerate(columns):
        x = _col(name).cast("double")
        aggs += [F.avg(x).alias(f"mean{i}"), F.stddev_pop(x).alias(f"std{i}"), F.count(x).alias(f"count{i}"),
                 F.expr(f"percentile_approx(CAST(`{name}` AS DOUBLE), array({qs}), {QUANTILE_ACCURACY})")
                 .alias(f"q{i}")]
    row = df.agg(*aggs).first()
    out: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(columns):
        out[name] = {k: (float(row[f"{k}{i}"]) if row[f"{k}{i}"] is not None else None)
                     for k in ("mean", "std", "count")}
        out[name]["quantiles"] = [float(v) for v in (row[f"q{i}"] or [])]
    return out


def datetime_kind(df: Any, name: str) -> str:
    """``date`` or ``timestamp``: how :func:`hvdtrain.data.features.datetime_values` reads the column's numbers."""
    from pyspark.sql.types import DateType

    return "date" if isinstance(df.schema[name].dataType, DateType) else "timestamp"


def epoch_value(df: Any, name: str) -> Any:
    """A DATE or TIMESTAMP column as the number :func:`hvdtrain.data.features.datetime_values` takes: ``unix_date``
    (days) or ``unix_micros`` (an instant, so no time zone enters; TIMESTAMP_NTZ is read in the session's,
    which hvdtrain sets to UTC). NULL stays NULL."""
    from pyspark.sql import functions as F

    if datetime_kind(df, name) == "date":
        return F.unix_date(_col(name))
    return F.unix_micros(_col(name).cast("timestamp"))


def datetime_frame(df: Any, columns: Sequence[str], parts: Sequence[str]) -> tuple[Any, list[str]]:
    """(a DataFrame of the numeric features ``columns`` become, their names), made by
    :func:`hvdtrain.data.features.datetime_values` in a pandas UDF: the code the shard writer and scoring run."""
    import pandas as pd

    kinds = {c: datetime_kind(df, c) for c in columns}
    names = [n for c in columns for n in datetime_feature_names(c, parts)]
    epochs = df.select(*[epoch_value(df, c).alias(f"e{i}") for i, c in enumerate(columns)])

    def derive(batches: Any) -> Any:
        for batch in batches:
            blocks = [datetime_values(batch[f"e{i}"].astype("float64").to_numpy(), kinds[c], parts)
                      for i, c in enumerate(columns)]
            yield pd.DataFrame(np.concatenate(blocks, axis=1), columns=[f"d{j}" for j in range(len(names))])

    frame = epochs.mapInPandas(derive, ", ".join(f"d{j} double" for j in range(len(names))))
    return frame.toDF(*names), names


def numeric_bucket(name: str, edges: Sequence[float]) -> Any:
    """Spark expression: the bin of :func:`hvdtrain.data.drift.numeric_bin` (missing or non-numeric last)."""
    from pyspark.sql import functions as F

    x = _col(name).cast("double")
    expr = F.when(x.isNull() | F.isnan(x), len(edges) + 1)
    for i, edge in enumerate(edges):
        expr = expr.when(x < F.lit(float(edge)), i)
    return expr.otherwise(len(edges))


def numeric_bin_frame(df: Any, edges: Mapping[str, Sequence[float]]) -> Any:
    """``(c, b, n)``: rows per decile bin ``b`` of each numeric column (a few expressions per column)."""
    from pyspark.sql import functions as F

    names = list(edges)
    cells = long_format(df, names, lambda name: numeric_bucket(name, edges[name]))
    return cells.groupBy("c", F.col("v").alias("b")).agg(F.count(F.lit(1)).alias("n"))


def category_bin_frame(df: Any, known: Mapping[str, Sequence[str]]) -> Any:
    """``(c, b, n)``: rows per drift bin of each categorical column: ``b`` is the value's position in ``known``,
    ``OTHER_BIN`` or ``MISSING_BIN``. The known values are a DataFrame joined to the counts, so the plan's
    size does not depend on how many there are."""
    from pyspark.sql import functions as F

    names = list(known)
    index = df.sparkSession.createDataFrame(
        [(i, v, b) for i, name in enumerate(names) for b, v in enumerate(known[name])], "c int, v string, kb int")
    counts = value_counts(df, names).join(F.broadcast(index), ["c", "v"], "left")
    b = F.when(F.col("v").isNull(), MISSING_BIN).otherwise(F.coalesce(F.col("kb"), F.lit(OTHER_BIN)))
    return counts.groupBy("c", b.alias("b")).agg(F.sum("n").alias("n"))


def gather_bins(frame: Any, names: Sequence[str], widths: Sequence[int]) -> dict[str, list[int]]:
    """Collect a ``(c, b, n)`` bin frame into one count list per column (negative bins count from the end)."""
    out = {name: [0] * width for name, width in zip(names, widths)}
    for r in frame.collect():
        name = names[r["c"]]
        out[name][r["b"]] += int(r["n"])  # OTHER_BIN, MISSING_BIN: negative, so the last two bins
    return out
