"""The batch scoring job: a trained model applied to the config's source, predictions into a Hive table.

Entry points, all running :func:`run`:

    spark-submit etl/score_job.py --config job.yaml --model MODEL --output-table db.predictions
    python -m etl.score_job --config configs/demo.yaml --model work/demo/runs/demo --output-table demo.preds
    hvdtrain score CONFIG --model MODEL --output-table db.predictions [--partition ds=...] [--master M]
    hvdtrain yarn score CONFIG --model MODEL --output-table db.predictions      # spark-submit --master yarn

Stages: resolve the model -> read and narrow the input -> check everything that
can be checked before any work (input columns against the model's manifest,
output schemas, an occupied partition) -> drift report -> score in a pandas
UDF (:mod:`hvdtrain.score`) and write once to a new run folder -> verify
``rows_in = scored + rejected`` against what was written -> publish: point the
partition of the predictions table and of the rejects table at the new run
folder (one metastore call each, so readers see the old or the new rows,
never a mix) and delete the replaced folder.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import sys
import time
import urllib.parse
import uuid
from dataclasses import dataclass
from typing import Any, Optional

if __package__ in (None, ""):  # `spark-submit etl/score_job.py`: make the repo importable
    import os

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from etl import drift as drift_mod
from etl import session, sources
from etl import split as split_mod
from hvdtrain import score as score_lib
from hvdtrain.core import config as config_mod
from hvdtrain.core import secrets
from hvdtrain.core.config import JobConfig, ScoreConfig, SourceConfig, parse_partition
from hvdtrain.core.errors import ANY_ERROR, DataError, HvdtrainError, StorageError
from hvdtrain.hadoop import fs, lease
from hvdtrain.observe import console

log = logging.getLogger("hvdtrain.score")
REPORT_NAME = "score_report.json"
DRIFT_NAME = "drift_report.json"


@dataclass(frozen=True)
class Target:
    """Where the job writes (pure plan, from config and flags)."""

    table: str
    rejects_table: str
    partition: dict[str, str]
    overwrite: bool

    def spec(self) -> str:
        return ", ".join(f"{k}='{v}'" for k, v in self.partition.items())

    def where(self) -> str:
        return " AND ".join(f"`{k}` = '{v}'" for k, v in self.partition.items())

    def folder(self) -> str:
        return "/".join(f"{k}={urllib.parse.quote(v, safe='')}" for k, v in self.partition.items())


def plan_target(score: ScoreConfig, output_table: Optional[str], partition: Optional[str], overwrite: bool,
                today: dt.date) -> Target:
    """The output tables and partition: flags win over the score block; default partition ds=<today>."""
    table = output_table or score.output_table
    if not table:
        raise DataError("no output table: pass --output-table db.predictions or set score.output_table")
    if not (all(p.isidentifier() for p in table.split(".")) and table.count(".") <= 1):
        raise DataError(f"--output-table {table!r} must be a Hive table name like db.predictions")
    spec = partition or score.partition or f"ds={today.isoformat()}"
    try:
        parts = parse_partition(spec)
    except ValueError as exc:
        raise DataError(f"--partition {spec!r} {exc}") from None
    return Target(table, score.rejects_table or f"{table}_rejects", parts, overwrite or score.overwrite)


def expected_columns(bundle: score_lib.ModelBundle, key: str, extra: list[tuple[str, str]],
                     rejects: bool) -> list[tuple[str, str]]:
    """A table's data columns (name, Spark type); the partition columns follow them (pure)."""
    if rejects:
        cols = [(key, "string"), *score_lib.REJECT_COLUMNS, *extra, *score_lib.PROVENANCE_COLUMNS]
    else:
        cols = [(key, "string"), *score_lib.PREDICTION_COLUMNS, *extra, *score_lib.PROVENANCE_COLUMNS]
    return cols


# -- reading -----------------------------------------------------------------------------------

