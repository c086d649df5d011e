"""The ETL job: a Hive table (or files) to validated, tokenized TFRecord shards + manifest.

Entry points, all running :func:`run`:

    spark-submit etl/job.py --config configs/job.yaml            # cluster or local
    python -m etl.job --config configs/demo.yaml --master local[2]
    hvdtrain etl configs/demo.yaml                               # local, via this module

Stages: read -> validate (quarantine rejects) -> split by key hash -> learn
vocabulary on train -> tokenize + write shards in Spark tasks -> publish
(move shards, write manifest last).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import logging
import platform
import sys
import time
import uuid
from contextlib import contextmanager
from typing import Any, Iterator, Optional

if __package__ in (None, ""):  # `spark-submit etl/job.py`: make the repo importable
    import os

    # Last, so the code shipped with --py-files (hvdtrain yarn etl's zip, on PYTHONPATH) wins over the checkout.
    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import hvdtrain
from etl import faults, publish, session, sources, tabular, text, validate, writer
from etl import labels as label_mod
from etl import split as split_mod
from etl import stats as stats_mod
from etl.fitted import Fitted
from etl.writer import INTERNAL
from hvdtrain.core import config as config_mod
from hvdtrain.core import secrets
from hvdtrain.core.config import SPLITS, EtlConfig, JobConfig, SourceConfig
from hvdtrain.core.errors import ANY_ERROR, DataError, HvdtrainError, add_note
from hvdtrain.data import manifest, wordpiece
from hvdtrain.data.features import TEXT_SEP
from hvdtrain.hadoop import fs, lease, ledger
from hvdtrain.observe import console

log = logging.getLogger("hvdtrain.etl")


class StageTimer:
    """Wall time per stage, for the log and the report."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        log.info("etl: %s ...", name)
        yield
        self.seconds[name] = round(time.perf_counter() - start, 2)
        log.info("etl: %s done in %.1fs", name, self.seconds[name])


def check_output(etl: EtlConfig) -> bool:
    """Refuse to clobber a published dataset unless asked, and anything else always; True when one is replaced.

    Decided as the publish decides (:func:`etl.publish.check_claim`): a folder holding any file neither its
    ledger nor its manifest names is refused, with or without ``etl.overwrite``, before any Spark work.
    """
    out = etl.output
    if not fs.exists(out):
        return False
    files = publish.check_claim(out)
    names = sorted({f.split("/")[0] for f in files})
    published = manifest.MANIFEST_NAME in names or manifest.MANIFEST_NAME + manifest.NEXT_SUFFIX in names
    if published and not etl.overwrite:
        raise DataError(f"etl.output {out} already holds a dataset (manifest.json); pass --overwrite "
                        "(or etl.overwrite=true) to replace it, or choose another etl.output")
    if names and not published and not etl.overwrite:
        raise DataError(f"etl.output {out} holds the remains of an unfinished hvdtrain ETL "
                        f"({', '.join(names[:5])}) and no manifest; pass --overwrite to replace them, or choose "
                        "an empty folder")
    return published


def run(spark: Any, cfg: JobConfig) -> dict[str, Any]:
    """Run the ETL on a SparkSession; returns the report (also written as etl_report.json)."""
    fs.prepare_hdfs_client(cfg.etl.output, cfg.etl.vocab_file)  # the driver publishes (write tasks: their own)
    with lease.acquire(cfg.etl.output, f"etl.output {cfg.etl.output}") as held:  # one writer, from the check on
        return _run_leased(spark, cfg, held)


