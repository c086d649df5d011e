"""Row validation with quarantine: nothing is dropped silently.

Every row in is accounted for: ``rows_in = valid + rejected + duplicates``,
each term counted where it happens (``etl.accounting``). A rejected row is
kept with the first rule it broke and the offending value, a dropped
duplicate with the rule ``duplicate_key`` and its key;
rules come from the config's ``validation`` block plus the built-in checks on
the key, text and label columns.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, get_args

from etl import faults
from etl.accounting import RowCounts
from hvdtrain.core.config import Charset, SourceConfig, ValidationConfig
from hvdtrain.core.errors import DataError
from hvdtrain.hadoop import fs

CORRUPT = "_corrupt_record"
DUPLICATE = "duplicate_key"
# Rule prefix for a csv/json value holding U+FFFD: what Spark reads for bytes the file's charset does not decode.
UNDECODABLE = "undecodable"


@dataclass(frozen=True)
class Rule:
    name: str
    column: str  # whose value is shown in the rejects
    fails: Callable[..., Any]  # called with no arguments (its defaults bind loop values): builds a Column that is
    # true when a row breaks the rule


@dataclass
class Checked:
    """Validated rows, the quarantined ones, and the counts taken on the way (see etl.accounting)."""

    valid: Any  # DataFrame of (key, text, label, tabular feature columns), one row per key
    rejects: Any  # DataFrame of (key, text, label, rule, value): rule breaks and dropped duplicates
    counts: RowCounts
    cached: tuple = ()  # DataFrames kept in Spark's storage for the stages after validation (see release)

    def release(self) -> None:
        """Free what validation keeps in Spark's storage (once the shards and rejects are written)."""
        for df in self.cached:
            df.unpersist()

    @property
    def rows_in(self) -> int:
        return self.counts.rows_in

    @property
    def duplicates(self) -> int:
        return self.counts.duplicates

    @property
    def rejects_by_rule(self) -> dict[str, int]:
        return self.counts.by_rule

    @property
    def rejected_total(self) -> int:
        return self.counts.rejected_total

    @property
    def quarantined(self) -> int:
        """Rows in rejects/: rejected ones and dropped duplicates."""
        return self.rejected_total + self.duplicates

    def worst_rules(self, n: int = 3) -> str:
        top = sorted(self.rejects_by_rule.items(), key=lambda kv: -kv[1])[:n]
        return ", ".join(f"{rule} ({count:,})" for rule, count in top)


def role_of(src: SourceConfig) -> dict[str, str]:
    """Source column name -> the name it has after reading (key, text, label, or itself)."""
    roles = {src.key_column: "key", src.label_column: "label"}
    if src.text_column:
        roles[src.text_column] = "text"
    return roles


def feature_columns(src: SourceConfig) -> list[str]:
    """Tabular feature columns, quoted for Spark."""
    return [f"`{c}`" for c in (*src.numeric_columns, *src.categorical_columns, *src.datetime_columns)]


def extra_columns(src: SourceConfig, v: ValidationConfig) -> list[str]:
    """Columns the rules need beyond key, text and label (source names)."""
    named = [*v.required_columns, *v.not_null, *v.allowed_values, *v.ranges, *v.regex,
             *src.numeric_columns, *src.categorical_columns, *src.datetime_columns]
    named += weight_columns(src)
    roles = role_of(src)
    return sorted({c for c in named if c not in roles})


def weight_columns(src: SourceConfig) -> list[str]:
    """``[source.weight_column]``, or ``[]`` without sample weights (source names)."""
    return [src.weight_column] if src.weight_column else []