def read_input(spark: Any, cfg: JobConfig, bundle: score_lib.ModelBundle, split: Optional[str] = None) -> Any:
    """The rows to score: source (+ source.filter, score.filter, a split), narrowed to the columns needed.

    Reads cfg.source, cfg.score (its filter and extra columns) and cfg.etl (the splits).
    """
    from pyspark.sql import functions as F
    from pyspark.sql.utils import AnalysisException, ParseException

    src = cfg.source
    try:
        if src.table:
            if not spark.catalog.tableExists(src.table):
                raise DataError(f"source.table {src.table} does not exist in the Hive metastore; "
                                "fix the name in the config (the rows to score)")
            df = spark.table(src.table)
        else:
            df = sources._read_files(spark, src)
        for predicate in (src.filter, cfg.score.filter):
            if predicate:
                df = df.where(predicate)
        if split:
            df = df.where(split_mod.split_predicate(src.key_column, cfg.etl.splits, split))
    except ParseException as exc:
        raise DataError(f"cannot read {sources.describe(src)}: bad source.filter or score.filter: "
                        f"{str(exc).splitlines()[0]}") from None
    except AnalysisException as exc:
        raise DataError(f"cannot read {sources.describe(src)}: {str(exc).splitlines()[0]}") from None
    needed = [src.key_column, *bundle.feature_columns()]
    missing = [c for c in needed if c not in df.columns]
    if missing:
        raise DataError(f"{sources.describe(src)} lacks column(s) {', '.join(missing)} that model {bundle.uri} "
                        f"reads (manifest digest {bundle.manifest_digest}: it was trained on "
                        f"{', '.join(bundle.feature_columns())}); its columns are {', '.join(df.columns)}: "
                        "score a table with the training columns, or retrain on this one")
    extra = [c for c in cfg.score.columns if c not in df.columns]
    if extra:
        raise DataError(f"score.columns names {', '.join(extra)}, not in {sources.describe(src)} "
                        f"({', '.join(df.columns)})")
    text = set(bundle.text_columns)
    cols = [F.col(f"`{src.key_column}`").cast("string").alias(src.key_column)]
    cols += [F.col(f"`{c}`").cast("string").alias(c) if c in text else F.col(f"`{c}`")
             for c in dict.fromkeys(bundle.feature_columns() + list(cfg.score.columns)) if c != src.key_column]
    return df.select(*cols)


# -- output tables -----------------------------------------------------------------------------

def table_columns(spark: Any, table: str) -> tuple[list[tuple[str, str]], list[str]]:
    """(data columns as (name, type), partition column names) of an existing table."""
    cols = spark.catalog.listColumns(table)
    data = [(c.name, _ddl_type(c.dataType)) for c in cols if not c.isPartition]
    return data, [c.name for c in cols if c.isPartition]


def _ddl_type(kind: str) -> str:
    return kind.replace(" ", "").lower()


def check_table(spark: Any, table: str, columns: list[tuple[str, str]], target: Target) -> bool:
    """Refuse an incompatible existing table or an occupied partition; True when the table exists."""
    if not spark.catalog.tableExists(table):
        return False
    data, parts = table_columns(spark, table)
    want = [(n, _ddl_type(t)) for n, t in columns]
    if data != want or parts != list(target.partition):
        show = lambda cols, ps: ", ".join(f"{n} {t}" for n, t in cols) + f" PARTITIONED BY ({', '.join(ps)})"  # noqa: E731
        raise DataError(f"output table {table} has columns {show(data, parts)}, but this job writes "
                        f"{show(want, list(target.partition))}: choose another --output-table, or drop the table")
    refuse_occupied(spark, table, target)
    return True


def refuse_occupied(spark: Any, table: str, target: Target) -> None:
    """Without ``--overwrite``, refuse a target partition of ``table`` that holds rows."""
    if not target.overwrite and spark.table(table).where(target.where()).limit(1).count() > 0:
        raise DataError(f"partition ({target.spec()}) of {table} already holds rows; pass --overwrite to replace "
                        "it (atomically), or choose another --partition")