def _run_leased(spark: Any, cfg: JobConfig, held: lease.Lease) -> dict[str, Any]:
    """:func:`run` while this job holds etl.output's lease (checked again right before publishing)."""
    from pyspark import StorageLevel

    timer = StageTimer()
    replacing = check_output(cfg.etl)
    fault = faults.from_env()  # test-only hook; None unless HVDTRAIN_ETL_FAULT is set
    run_id = uuid.uuid4().hex[:12]
    staging = fs.join(cfg.etl.output, publish.STAGING, run_id)
    first = not fs.exists(fs.join(cfg.etl.output, ledger.NAME))  # this run writes the folder's first ledger
    publish.claim_staging(cfg.etl.output, run_id)  # the ledger names it before anything is staged
    fs.makedirs(staging)
    fs.set_permission(staging, fs.PRIVATE_DIR)  # the rejected raw rows are written here: nobody else may look in
    cached: list = []  # what this run keeps in Spark's storage, freed however it ends
    try:
        with timer.stage("read"):
            raw = sources.read(spark, cfg)
        with timer.stage("validate"):
            checked = validate.run(raw, cfg.source, cfg.validation, fault, cached)
            validate.refuse_undecodable(checked, cfg.source, sources.describe(cfg.source))
            rows = split_mod.add_split(faults.drop_rows(checked.valid, fault, "split"), cfg.etl.splits)
            rows = rows.persist(StorageLevel.MEMORY_AND_DISK)
            cached.append(rows)
            labels = label_mod.fit(rows, cfg.task, cfg.source.label_column)
            rows = label_mod.reject_unlearnable(rows, labels, cfg.task, checked)
            counts = split_mod.count_by_split(rows)
            checked.counts.by_split = counts
            validate.enforce_limits(checked, sum(counts.values()), cfg.source, cfg.validation,
                                    sources.describe(cfg.source))
            validate.write_rejects(checked, fs.join(staging, "rejects"))
        checked.release()  # `rows` holds all the later stages read; the rejects are written
        if counts.get("train", 0) == 0:
            raise DataError(f"no valid training rows in {sources.describe(cfg.source)} "
                            f"(rows in: {checked.rows_in}, rejected: {checked.rejected_total}); see the rejects")
        with timer.stage("fit vocabulary and statistics on train"):
            tok = _tokenizer(rows, cfg.etl) if cfg.source.text_column else None
            stats = _tabular_stats(rows, cfg.source, cfg.etl)
            target = label_mod.target_stats(rows) if cfg.task.kind == "regression" else None
        text_specs = (manifest.text_features(cfg.etl.max_length, tok.get_vocab_size(with_added_tokens=True),
                                             cfg.etl.packed_tokens) if tok is not None else {})
        fitted = dataclasses.replace(_fitted(labels, tok, text_specs, stats), task=cfg.task.kind, target=target,
                                     weighted=cfg.source.weight_column is not None)
        with timer.stage("encode and write shards"):
            plan = writer.plan_shards(counts, cfg.etl.max_length if tok else 4, cfg.etl.target_shard_mb,
                                      cfg.etl.min_shards_per_split, cfg.etl.min_shard_mb)
            results = _write_shards(rows, fitted, plan, staging, cfg, fault)
        _release(cached)  # `rows` itself is a filter of the persisted copy: its unpersist would free nothing
        with timer.stage("publish"):
            held.check()  # a lease broken while this run could not renew it: another run may be publishing
            facts = publish.RunFacts(staging=staging, stage_seconds=timer.seconds, versions=_versions(),
                                     created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                                     generation=f"v-{run_id}" if replacing else "")
            report = publish.act(publish.plan_publish(cfg, plan, results, fitted, checked.counts, facts))
    except BaseException:
        _release(cached)
        clean_staging(cfg.etl.output, run_id)
        if first:  # a failed first run leaves nothing behind, not even the ledger naming its staging
            drop_ledger(cfg.etl.output)
        raise
    clean_staging(cfg.etl.output, run_id)
    return report


def _release(cached: list) -> None:
    """Free the run's cached rows, once the shards are written or after a failure (clean-up must not hide the
    real error)."""
    try:
        for df in cached:
            df.unpersist()
    except ANY_ERROR as exc:
        log.warning("could not free the cached rows: %s", exc)


def _fitted(labels: list[str], tok: Any, text_specs: dict[str, manifest.FeatureSpec],
            stats: Optional[dict]) -> Fitted:
    if tok is None:
        return Fitted(labels=labels, tabular_stats=stats)
    return Fitted(labels=labels, text_specs=text_specs, vocab=text.vocab_lines(tok),
                          tokenizer_json=tok.to_str(), tabular_stats=stats)


