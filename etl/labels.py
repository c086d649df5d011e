"""Labels per task (:mod:`hvdtrain.core.tasks`): check the label column fits ``task``, learn the label list,
quarantine rows the model cannot learn from, and encode each label the way the task's loss reads it.

==========  ===========================================  ==============================================
task        label list (learned on train)                value written (``label`` feature)
==========  ===========================================  ==============================================
multiclass  sorted distinct labels                       int64 class index
binary      exactly two labels: [negative, positive];    int64 0/1 (by default ``0``/``1``, ``false``/``true``,
            positive = ``task.positive_label``, or the   ``no``/``yes`` all put the positive second)
            second in sorted order
multilabel  sorted distinct labels of all rows' sets     float32 multi-hot; a set is an array column or
                                                          a string split on ``task.label_delimiter``
regression  none                                         float32 target
==========  ===========================================  ==============================================

A task the column contradicts (a binary task over five labels, a regression
over words, a classifier over what looks like a continuous target) fails
before anything is written, with one line naming the column, example values
and the fix. Only bounded results reach the driver.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np

from etl.accounting import LABEL_UNKNOWN
from hvdtrain.core.config import TaskConfig
from hvdtrain.core.errors import DataError

LABEL_NOT_A_NUMBER = "label_not_a_number"
MAX_CLASSES = 10_000  # more distinct labels than this is an ID or a continuous target, not classes
_EXAMPLES = 5


def source_column(df: Any, column: str, task: TaskConfig) -> Any:
    """The label column as a string: an array column (a multilabel set) joined with ``task.label_delimiter``."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType

    col = F.col(f"`{column}`")
    if isinstance(df.schema[column].dataType, ArrayType):
        if task.kind != "multilabel":
            kind = df.schema[column].dataType.simpleString()
            raise DataError(f"source.label_column {column!r} is an array column ({kind}), which only task: "
                            "multilabel reads; set task: multilabel, or point source.label_column at a "
                            "single-valued column")
        return F.concat_ws(task.label_delimiter, col.cast("array<string>"))
    return col.cast("string")


def _tokens(delimiter: str) -> Any:
    """The label set of a row: the label string split on the delimiter, trimmed, blanks dropped."""
    from pyspark.sql import functions as F

    return F.expr(f"filter(transform(split(label, '\\\\Q{delimiter}\\\\E'), x -> trim(x)), x -> x != '')")


def _number() -> Any:
    from pyspark.sql import functions as F

    return F.expr("try_cast(label AS DOUBLE)")


def _finite(value: Any) -> Any:
    from pyspark.sql import functions as F

    return value.isNotNull() & ~F.isnan(value) & (F.abs(value) != float("inf"))


def _examples(df: Any, predicate: Any) -> str:
    values = [r["label"] for r in df.where(predicate).select("label").distinct().limit(_EXAMPLES).collect()]
    return ", ".join(repr(v) for v in values)


def fit(rows: Any, task: TaskConfig, column: str) -> list[str]:
    """The task's label list from the training rows, after checking the label column (``column``, its
    source name, for messages) fits the task.

    Raises:
        DataError: the label column contradicts ``task`` (one line: the column, examples, the fix).
    """
    train = rows.where("split = 'train'")
    if task.kind == "regression":
        _check_numeric(train, column)
        return []
    if task.kind == "multilabel":
        from pyspark.sql import functions as F

        return _bounded_sorted(train.select(F.explode(_tokens(task.label_delimiter)).alias("label")), column,
                               task.kind)
    labels = _bounded_sorted(train.select("label"), column, task.kind)
    if task.kind == "binary" and len(labels) != 2:
        raise DataError(f"task: binary needs exactly 2 distinct labels in source.label_column {column!r}, but the "
                        f"training split has {len(labels)} ({', '.join(map(repr, labels[:_EXAMPLES]))}"
                        f"{', ...' if len(labels) > _EXAMPLES else ''}): set task: multiclass, or map the column "
                        "to two values")
    _check_not_continuous(train, labels, column, task.kind)
    return positive_last(labels, task.positive_label, column) if task.kind == "binary" else labels


def positive_last(labels: list[str], positive: Optional[str], column: str) -> list[str]:
    """A binary task's two labels as [negative, positive] (pure): ``positive`` second, or sorted when None.

    Raises:
        DataError: ``positive`` is not one of the two labels (one line naming the labels found).
    """
    if positive is None:
        return labels
    if positive not in labels:
        raise DataError(f"task.positive_label {positive!r} is not one of the 2 labels the training split has in "
                        f"source.label_column {column!r} ({labels[0]!r}, {labels[1]!r}): set task.positive_label "
                        "to one of them (quoted in YAML), or remove it to make the second in sorted order positive")
    return [next(v for v in labels if v != positive), positive]


