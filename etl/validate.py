"""Row validation with quarantine: nothing is dropped silently.

Every row in is accounted for: ``rows_in = valid + rejected + duplicates``.
Rejected rows are kept with the rule they broke and the offending value.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hvdtrain.config import JobConfig

# (rule, column whose value is shown, condition that makes a row fail), checked in order.
RULES = [
    ("key_null", "key", "key IS NULL OR trim(key) = ''"),
    ("text_null", "text", "text IS NULL"),
    ("text_empty", "text", "trim(text) = ''"),
    ("label_null", "label", "label IS NULL OR trim(label) = ''"),
]


@dataclass
class Checked:
    valid: Any  # DataFrame of (key, text, label)
    rejects: Any  # DataFrame of (key, text, label, rule, value)
    rows_in: int
    duplicates: int
    rejects_by_rule: dict[str, int] = field(default_factory=dict)

    @property
    def rejected_total(self) -> int:
        return sum(self.rejects_by_rule.values())


def first_failed_rule() -> Any:
    """A column naming the first rule a row breaks (NULL when it passes)."""
    from pyspark.sql import functions as F

    expr = None
    for rule, _, cond in RULES:
        expr = F.when(F.expr(cond), F.lit(rule)) if expr is None else expr.when(F.expr(cond), F.lit(rule))
    return expr


def run(raw: Any, cfg: JobConfig) -> Checked:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    tagged = raw.withColumn("rule", first_failed_rule()).cache()
    value = F.coalesce(*[F.when(F.col("rule") == r, F.col(c)) for r, c, _ in RULES])
    rejects = tagged.where("rule IS NOT NULL").withColumn("value", value)
    passed = tagged.where("rule IS NULL").drop("rule")
    # Duplicate keys: keep one row per key, chosen by content so reruns keep the same one.
    w = Window.partitionBy("key").orderBy("text", "label")
    ranked = passed.withColumn("_n", F.row_number().over(w))
    valid = ranked.where("_n = 1").drop("_n")
    rows_in = tagged.count()
    by_rule = {r["rule"]: r["count"] for r in rejects.groupBy("rule").count().collect()}
    n_passed = rows_in - sum(by_rule.values())
    duplicates = n_passed - valid.count()
    return Checked(valid=valid, rejects=rejects, rows_in=rows_in, duplicates=duplicates,
                   rejects_by_rule={r: by_rule.get(r, 0) for r, _, _ in RULES if by_rule.get(r)})


def reject_unknown_labels(rows: Any, labels: list[str], checked: Checked) -> Any:
    """Quarantine validation/test rows whose label never occurs in train.

    The label list is learned from the training split only; a label the model
    can never predict would silently lower every metric. Updates ``checked``.
    """
    from pyspark.sql import functions as F

    known = F.col("label").isin(labels)
    unknown = rows.where(~known)
    n = unknown.count()
    if n:
        checked.rejects = checked.rejects.unionByName(
            unknown.drop("split").withColumn("rule", F.lit("label_unknown")).withColumn("value", F.col("label")))
        checked.rejects_by_rule["label_unknown"] = n
    return rows.where(known)


def write_rejects(checked: Checked, uri: str) -> None:
    """The quarantined rows, with rule and value, as Parquet (only when there are any)."""
    from etl.sources import spark_path

    if checked.rejected_total:
        checked.rejects.select("key", "text", "label", "rule", "value").write.mode("overwrite").parquet(spark_path(uri))