def create_table(spark: Any, table: str, columns: list[tuple[str, str]], target: Target) -> None:
    db = table.split(".")[0] if "." in table else "default"
    spark.sql(f"CREATE DATABASE IF NOT EXISTS `{db}`")
    cols = ", ".join(f"`{n}` {t}" for n, t in columns) + "".join(f", `{p}` string" for p in target.partition)
    spark.sql(f"CREATE TABLE IF NOT EXISTS {table} ({cols}) USING parquet "
              f"PARTITIONED BY ({', '.join(f'`{p}`' for p in target.partition)})")


def table_location(spark: Any, table: str, partition: Optional[str] = None) -> str:
    sql = f"DESCRIBE FORMATTED {table}" + (f" PARTITION ({partition})" if partition else "")
    for row in spark.sql(sql).collect():
        if row[0].strip() == "Location":
            return row[1].strip()
    raise DataError(f"the metastore gives no location for {table}" + (f" ({partition})" if partition else ""))


def fs_uri(location: str) -> str:
    """A Spark/Hive location as an hvdtrain.hadoop.fs URI (``file:/x`` is local)."""
    return urllib.parse.urlparse(location).path if location.startswith("file:") else location


def partition_location(spark: Any, table: str, target: Target) -> Optional[str]:
    """Where the target partition of ``table`` points now (None: no such partition)."""
    exists = spark.sql(f"SHOW PARTITIONS {table} PARTITION ({target.spec()})").count() > 0
    return table_location(spark, table, target.spec()) if exists else None


def point_partition(spark: Any, table: str, target: Target, folder: Optional[str], exists: bool) -> None:
    """Point the partition at ``folder`` (one metastore call); ``folder=None`` drops it."""
    if folder is None:
        spark.sql(f"ALTER TABLE {table} DROP IF EXISTS PARTITION ({target.spec()})")
    elif exists:
        spark.sql(f"ALTER TABLE {table} PARTITION ({target.spec()}) SET LOCATION '{folder}'")
    else:
        spark.sql(f"ALTER TABLE {table} ADD PARTITION ({target.spec()}) LOCATION '{folder}'")
    spark.sql(f"REFRESH TABLE {table}")


class PublishRolledBackFailed(StorageError):
    """Publishing failed and a partition could not be put back: the new run folder is kept (readers may use it)."""


def publish_partitions(spark: Any, target: Target, run_dir: str) -> list[Optional[str]]:
    """Point both tables' partitions at the new run; returns the replaced locations.

    When a later step fails, the partitions already switched are pointed back
    at their old folders first, so the old rows stay readable until the new ones
    are complete in both tables.
    """
    switched: list[tuple[str, Optional[str]]] = []
    try:
        for table, outcome in ((target.table, "scored"), (target.rejects_table, "rejected")):
            folder = f"{run_dir}/outcome={outcome}"
            fs.makedirs(fs_uri(folder))  # an empty outcome (no rejects) is an empty partition
            old = partition_location(spark, table, target)
            switched.append((table, old))
            point_partition(spark, table, target, folder, old is not None)
    except BaseException as exc:
        _restore(spark, target, switched, run_dir, exc)
        raise
    return [old for _, old in switched]


def _restore(spark: Any, target: Target, switched: list[tuple[str, Optional[str]]], run_dir: str,
             cause: BaseException) -> None:
    for table, old in reversed(switched):
        try:
            point_partition(spark, table, target, old, exists=True)
        except ANY_ERROR as exc:  # reported below with the run folder kept
            raise PublishRolledBackFailed(
                f"publishing partition ({target.spec()}) failed ({type(cause).__name__}: {cause}) and putting "
                f"{table} back at {old} failed too ({type(exc).__name__}: {exc}); {run_dir} is kept: point the "
                "partition at it or at the old folder by hand") from cause


def replaced_run_folder(old: Optional[str], table_root: str, part_folder: str) -> Optional[str]:
    """The earlier run folder hvdtrain wrote that ``old`` lies in, or None when hvdtrain did not create it (pure).

    Only ``<table_root>/<part_folder>/run-<id>[/outcome=<o>]`` qualifies: a partition pointed elsewhere
    (by hand, or by another tool) is never deleted.
    """
    if not old:
        return None
    base = f"{fs_uri(table_root).rstrip('/')}/{part_folder}/"
    uri = fs_uri(old).rstrip("/")
    if not uri.startswith(base):
        return None
    parts = uri[len(base):].split("/")
    if not (parts[0].startswith("run-") and ".." not in parts and (len(parts) == 1 or
            (len(parts) == 2 and parts[1].startswith("outcome=")))):
        return None
    return base + parts[0]


