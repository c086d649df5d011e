"""Where rows come from: a Hive table or files, normalized to (key, text, label) strings."""
from __future__ import annotations

from typing import Any

from etl import labels, sample
from etl.validate import CORRUPT, extra_columns
from etl.writer import INTERNAL
from hvdtrain.core.config import HiveConfig, JobConfig, SourceConfig
from hvdtrain.core.errors import DataError
from hvdtrain.data.features import TEXT_SEP
from hvdtrain.hadoop import fs


def describe(src: SourceConfig) -> str:
    """How messages name the source: its Hive table, or its files' format and path."""
    return f"Hive table {src.table}" if src.table else f"{src.format} files at {src.path}"


def read(spark: Any, cfg: JobConfig) -> Any:
    """The source as a DataFrame: string columns key, text, label, plus the
    columns validation rules name (and ``_corrupt_record`` for malformed lines).

    Reads cfg.source, cfg.validation (the columns its rules name), cfg.task (the label's type) and cfg.hive
    (where the metastore is, for the message when the table is missing).
    """
    from pyspark.sql import functions as F
    from pyspark.sql.utils import AnalysisException, ParseException

    src = cfg.source
    try:
        if src.table:
            if not spark.catalog.tableExists(src.table):
                raise DataError(f"source.table {src.table} does not exist in the Hive metastore "
                                f"({_metastore(cfg.hive)}); create it, fix the name, or run the demo's "
                                "--create-sample-table")
            df = spark.table(src.table)
        else:
            df = _read_files(spark, src)
        if src.filter:
            df = df.where(src.filter)
    except ParseException as exc:
        raise DataError(f"cannot read {describe(src)}: bad source.schema or source.filter: "
                        f"{str(exc).splitlines()[0]}") from None
    except AnalysisException as exc:
        raise DataError(f"cannot read {describe(src)}: {str(exc).splitlines()[0]}") from None
    wanted = {"key": src.key_column, "text": src.text_column, "label": src.label_column}
    extras = extra_columns(src, cfg.validation)
    missing = [f"source.{role}_column={col!r}" for role, col in wanted.items() if col and col not in df.columns]
    missing += [f"validation column {c!r}" for c in extras if c not in df.columns]
    if missing:
        raise DataError(f"{describe(src)} has no column {', '.join(missing)}; its columns are "
                        f"{', '.join(c for c in df.columns if c != CORRUPT)}: fix the column names in the config")
    # in any case: Spark resolves column names case-insensitively (spark.sql.caseSensitive is false by default)
    reserved = sorted({c for c in (*wanted.values(), *extras) if c and c.lower().startswith(INTERNAL)})
    if reserved:
        raise DataError(f"{describe(src)}: column {', '.join(map(repr, reserved))} starts with {INTERNAL!r} (in any "
                        "case), which the ETL keeps for the columns it adds: rename it (e.g. in a Hive view over the "
                        "table)")
    check_feature_types(df, src)
    missing = [f"source.text_columns {c!r}" for c in src.text_columns if c not in df.columns]
    if missing:
        raise DataError(f"{describe(src)} has no column {', '.join(missing)}; its columns are "
                        f"{', '.join(c for c in df.columns if c != CORRUPT)}: fix the column names in the config")
    cols = [(labels.source_column(df, col, cfg.task) if role == "label" and col else
             joined_text(src.text_columns) if role == "text" and len(src.text_columns) > 1 else
             (F.col(f"`{col}`") if col else F.lit(None)).cast("string")).alias(role) for role, col in wanted.items()]
    cols += [F.col(f"`{c}`") for c in extras]
    if CORRUPT in df.columns:
        cols.append(F.col(CORRUPT))
    return df.select(*cols)


def joined_text(columns: list[str]) -> Any:
    """Several text columns as one string column (NULL when all are NULL): validation checks their whole text,
    the vocabulary counts words in all of them, and the shard writer splits them again (:data:`TEXT_SEP`)."""
    from pyspark.sql import functions as F

    cells = [F.translate(F.coalesce(F.col(f"`{c}`").cast("string"), F.lit("")), TEXT_SEP, "") for c in columns]
    present = F.greatest(*[F.col(f"`{c}`").isNotNull() for c in columns])
    blank = F.least(*[F.trim(cell) == "" for cell in cells])  # text_empty then rejects it, as for one column
    return F.when(present, F.when(blank, F.lit("")).otherwise(F.concat_ws(TEXT_SEP, *cells)))