def read_vocab(uri: str) -> list[str]:
    """A vocab.txt's lines; a file that is not UTF-8 is a DataError naming the byte."""
    raw = fs.read_bytes(uri)
    try:
        return raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise DataError(f"etl.vocab_file {uri} is not UTF-8 (byte {raw[exc.start:exc.start + 1]!r} at offset "
                        f"{exc.start}, line {line}): convert it, e.g. iconv -f latin1 -t utf-8") from None


def _tokenizer(rows: Any, etl: EtlConfig):
    from pyspark.sql import functions as F

    opts = text.TextOptions.from_etl(etl)
    if etl.vocab_file:
        if not fs.exists(etl.vocab_file):
            raise DataError(f"etl.vocab_file {etl.vocab_file} does not exist; give a vocab.txt path "
                            "or remove the key to learn the vocabulary from the training split")
        lines = read_vocab(etl.vocab_file)
        try:
            return text.from_vocab(lines, opts)
        except ValueError as exc:
            raise DataError(f"etl.vocab_file {etl.vocab_file}: {exc}") from None
    texts = rows.where("split = 'train'").select(F.translate("text", TEXT_SEP, " ").alias("text"))
    counts = top_word_counts(texts, opts, etl.vocab_size)  # every text column's words
    return text.from_vocab(text.learn_vocab(counts, etl.vocab_size), opts)


# Printable ASCII, tab and line breaks: text the normalizer leaves as it is (but for case) and whose words Spark SQL
# can find as the pre-tokenizer does (BertPreTokenizer: split on whitespace, every ASCII punctuation character a
# word of its own). Other text goes through the tokenizer itself.
_PLAIN_TEXT = "\\A[\\x20-\\x7e\\t\\n\\r]*\\z"  # \A..\z: Java's $ also matches before a final U+2028
_PUNCTUATION = "!-/:-@\\[-`{-~"  # Rust's char::is_ascii_punctuation, as a Java regex character class


def top_word_counts(texts: Any, opts: Any, vocab_size: int) -> dict[str, int]:
    """The most frequent words of a ``text`` column and their counts, reduced on the executors.

    Words are what the tokenizer's normalizer and pre-tokenizer make of a text (:func:`etl.text.words`). For
    plain ASCII text (:data:`_PLAIN_TEXT`) Spark SQL finds them on the JVM: lower case, a space each side of
    every punctuation character, then a split on whitespace (the pre-tokenizer's split). Other text is counted
    per Arrow batch by the tokenizer in Python tasks. Both are summed by one Spark aggregation, and only the
    top :func:`hvdtrain.data.wordpiece.candidates_limit` (by count, ties by word) reach the driver, so the
    driver's memory is bounded by the vocabulary size, not by the number of distinct words.
    """
    from collections import Counter

    from pyspark.sql import functions as F

    base_json = text.base(opts).to_str()

    def count_words(batches):
        import pandas as pd
        from tokenizers import Tokenizer

        tok = Tokenizer.from_str(base_json)
        for batch in batches:
            counts = Counter(w for t in batch["text"] if t is not None for w in text.words(tok, t))
            yield pd.DataFrame({"word": list(counts), "n": list(counts.values())})

    plain = F.col("text").rlike(_PLAIN_TEXT)
    cased = F.lower("text") if opts.lowercase else F.col("text")
    spaced = F.regexp_replace(cased, f"([{_PUNCTUATION}])", " $1 ")  # each punctuation character a word
    words = F.filter(F.split(spaced, "\\s+"), lambda w: w != "")
    sql_words = texts.where(plain).select(F.explode(words).alias("word")).select("word",
                                                                               F.lit(1).cast("long").alias("n"))
    other_words = texts.where(~plain).mapInPandas(count_words, "word string, n long")
    top = (sql_words.unionByName(other_words).groupBy("word").agg(F.sum("n").alias("n"))
           .orderBy(F.desc("n"), F.asc("word")).limit(wordpiece.candidates_limit(vocab_size)).collect())
    return {r["word"]: r["n"] for r in top}