def rules(src: SourceConfig, v: ValidationConfig, has_corrupt: bool) -> list[Rule]:
    """Every rule, in the order they are checked (the first broken one is reported)."""
    from pyspark.sql import functions as F

    roles = role_of(src)

    def col(name: str) -> Any:
        return F.col(f"`{roles.get(name, name)}`")

    out: list[Rule] = []
    has_text = src.text_column is not None
    if src.path is not None and src.format in ("csv", "json"):
        read = ([CORRUPT] if has_corrupt else []) + ["key"] + (["text"] if has_text else []) + ["label"]
        for c in read + list(src.categorical_columns):
            out.append(Rule(f"{UNDECODABLE}:{'record' if c == CORRUPT else c}", c,
                            lambda c=c: undecodable(F.col(f"`{c}`").cast("string"))))
    if has_corrupt:
        out.append(Rule("malformed_record", CORRUPT, lambda: F.col(CORRUPT).isNotNull()))
    out.append(Rule("key_null", "key", lambda: F.col("key").isNull() | (F.trim("key") == "")))
    if has_text:
        out += [Rule("text_null", "text", lambda: F.col("text").isNull()),
                Rule("text_empty", "text", lambda: F.trim("text") == "")]
    out.append(Rule("label_null", "label", lambda: F.col("label").isNull() | (F.trim("label") == "")))
    out += weight_rules(src)
    if has_text and v.text_min_chars > 1:
        out.append(Rule("text_too_short", "text", lambda: F.char_length(F.trim("text")) < v.text_min_chars))
    max_chars = v.text_max_chars
    if has_text and max_chars is not None:
        out.append(Rule("text_too_long", "text", lambda: F.char_length("text") > max_chars))
    for c in src.numeric_columns:
        if c not in v.ranges:  # a range rule brings its own type and finiteness checks
            out.append(Rule(f"type:{c}", c, lambda c=c: F.col(f"`{c}`").isNotNull()
                            & F.expr(f"try_cast(`{c}` AS DOUBLE)").isNull()))
            out.append(non_finite(c, c))
    for c in v.not_null:
        out.append(Rule(f"not_null:{c}", roles.get(c, c), lambda c=c: col(c).isNull()))
    for c, allowed in v.allowed_values.items():
        out.append(Rule(f"allowed_values:{c}", roles.get(c, c),
                        lambda c=c, allowed=allowed: col(c).isNotNull() & ~col(c).cast("string").isin(allowed)))
    for c, rng in v.ranges.items():
        num = lambda c=c: F.expr(f"try_cast(`{roles.get(c, c)}` AS DOUBLE)")  # noqa: E731
        out.append(Rule(f"type:{c}", roles.get(c, c), lambda c=c, num=num: col(c).isNotNull() & num().isNull()))
        out.append(non_finite(c, roles.get(c, c)))  # NaN passes any range comparison
        lo = -float("inf") if rng.min is None else rng.min
        hi = float("inf") if rng.max is None else rng.max
        out.append(Rule(f"range:{c}", roles.get(c, c), lambda num=num, lo=lo, hi=hi: (num() < lo) | (num() > hi)))
    for c, pattern in v.regex.items():
        out.append(Rule(f"regex:{c}", roles.get(c, c),
                        lambda c=c, pattern=pattern: col(c).isNotNull() & ~col(c).cast("string").rlike(pattern)))
    return out


def weight_rules(src: SourceConfig) -> list[Rule]:
    """A sample weight multiplies the row's loss, so it must be a finite number >= 0: ``weight_null``,
    ``weight_not_a_number`` (not a number, NaN or infinite) and ``weight_negative``."""
    from pyspark.sql import functions as F

    column = src.weight_column
    if column is None:
        return []

    def number() -> Any:
        return F.expr(f"try_cast(`{column}` AS DOUBLE)")

    return [Rule("weight_null", column, lambda: F.col(f"`{column}`").isNull()),
            Rule("weight_not_a_number", column,
                 lambda: number().isNull() | F.isnan(number()) | (F.abs(number()) == F.lit(float("inf")))),
            Rule("weight_negative", column, lambda: number() < 0)]