def check_feature_types(df: Any, src: SourceConfig) -> None:
    """Refuse, in one line, a numeric feature column of a type without a number (BINARY, ARRAY, MAP, DATE...)
    and a datetime feature column that is not a DATE or TIMESTAMP.

    BOOLEAN (0/1), the integers, FLOAT/DOUBLE and DECIMAL are numeric; so is STRING, which CSV files and many
    Hive tables hold numbers in: validation rejects each value that is not a number (``type:``, ``non_finite:``).
    """
    from pyspark.sql.types import BooleanType, DateType, NumericType, StringType, TimestampNTZType, TimestampType

    for c in src.numeric_columns:
        kind = df.schema[c].dataType
        if isinstance(kind, (NumericType, BooleanType, StringType)):
            continue
        also = "datetime_columns" if isinstance(kind, (DateType, TimestampType, TimestampNTZType)) \
            else "categorical_columns"
        raise DataError(f"source.numeric_columns names {c!r}, a {kind.simpleString().upper()} column of "
                        f"{describe(src)}, which holds no number: cast it in a view (CAST(`{c}` AS DOUBLE)) or "
                        f"move it to source.{also}")
    for c in src.datetime_columns:
        kind = df.schema[c].dataType
        if not isinstance(kind, (DateType, TimestampType, TimestampNTZType)):
            raise DataError(f"source.datetime_columns names {c!r}, a {kind.simpleString().upper()} column of "
                            f"{describe(src)}, not a DATE or TIMESTAMP: cast it in a view (CAST(`{c}` AS "
                            "TIMESTAMP), or to_date) or move it to source.numeric_columns or categorical_columns")


def _read_files(spark: Any, src: SourceConfig) -> Any:
    path = src.path  # set when source.table is not (SourceConfig checks)
    if path is None or not fs.exists(path):
        raise DataError(f"source.path {path} does not exist: fix source.path (a file or folder of "
                        f"{src.format} files) or point source.table at a Hive table")
    reader = spark.read.format(src.format)
    if src.format in ("csv", "json"):
        # Malformed lines are kept in _corrupt_record and quarantined, not dropped or fatal.
        reader = reader.option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", CORRUPT)
    if src.encoding:
        reader = reader.option("encoding", src.encoding)
        if src.format == "json":
            reader = reader.option("lineSep", "\n")  # Spark needs it for a non-UTF-8 JSON Lines file
    if src.format == "csv":
        reader = reader.option("header", "true").option("multiLine", "true").option("escape", '"')
    if src.schema:
        schema = src.schema
        if src.format in ("csv", "json"):
            schema += f", {CORRUPT} STRING"
        reader = reader.schema(schema)
    df = reader.load(fs.spark_path(path))
    if CORRUPT in df.columns:
        df = df.cache()  # Spark refuses queries on raw files that use only the corrupt-record column
    return df


def _metastore(hive: HiveConfig) -> str:
    return f"embedded, {hive.metastore_dir}" if hive.embedded else "from hive-site.xml"


def create_sample_table(spark: Any, cfg: JobConfig) -> int:
    """Write the configured synthetic rows into source.table (generated in Spark tasks).

    Reads cfg.source and cfg.task (the kind of labels to generate).
    """
    sample_cfg, task = cfg.source.sample, cfg.task.kind
    if sample_cfg is None or not cfg.source.table:
        raise DataError("--create-sample-table needs source.table and a source.sample block in the config")
    db = cfg.source.table.split(".")[0] if "." in cfg.source.table else "default"
    spark.sql(f"CREATE DATABASE IF NOT EXISTS {db}")
    parts = max(2, sample_cfg.rows // 50_000)
    bounds = [(i * sample_cfg.rows // parts, (i + 1) * sample_cfg.rows // parts) for i in range(parts)]
    rdd = spark.sparkContext.parallelize(bounds, parts).flatMap(lambda b: sample.generate(sample_cfg, b[0], b[1], task))
    df = spark.createDataFrame(rdd, "id string, text string, label string")  # given, not inferred by a job
    df.write.mode("overwrite").format("parquet").saveAsTable(cfg.source.table)
    return sample_cfg.rows