def _tabular_stats(rows: Any, src: SourceConfig, etl: EtlConfig) -> Optional[dict]:
    if not (src.numeric_columns or src.categorical_columns or src.datetime_columns):
        return None
    return tabular.fit(rows.where("split = 'train'"), src, etl)


def _write_shards(rows: Any, fitted: Fitted, plan: Any, staging: str, cfg: JobConfig, fault: Any = None) -> list:
    """Stage every shard (etl.writer's commit protocol); the results of the successful attempts.

    A row's shard is its split's offset plus a hash of its key; inside a shard, rows follow a seeded hash of the
    key (etl.split.add_order), never the key's own order, which on most real tables follows time or the target.
    Each write task writes a contiguous run of whole shards (:func:`write_tasks` of them: a few per core, not one
    per shard, since each Python task costs Spark about 0.13 s on top of its work). All of it is Spark SQL, and
    the shuffle and sort run on the JVM (``repartition`` on a column whose hash lands each run of shards in its
    own partition, then ``sortWithinPartitions``); the write tasks get Arrow batches (``mapInArrow``). Shard
    contents and order are the same on every rerun, whatever the input partitioning or the number of tasks.

    Reads cfg.source (the feature columns), cfg.task (the label's encoding) and cfg.etl (seed, compression).
    """
    from functools import partial

    from pyspark.sql import functions as F

    rows, columns = encoder_inputs(rows, cfg.source, fitted.tabular_stats)
    label = (F.expr("try_cast(label AS DOUBLE)") if cfg.task.kind == "regression" else F.col("label"))
    shard: Any = None
    for split in SPLITS:
        if plan.counts[split]:
            here, cond = F.lit(plan.offset(split)) + shard_of(F.col("key"), plan.counts[split]), F.col("split") == split
            shard = F.when(cond, here) if shard is None else shard.when(cond, here)
    keyed = split_mod.add_order(rows, cfg.etl.seed, writer.ORDER).select(
        shard.cast("int").alias(writer.SHARD), writer.ORDER, "key", "text", label.alias("label"),
        *columns.numeric, *columns.categorical, *([columns.weight] if columns.weight else []))
    tasks = write_tasks(plan.total, rows.sparkSession.sparkContext.defaultParallelism)
    places = F.array(*[F.lit(k) for k in placing_keys(rows.sparkSession, tasks)]).cast("array<bigint>")
    place = f"{INTERNAL}place"
    placed = keyed.withColumn(place, F.element_at(places, task_of(writer.SHARD, plan.total, tasks) + 1))
    ordered = placed.repartition(tasks, place).drop(place) \
        .sortWithinPartitions(writer.SHARD, writer.ORDER, "key")
    columns = dataclasses.replace(columns, encode_label=label_mod.encoder(cfg.task, fitted.labels))
    task = partial(writer.write_batches, plan=plan, staging=staging, fitted=fitted, columns=columns,
                   compression=cfg.etl.compression, fault=fault)
    results = [writer.result_of(r) for r in ordered.mapInArrow(task, writer.RESULT_SCHEMA).collect()]
    slow = sum(r.encoder != "native" for r in results)
    if slow:
        log.warning("etl: %d of %d shards were encoded by the NumPy loops (about 5x slower than compiled): the "
                    "executors' Python has no hvdtrain_native; install it in the environment they run (pip install "
                    "./native from the hvdtrain checkout; on YARN the next submission packs that environment anew, "
                    "or repack yarn.env_archive with hvdtrain yarn pack ARCHIVE)",
                    slow, len(results))
    return results