def undecodable(value: Any) -> Any:
    """True for a string Spark read from bytes its charset does not decode: CSV holds them as U+FFFD, a JSON
    line that does not parse keeps its raw bytes (not valid UTF-8) in the corrupt-record column."""
    from pyspark.sql import functions as F

    return ~F.is_valid_utf8(value) | value.contains("\ufffd")


def non_finite(name: str, column: str) -> Rule:
    """``non_finite:<name>``: a numeric value that is NaN or infinite ("NaN", "Infinity", "-inf" as text, or
    such a double), which would train as garbage (and NaN would pass every range rule)."""
    from pyspark.sql import functions as F

    def fails() -> Any:
        x = F.expr(f"try_cast(`{column}` AS DOUBLE)")
        return x.isNotNull() & (F.isnan(x) | (F.abs(x) == F.lit(float("inf"))))

    return Rule(f"non_finite:{name}", column, fails)


def first_failed(rule_list: list[Rule]) -> tuple[Any, Any]:
    """Columns naming the first rule a row breaks and its value (NULL when it passes)."""
    from pyspark.sql import functions as F

    name = value = None
    for r in rule_list:
        cond = F.coalesce(r.fails(), F.lit(False))
        val = F.col(f"`{r.column}`").cast("string")
        name = F.when(cond, F.lit(r.name)) if name is None else name.when(cond, F.lit(r.name))
        value = F.when(cond, val) if value is None else value.when(cond, val)
    return name, value


def run(raw: Any, src: SourceConfig, v: ValidationConfig, fault: Optional[faults.Fault] = None,
        cached: Optional[list] = None) -> Checked:
    """Tag each row with the first rule it breaks; split into valid, rejected and duplicate rows.

    What it keeps in Spark's storage is in the result's ``cached`` and, as it is made, appended to ``cached``
    (the caller's list, so a failure halfway can free it too).
    """
    rule_list = rules(src, v, CORRUPT in raw.columns)
    name, value = first_failed(rule_list)
    tagged = raw.withColumn("rule", name).withColumn("value", value).cache()
    kept = cached if cached is not None else []
    kept.append(tagged)
    # One job counts the rows read and each rule's rejects (the passing rows under rule NULL), and fills the
    # cache the rest reads.
    by_rule = {r["rule"]: r["count"] for r in tagged.groupBy("rule").count().collect()}
    rows_in = sum(by_rule.values())
    rejects = tagged.where("rule IS NOT NULL").select("key", "text", "label", "rule", "value")
    passed = tagged.where("rule IS NULL").select("key", "text", "label", *feature_columns(src),
                                                 *[f"`{c}`" for c in weight_columns(src)])
    valid, duplicates, before, after, numbered = dedup(faults.drop_rows(passed, fault, "validate"),
                                                       v.unique_key, kept)
    counts = RowCounts(rows_in=rows_in, rejected={r.name: by_rule[r.name] for r in rule_list if by_rule.get(r.name)},
                       before_dedup=before, after_dedup=after)
    if duplicates is not None and counts.duplicates:
        rejects = rejects.unionByName(duplicates)
    return Checked(valid=valid, rejects=rejects, counts=counts,
                   cached=(tagged, *numbered))