def drop_replaced(old: Optional[str], new_run: str, table_root: str, part_folder: str) -> None:
    """Delete a replaced partition's earlier run folder, only when hvdtrain created it under the table."""
    folder = replaced_run_folder(old, table_root, part_folder)
    if folder is None:
        if old:
            log.warning("the replaced partition folder %s was not created by hvdtrain under the table; it is kept",
                        old)
        return
    if folder == fs_uri(new_run).rstrip("/"):
        return
    try:
        if fs.exists(folder):
            fs.remove_published(folder)  # the replaced rows: to the HDFS trash when the cluster has one
    except ANY_ERROR as exc:  # the new rows are published; a leftover folder only wastes space
        log.warning("could not delete the replaced partition folder %s: %s", old, exc)


def check_volume(counts: dict[str, Any], min_rows: int, max_reject_fraction: float, target: Target) -> None:
    """Refuse to publish an empty or mostly rejected outcome over a partition (pure)."""
    rows_in, scored, rejected = counts["rows_in"], counts["scored"], counts["rejected"]
    if scored < min_rows:
        raise DataError(f"only {scored} rows scored (rows_in {rows_in}, rejected {rejected}), fewer than "
                        f"score.min_rows={min_rows}: nothing was published to partition ({target.spec()}); check "
                        "the input (source, source.filter, score.filter) or lower score.min_rows")
    if rows_in and rejected / rows_in > max_reject_fraction:
        raise DataError(f"{rejected} of {rows_in} rows rejected ({rejected / rows_in:.1%}), more than "
                        f"score.max_reject_fraction={max_reject_fraction}: nothing was published to partition "
                        f"({target.spec()}); see the reasons {counts.get('rejects_by_reason')} or raise "
                        "score.max_reject_fraction")


# -- the job -----------------------------------------------------------------------------------