def encoder_inputs(rows: Any, src: Any, stats: Optional[dict]) -> tuple[Any, writer.Columns]:
    """(rows with the encoder's input columns added, their names as the write tasks read them).

    Categorical values as their ids (:func:`etl.tabular.category_ids`, from the strings the fit counted) and
    datetime values as the numbers the fit derived its features from, made by the fit's own Spark expressions
    (:mod:`etl.stats`), so nothing the writer encodes depends on this process's time zone or on how Spark hands a
    type to Python. ``stats``: the fitted tabular statistics (None when there are no tabular columns). The numeric row is the numeric
    columns, then the datetime columns (:func:`hvdtrain.data.features.transform`), as doubles; the sample weight
    (``source.weight_column``, validated a finite number >= 0 by etl.validate.weight_rules) too.
    """
    from pyspark.sql import functions as F

    cats, dts, weight = list(src.categorical_columns), list(src.datetime_columns), src.weight_column
    numbers = [F.expr(f"try_cast(`{c}` AS DOUBLE)") for c in src.numeric_columns]
    numbers += [stats_mod.epoch_value(rows, c).cast("double") for c in dts]
    rows = rows.select("*", *[x.alias(f"{INTERNAL}n{j}") for j, x in enumerate(numbers)],
                       *[stats_mod.category_value(rows, c).alias(f"{INTERNAL}cat{j}") for j, c in enumerate(cats)],
                       *([F.expr(f"try_cast(`{weight}` AS DOUBLE)").alias(f"{INTERNAL}weight")] if weight else []))
    ids = tuple(f"{INTERNAL}cid{j}" for j in range(len(cats)))
    if cats:
        assert stats is not None, "categorical columns are fitted before they are written"
        rows = tabular.category_ids(rows, stats, [f"{INTERNAL}cat{j}" for j in range(len(cats))], ids)
    return rows, writer.Columns(numeric=tuple(f"{INTERNAL}n{j}" for j in range(len(numbers))), categorical=ids,
                                several_texts=len(src.text_columns) > 1,
                                weight=f"{INTERNAL}weight" if weight else None)


def shard_of(key: Any, count: int) -> Any:
    """A key's shard in its split, as Spark SQL: CRC32 of the key's characters in reverse order (so it does not
    follow the split's CRC32 of the key), mod ``count``. :func:`stable_shard` is the Python reference."""
    from pyspark.sql import functions as F

    return F.pmod(F.crc32(F.encode(F.reverse(key), "UTF-8")), F.lit(count))


def stable_shard(key: str, count: int) -> int:
    """:func:`shard_of` in Python."""
    import zlib

    return zlib.crc32(key[::-1].encode("utf-8")) % count


# Write tasks per core of the application (Spark's defaultParallelism): enough that a slow task or a retry is a
# small part of the stage, few enough that Spark's cost per Python task (about 0.13 s on local[2]) stays small.
TASKS_PER_CORE = 4


def write_tasks(shards: int, cores: int) -> int:
    """How many tasks write ``shards`` shards with ``cores`` cores (pure): :data:`TASKS_PER_CORE` a core, never more
    than one a shard, at least one."""
    return max(1, min(shards, TASKS_PER_CORE * max(1, cores)))


def task_of(shard: str, shards: int, tasks: int) -> Any:
    """Spark SQL: the write task of the shard in column ``shard``, ``shard * tasks div shards`` (integer division):
    contiguous runs of whole shards, their sizes differing by at most one shard (:func:`write_tasks`)."""
    from pyspark.sql import functions as F

    return F.expr(f"CAST((CAST(`{shard}` AS BIGINT) * {int(tasks)}) div {int(shards)} AS INT)")