def _bounded_sorted(labels: Any, column: str, kind: str) -> list[str]:
    """Sorted distinct values of a ``label`` column, refusing more than :data:`MAX_CLASSES` (bounded collect)."""
    values = [r["label"] for r in labels.distinct().limit(MAX_CLASSES + 1).collect()]
    if len(values) > MAX_CLASSES:
        raise DataError(f"task: {kind} found over {MAX_CLASSES:,} distinct labels in source.label_column "
                        f"{column!r} (e.g. {', '.join(map(repr, sorted(values)[:_EXAMPLES]))}): that is an ID or a "
                        "continuous target, not classes; set task: regression, or fix source.label_column")
    return sorted(values)


def _check_numeric(train: Any, column: str) -> None:
    """A regression needs numbers: a column without a single finite number is the wrong column or task."""
    from pyspark.sql import functions as F

    row = train.agg(F.count("label").alias("n"), F.count(F.when(_finite(_number()), 1)).alias("ok")).first()
    if row["n"] and not row["ok"]:
        raise DataError(f"task: regression needs numeric labels, but source.label_column {column!r} holds "
                        f"values such as {_examples(train, F.lit(True))} (none of {row['n']:,} training labels "
                        "is a finite number): set task: multiclass or binary, or point source.label_column at a "
                        "numeric column")


def _check_not_continuous(train: Any, labels: Sequence[str], column: str, kind: str) -> None:
    """Many distinct labels that are all numbers with fractions look like a regression target."""
    numbers = []
    for value in labels:
        try:
            numbers.append(float(value))
        except ValueError:
            return
    fractional = sum(1 for x in numbers if np.isfinite(x) and x != round(x))
    if len(numbers) > 50 and fractional > len(numbers) // 2:
        raise DataError(f"task: {kind} over source.label_column {column!r}, whose {len(numbers):,} distinct "
                        f"labels are numbers like {', '.join(labels[:_EXAMPLES])}: that is a continuous target; "
                        "set task: regression (or bucket the column into classes first)")


def reject_unlearnable(rows: Any, labels: list[str], task: TaskConfig, checked: Any) -> Any:
    """Quarantine rows whose label the model cannot learn from: a class or label never seen in train
    (rule ``label_unknown``), a regression target that is not a finite number (``label_not_a_number``)."""
    from pyspark.sql import functions as F

    if task.kind == "regression":
        bad, rule = ~_finite(_number()), LABEL_NOT_A_NUMBER
    elif task.kind == "multilabel":
        known = F.array(*[F.lit(v) for v in labels]) if labels else F.array().cast("array<string>")
        bad, rule = F.size(F.array_except(_tokens(task.label_delimiter), known)) > 0, LABEL_UNKNOWN
    else:
        bad, rule = ~F.col("label").isin(labels), LABEL_UNKNOWN
    rejected = rows.where(bad)
    n = rejected.count()
    if n:
        checked.rejects = checked.rejects.unionByName(
            rejected.select("key", "text", "label").withColumn("rule", F.lit(rule)).withColumn("value", F.col("label")))
    checked.counts.label_unknown, checked.counts.label_rule = n, rule
    return rows.where(~bad)


def target_stats(rows: Any) -> dict[str, Any]:
    """A regression target's statistics on the training split, for the transforms training applies to it
    (``task.target_transform``): count, mean, population standard deviation and minimum, and the mean and
    standard deviation of ``log1p`` (None when some target is <= -1). One Spark aggregation; Spark's moments are
    computed with a stable update (a target near 1e8 with spread 1 keeps its spread)."""
    from pyspark.sql import functions as F

    y = _number()
    row = rows.where("split = 'train'").where(_finite(y)).agg(
        F.count(y).alias("count"), F.avg(y).alias("mean"), F.stddev_pop(y).alias("std"), F.min(y).alias("min"),
        F.avg(F.log1p(y)).alias("log_mean"), F.stddev_pop(F.log1p(y)).alias("log_std")).first()
    out = {k: (float(row[k]) if row[k] is not None else None) for k in ("mean", "std", "min", "log_mean", "log_std")}
    out["count"] = int(row["count"])
    if out["min"] is None or out["min"] <= -1:
        out["log_mean"] = out["log_std"] = None
    return out


def encoder(task: TaskConfig, labels: Sequence[str]) -> Callable[[str], Any]:
    """label string -> the value written for it (pure; runs in the write tasks)."""
    index = {name: i for i, name in enumerate(labels)}
    if task.kind == "regression":
        return float
    if task.kind == "multilabel":
        delimiter, width = task.label_delimiter, len(labels)

        def multi_hot(value: str) -> list[float]:
            out = [0.0] * width
            for token in value.split(delimiter):
                if token.strip():
                    out[index[token.strip()]] = 1.0
            return out

        return multi_hot
    return index.__getitem__