def run(spark: Any, cfg: JobConfig, model: str, target: Target, split: Optional[str] = None,
        evaluate: bool = False) -> dict[str, Any]:
    """Score ``cfg.source`` with ``model`` into ``target``; returns the report (also score_report.json)."""
    from pyspark.sql import functions as F

    started = time.perf_counter()
    bundle = score_lib.load_bundle(model, cfg.tracking, cfg.workdir)
    if bundle.labels_doc.get("model_builder"):
        session.ship_model_code(spark, cfg.model.code)
    rows = read_input(spark, cfg, bundle, split)
    types = {f.name: f.dataType.simpleString() for f in rows.schema.fields}
    extra = [(c, types[c]) for c in cfg.score.columns]
    key = cfg.source.key_column
    pred_cols = expected_columns(bundle, key, extra, rejects=False)
    rej_cols = expected_columns(bundle, key, extra, rejects=True)
    clash = sorted(set(target.partition) & {n for n, _ in pred_cols + rej_cols})
    if clash:
        raise DataError(f"--partition column(s) {', '.join(clash)} clash with output columns; rename the partition")
    exists = [check_table(spark, target.table, pred_cols, target),
              check_table(spark, target.rejects_table, rej_cols, target)]
    drift = drift_mod.check(rows, bundle, cfg.score)
    _write_json(fs.join(cfg.score.report_dir, DRIFT_NAME), drift)
    if drift["drifted"]:
        message = "input drift: " + "; ".join(drift["alerts"])
        if cfg.score.fail_on_drift:
            raise DataError(f"{message} (score.fail_on_drift is true: nothing was scored; see "
                            f"{fs.join(cfg.score.report_dir, DRIFT_NAME)})")
        log.warning("%s (see %s)", message, fs.join(cfg.score.report_dir, DRIFT_NAME))
    for table, cols, found in ((target.table, pred_cols, exists[0]), (target.rejects_table, rej_cols, exists[1])):
        if not found:
            create_table(spark, table, cols, target)
    table_root = table_location(spark, target.table)
    part_root = f"{table_root.rstrip('/')}/{target.folder()}"
    # One scoring job per partition, from its run folder's write to the old one's deletion (#54): two runs
    # publishing the same partition would each delete the folder the other just published.
    with lease.acquire(fs_uri(part_root), f"partition ({target.spec()}) of {target.table}") as held:
        if exists[0]:  # again, now that no other run can publish it: one may have, since the first check
            refuse_occupied(spark, target.table, target)
        run_dir = f"{part_root}/run-{_run_id()}"
        counters = score_lib.Counters(spark)
        if cfg.score.partitions:
            rows = rows.repartition(cfg.score.partitions)  # scoring costs far more per row than reading
        opts = score_lib.ScoreOptions(key, tuple(cfg.score.columns), cfg.score.predict_batch, cfg.score.arrow_batch,
                                      cfg.score.threads_per_task)
        scored = score_lib.score(spark, rows, bundle, opts, counters)
        outcome = F.when(F.col("reject_reason").isNull(), "scored").otherwise("rejected").alias("outcome")
        try:
            scored.select("*", outcome).write.partitionBy("outcome").mode("errorifexists").parquet(run_dir)
            counts = verify_counts(spark, run_dir, counters.values())
            check_volume(counts, cfg.score.min_rows, cfg.score.max_reject_fraction, target)
            held.check()  # still this run's: a broken lease means another run may be publishing the partition
            olds = publish_partitions(spark, target, run_dir)
        except PublishRolledBackFailed:
            raise  # a partition may point into run_dir: keep it
        except BaseException:
            _delete_quietly(run_dir)
            raise
        for old in olds:
            drop_replaced(old, run_dir, table_root, target.folder())
    report = {**counts, "model": {"uri": bundle.uri, "version": bundle.version, "digest": bundle.digest,
                                  "manifest_digest": bundle.manifest_digest},
              "source": cfg.source.table or cfg.source.path, "split": split, "output_table": target.table,
              "rejects_table": target.rejects_table, "partition": target.partition, "location": run_dir,
              "drift": {"drifted": drift["drifted"], "alerts": drift["alerts"]},
              "seconds": round(time.perf_counter() - started, 2)}
    if evaluate and cfg.source.label_column:
        report["evaluation"] = evaluate_partition(spark, cfg.source, target, split)
    _write_json(fs.join(cfg.score.report_dir, REPORT_NAME), report)
    return report


def verify_counts(spark: Any, run_dir: str, counted: dict[str, int]) -> dict[str, Any]:
    """rows_in = scored + rejected as counted in the tasks, and each term equal to the rows written."""
    from pyspark.sql.utils import AnalysisException

    try:
        written = {r["outcome"]: r["count"] for r in spark.read.parquet(run_dir).groupBy("outcome").count().collect()}
        reasons = {r["reject_reason"]: r["count"] for r in spark.read.parquet(run_dir)
                   .where("outcome = 'rejected'").groupBy("reject_reason").count().collect()}
    except AnalysisException:  # an empty input writes no file to infer a schema from
        written, reasons = {}, {}
    out = {"rows_in": counted["rows_in"], "scored": counted["scored"], "rejected": counted["rejected"],
           "rejects_by_reason": dict(sorted(reasons.items())), "model_loads": counted["model_loads"],
           "tasks": counted["tasks"], "arrow_batches": counted["batches"]}
    if counted["rows_in"] != counted["scored"] + counted["rejected"] or \
            written.get("scored", 0) != counted["scored"] or written.get("rejected", 0) != counted["rejected"]:
        raise DataError(f"row accounting failed: tasks counted rows_in {counted['rows_in']}, scored "
                        f"{counted['scored']}, rejected {counted['rejected']}, but wrote {written}; nothing was "
                        "published")
    return out