def placing_keys(spark: Any, partitions: int) -> list[int]:
    """For each partition p of ``partitions``, the smallest long whose Spark hash partitioning (Murmur3 with
    seed 42, pmod ``partitions``: what ``repartition(partitions, column)`` computes) is p. Found by Spark itself,
    in one small job, so the placement is the partitioner's own and never a copy of it."""
    from pyspark.sql import functions as F

    found: dict[int, int] = {}
    lo, hi = 0, 64 * partitions  # 64 tries a partition: each is missed with probability e**-64
    while len(found) < partitions:
        rows = (spark.range(lo, hi).select("id", F.pmod(F.hash("id"), F.lit(partitions)).alias("p"))
                .groupBy("p").agg(F.min("id").alias("id")).collect())
        for r in rows:
            found.setdefault(int(r["p"]), int(r["id"]))
        lo, hi = hi, 2 * hi
    return [found[p] for p in range(partitions)]


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"hvdtrain": hvdtrain.__version__, "python": platform.python_version()}
    for dist in ("pyspark", "tokenizers", "pyarrow"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    return out


def clean_staging(out: str, run_id: str) -> None:
    """Remove this run's ``_staging/<run_id>`` (its ledger names it), then ``_staging`` only when that left it
    empty: another run's staging, or anything else in it, is never this run's to delete."""
    staging = fs.join(out, publish.STAGING)
    try:
        fs.delete(fs.join(staging, run_id))
        if fs.exists(staging) and not fs.listdir(staging):
            fs.delete(staging)
        found = ledger.read(out)  # the ledger no longer names what is gone: a rerun's ledger is the same bytes
        mine = f"{publish.STAGING}/{run_id}"
        if found is not None and any(e == mine or e.startswith(mine + "/") for e in found.entries):
            ledger.write(out, ledger.Ledger(found.writer, tuple(e for e in found.entries
                                                                if not (e == mine or e.startswith(mine + "/")))))
    except ANY_ERROR as exc:  # clean-up must not hide the real error
        log.warning("could not remove %s: %s", fs.join(staging, run_id), exc)


def drop_ledger(out: str) -> None:
    """Delete ``out``'s ledger when it names nothing but runs' staging that is gone (a failed first run's)."""
    try:
        found = ledger.read(out)
        staged = [e for e in found.entries if e.startswith(publish.STAGING + "/")] if found else []
        if found is not None and len(staged) == len(found.entries) and not fs.exists(fs.join(out, publish.STAGING)):
            fs.delete(fs.join(out, ledger.NAME))
    except ANY_ERROR as exc:  # clean-up must not hide the real error
        log.warning("could not remove %s: %s", fs.join(out, ledger.NAME), exc)


def summary_table(report: dict[str, Any]) -> str:
    """The job's closing summary, one line per fact."""
    lines = [f"{'rows in':<22}{report['rows_in']:>12,}",
             f"{'rows written':<22}{report['rows_written']:>12,}",
             f"{'rows rejected':<22}{report['rows_rejected']:>12,}",
             f"{'duplicates dropped':<22}{report['duplicates_dropped']:>12,}"]
    for split, n in report["rows_by_split"].items():
        lines.append(f"{'  ' + split:<22}{n:>12,}  in {report['shards_by_split'][split]} shards")
    for rule, n in report["rejects_by_rule"].items():
        lines.append(f"{'  rejected: ' + rule:<22}{n:>12,}")
    for stage, sec in report["stage_seconds"].items():
        lines.append(f"{'  time: ' + stage:<34}{sec:>7.1f}s")
    encoders = ", ".join(f"{kind} {n}" for kind, n in report.get("shards_by_encoder", {}).items())
    lines.append(f"{'shards encoded by':<22}{encoders:>12}")
    lines.append(f"manifest: {report['manifest']}")
    return "\n".join(lines)


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="etl/job.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="job YAML, e.g. configs/demo.yaml")
    p.add_argument("--master", help="Spark master for a local run (spark-submit sets it otherwise)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing dataset at etl.output")
    p.add_argument("--create-sample-table", action="store_true",
                   help="first write source.sample rows into source.table (demo and tests)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="Spark's log and stage progress bars on the console (a local run logs to a file otherwise)")
    p.add_argument("overrides", nargs="*", help="config overrides, key=value")
    return p.parse_intermixed_args(argv)  # key=value overrides may come before, between or after options


def main(argv: Optional[list[str]] = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # "Closing down clientserver connection" at exit
    args = parse_args(argv)
    spark_log = None
    secrets.private_files()
    try:
        cfg = config_mod.load(args.config, args.overrides + (["etl.overwrite=true"] if args.overwrite else []))
        secrets.protect_logging(*secrets.secret_values(cfg.flat()))

        spark_log = session.log_file(cfg.workdir, args.master, args.verbose, "etl")
        spark = session.get_session(cfg, args.master, args.verbose, "etl")
        if args.create_sample_table:
            sources.create_sample_table(spark, cfg)
        report = run(spark, cfg)
    except HvdtrainError as exc:
        if spark_log:
            add_note(exc, console.spark_log_note(spark_log))
        return console.report_error(exc, "etl")
    print(summary_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