def dedup(passed: Any, unique_key: bool, cached: Optional[list] = None) -> tuple[Any, Optional[Any], int, int, tuple]:
    """(one row per key, the dropped duplicates as rejects, rows before, rows after, what it keeps cached).

    One aggregation counts the rows of each key, shuffling the keys only, and gives both counts. Only when some
    key repeats are its rows (a join with the repeated keys) numbered by a window to keep one per key, so a
    table without duplicates, the usual case, never shuffles whole rows here.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if not unique_key:
        n = passed.count()
        return passed, None, n, n, ()
    from pyspark import StorageLevel

    per_key = passed.groupBy("key").agg(F.count(F.lit(1)).alias("_rows"))
    agg = per_key.agg(F.sum("_rows").alias("before"), F.count(F.lit(1)).alias("after")).first()
    before, after = int(agg["before"] or 0), int(agg["after"] or 0)
    if before == after:
        return passed, None, before, after, ()
    # Keep one row per repeated key, chosen by content so reruns keep the same one. The numbered rows are kept
    # (memory, then disk) so the shuffle that numbers them runs once: the kept rows and the dropped duplicates
    # read the same copy (Checked.release frees it). Keys compare null-safe, as groupBy groups them.
    repeated = per_key.where("_rows > 1").select(F.col("key").alias("_key"))
    same = F.col("key").eqNullSafe(F.col("_key"))
    w = Window.partitionBy("key").orderBy("text", "label")
    numbered = (passed.join(repeated, same, "left_semi").withColumn("_n", F.row_number().over(w))
                .persist(StorageLevel.MEMORY_AND_DISK))
    if cached is not None:
        cached.append(numbered)
    kept = passed.join(repeated, same, "left_anti").unionByName(numbered.where("_n = 1").drop("_n"))
    dropped = (numbered.where("_n > 1").select("key", "text", "label")
               .withColumn("rule", F.lit(DUPLICATE)).withColumn("value", F.col("key")))
    return kept, dropped, before, after, (numbered,)


def refuse_undecodable(checked: Checked, src: SourceConfig, source_name: str) -> None:
    """Files not in their declared character set are an error, not rejects: Spark reads the bytes it cannot
    decode as U+FFFD, so quarantining them would keep only the rows without accents (and train the rest's
    categories as mangled strings)."""
    from pyspark.sql import functions as F

    bad = {r.split(":", 1)[1]: n for r, n in checked.rejects_by_rule.items() if r.startswith(UNDECODABLE + ":")}
    if not bad:
        return
    first = checked.rejects.where(F.col("rule").startswith(UNDECODABLE + ":")).select("key", "value").first()
    enc = src.encoding or "utf-8"
    others = ", ".join(c for c in get_args(Charset) if c != enc)
    raise DataError(f"{source_name} is not {enc}: {sum(bad.values()):,} rows hold bytes that do not decode "
                    f"(columns {', '.join(sorted(bad))}; first: key {first['key']!r}, value {first['value'][:80]!r}). "
                    f"Nothing was published: set source.encoding to the files' character set ({others}), "
                    "or convert them to UTF-8 first, e.g. iconv -f cp1252 -t utf-8")


def enforce_limits(checked: Checked, valid_rows: int, src: SourceConfig, v: ValidationConfig,
                   source_name: str) -> None:
    """Abort before anything is published when too little survives validation."""
    if checked.rows_in == 0:
        raise DataError(f"{source_name} is empty" + (f" after source.filter={src.filter!r}" if src.filter else "")
                        + ": nothing to write. Check the table or path, and the filter")
    frac = checked.rejected_total / checked.rows_in if checked.rows_in else 0.0
    if v.fail_if_reject_fraction_over is not None and frac > v.fail_if_reject_fraction_over:
        raise DataError(f"{frac:.1%} of {checked.rows_in:,} rows were rejected, over "
                        f"validation.fail_if_reject_fraction_over={v.fail_if_reject_fraction_over}; worst rules: "
                        f"{checked.worst_rules()}. Nothing was published; fix the source or the rules")
    if valid_rows < v.min_rows:
        raise DataError(f"only {valid_rows:,} valid rows (validation.min_rows={v.min_rows}) of "
                        f"{checked.rows_in:,} read" + (f"; worst rules: {checked.worst_rules()}"
                                                       if checked.rejected_total else "")
                        + ". Nothing was published")


def write_rejects(checked: Checked, uri: str) -> None:
    """The quarantined rows, with rule and value, as Parquet (only when there are any), readable by their owner
    only: they hold raw row values (written inside the run's private staging folder, so never readable before)."""
    if checked.quarantined:
        checked.rejects.write.mode("overwrite").parquet(fs.spark_path(uri))
        fs.set_permission(uri, fs.PRIVATE_DIR)