def evaluate_partition(spark: Any, src: SourceConfig, target: Target, split: Optional[str]) -> dict[str, Any]:
    """Accuracy of the published partition against the source's labels (known for the demo)."""
    key, label = src.key_column, src.label_column
    table = spark.table(src.table) if src.table else None
    if table is None or label not in table.columns:
        return {}
    truth = table.selectExpr(f"CAST(`{key}` AS STRING) AS k", f"CAST(`{label}` AS STRING) AS truth")
    preds = spark.table(target.table).where(target.where())
    row = preds.join(truth, preds[key] == truth["k"]).selectExpr(
        "count(*) AS n", "avg(CAST(predicted_label = truth AS INT)) AS acc").first()
    return {"rows": int(row["n"]), "accuracy": round(float(row["acc"] or 0.0), 4),
            "table_rows": spark.table(target.table).where(target.where()).count()}


def _run_id() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]


def _delete_quietly(location: str) -> None:
    try:
        if fs.exists(fs_uri(location)):
            fs.delete(fs_uri(location))
    except ANY_ERROR as exc:  # clean-up must not hide the real error
        log.warning("could not remove %s: %s", location, exc)


def _write_json(uri: str, doc: dict[str, Any]) -> None:
    fs.makedirs(uri.rsplit("/", 1)[0])
    fs.write_bytes_atomic(uri, (json.dumps(doc, indent=2, default=str) + "\n").encode())


def summary_table(report: dict[str, Any]) -> str:
    """The job's closing summary, one line per fact."""
    part = ", ".join(f"{k}={v}" for k, v in report["partition"].items())
    lines = [f"{'rows in':<22}{report['rows_in']:>12,}",
             f"{'scored':<22}{report['scored']:>12,}  -> {report['output_table']} ({part})",
             f"{'rejected':<22}{report['rejected']:>12,}  -> {report['rejects_table']} ({part})"]
    for reason, n in report["rejects_by_reason"].items():
        lines.append(f"{'  ' + reason:<22}{n:>12,}")
    lines.append(f"{'model loads':<22}{report['model_loads']:>12,}  "
                 f"(in {report['tasks']:,} tasks, {report['arrow_batches']:,} Arrow batches)")
    lines.append(f"model: {report['model']['uri']} (manifest {report['model']['manifest_digest']})")
    lines.append("drift: " + ("; ".join(report["drift"]["alerts"]) if report["drift"]["drifted"] else "none"))
    if report.get("evaluation"):
        ev = report["evaluation"]
        lines.append(f"{report['output_table']} ({part}): {ev['table_rows']:,} rows, accuracy {ev['accuracy']:.4f} "
                     f"on {ev['rows']:,} labelled rows")
    lines.append(f"time: {report['seconds']:.1f}s")
    return "\n".join(lines)


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="etl/score_job.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="job YAML; its source is the input")
    p.add_argument("--model", help="training output folder, runs:/..., models:/NAME/VERSION|@ALIAS, or a name")
    p.add_argument("--output-table", help="Hive table db.name for the predictions (created when missing)")
    p.add_argument("--partition", help="k=v[,k=v] (default score.partition, else ds=<UTC date>)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty partition (atomically)")
    p.add_argument("--master", help="Spark master for a local run (spark-submit sets it otherwise)")
    p.add_argument("--split", choices=["train", "validation", "test"], help="only the rows of this ETL split")
    p.add_argument("--evaluate", action="store_true", help="report accuracy against source labels")
    p.add_argument("overrides", nargs="*", help="config overrides, key=value")
    return p.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    args = parse_args(argv)
    secrets.private_files()
    try:
        cfg = config_mod.load(args.config, args.overrides)
        secrets.protect_logging(*secrets.secret_values(cfg.flat()))
        model = args.model or cfg.score.model
        if not model:
            raise DataError("no model: pass --model (a training output folder, runs:/..., models:/...) or set "
                            "score.model")
        target = plan_target(cfg.score, args.output_table, args.partition, args.overwrite,
                             dt.datetime.now(dt.timezone.utc).date())
        spark = session.get_session(cfg, args.master)
        report = run(spark, cfg, model, target, args.split, args.evaluate)
    except HvdtrainError as exc:
        return console.report_error(exc, "score")
    print(summary_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
