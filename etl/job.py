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
from hvdtrain.core import config as config_mod
from hvdtrain.core import secrets
from hvdtrain.core.config import SPLITS, JobConfig
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


def check_output(cfg: JobConfig) -> bool:
    """Refuse to clobber a published dataset unless asked, and anything else always; True when one is replaced.

    Decided as the publish decides (:func:`etl.publish.check_claim`): a folder holding any file neither its
    ledger nor its manifest names is refused, with or without ``etl.overwrite``, before any Spark work.
    """
    out = cfg.etl.output
    if not fs.exists(out):
        return False
    files = publish.check_claim(out)
    names = sorted({f.split("/")[0] for f in files})
    published = manifest.MANIFEST_NAME in names or manifest.MANIFEST_NAME + manifest.NEXT_SUFFIX in names
    if published and not cfg.etl.overwrite:
        raise DataError(f"etl.output {out} already holds a dataset (manifest.json); pass --overwrite "
                        "(or etl.overwrite=true) to replace it, or choose another etl.output")
    if names and not published and not cfg.etl.overwrite:
        raise DataError(f"etl.output {out} holds the remains of an unfinished hvdtrain ETL "
                        f"({', '.join(names[:5])}) and no manifest; pass --overwrite to replace them, or choose "
                        "an empty folder")
    return published


def run(spark: Any, cfg: JobConfig) -> dict[str, Any]:
    """Run the ETL on a SparkSession; returns the report (also written as etl_report.json)."""
    fs.prepare_hdfs_client(cfg.etl.output, cfg.etl.vocab_file)  # the driver publishes (write tasks: their own)
    with lease.acquire(cfg.etl.output, f"etl.output {cfg.etl.output}"):  # one writer at a time, from the check on
        return _run_leased(spark, cfg)


def _run_leased(spark: Any, cfg: JobConfig) -> dict[str, Any]:
    """:func:`run` while this job holds etl.output's lease."""
    from pyspark import StorageLevel

    timer = StageTimer()
    replacing = check_output(cfg)
    fault = faults.from_env()  # test-only hook; None unless HVDTRAIN_ETL_FAULT is set
    run_id = uuid.uuid4().hex[:12]
    staging = fs.join(cfg.etl.output, publish.STAGING, run_id)
    first = not fs.exists(fs.join(cfg.etl.output, ledger.NAME))  # this run writes the folder's first ledger
    publish.claim_staging(cfg.etl.output, run_id)  # the ledger names it before anything is staged
    try:
        with timer.stage("read"):
            raw = sources.read(spark, cfg)
        with timer.stage("validate"):
            checked = validate.run(raw, cfg, fault)
            validate.refuse_undecodable(checked, cfg, sources.describe(cfg))
            rows = split_mod.add_split(faults.drop_rows(checked.valid, fault, "split"), cfg.etl.splits)
            rows = rows.persist(StorageLevel.MEMORY_AND_DISK)
            labels = label_mod.fit(rows, cfg)
            rows = label_mod.reject_unlearnable(rows, labels, cfg, checked)
            counts = split_mod.count_by_split(rows)
            checked.counts.by_split = counts
            validate.enforce_limits(checked, sum(counts.values()), cfg, sources.describe(cfg))
            validate.write_rejects(checked, fs.join(staging, "rejects"))
        if counts.get("train", 0) == 0:
            raise DataError(f"no valid training rows in {sources.describe(cfg)} "
                            f"(rows in: {checked.rows_in}, rejected: {checked.rejected_total}); see the rejects")
        with timer.stage("fit vocabulary and statistics on train"):
            tok = _tokenizer(rows, cfg) if cfg.source.text_column else None
            stats = _tabular_stats(rows, cfg)
            target = label_mod.target_stats(rows) if cfg.task.kind == "regression" else None
        text_specs = (manifest.text_features(cfg.etl.max_length, tok.get_vocab_size(with_added_tokens=True),
                                             cfg.etl.packed_tokens) if tok is not None else {})
        fitted = dataclasses.replace(_fitted(labels, tok, text_specs, stats), task=cfg.task.kind, target=target,
                                     weighted=cfg.source.weight_column is not None)
        with timer.stage("encode and write shards"):
            plan = writer.plan_shards(counts, cfg.etl.max_length if tok else 4, cfg.etl.target_shard_mb,
                                      cfg.etl.min_shards_per_split, cfg.etl.min_shard_mb)
            results = _write_shards(rows, fitted, plan, staging, cfg, fault)
        rows.unpersist()
        with timer.stage("publish"):
            facts = publish.RunFacts(staging=staging, stage_seconds=timer.seconds, versions=_versions(),
                                     created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                                     generation=f"v-{run_id}" if replacing else "")
            report = publish.act(publish.plan_publish(cfg, plan, results, fitted, checked.counts, facts))
    except BaseException:
        clean_staging(cfg.etl.output, run_id)
        if first:  # a failed first run leaves nothing behind, not even the ledger naming its staging
            drop_ledger(cfg.etl.output)
        raise
    clean_staging(cfg.etl.output, run_id)
    return report


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


def _tokenizer(rows: Any, cfg: JobConfig):
    from pyspark.sql import functions as F

    opts = text.TextOptions.from_etl(cfg.etl)
    if cfg.etl.vocab_file:
        if not fs.exists(cfg.etl.vocab_file):
            raise DataError(f"etl.vocab_file {cfg.etl.vocab_file} does not exist; give a vocab.txt path "
                            "or remove the key to learn the vocabulary from the training split")
        lines = read_vocab(cfg.etl.vocab_file)
        try:
            return text.from_vocab(lines, opts)
        except ValueError as exc:
            raise DataError(f"etl.vocab_file {cfg.etl.vocab_file}: {exc}") from None
    texts = rows.where("split = 'train'").select(F.translate("text", TEXT_SEP, " ").alias("text"))
    counts = top_word_counts(texts, opts, cfg.etl.vocab_size)  # every text column's words
    return text.from_vocab(text.learn_vocab(counts, cfg.etl.vocab_size), opts)


def top_word_counts(texts: Any, opts: Any, vocab_size: int) -> dict[str, int]:
    """The most frequent words of a ``text`` column and their counts, reduced on the executors.

    Words are counted per Arrow batch in the tasks, summed by a Spark aggregation, and only the top
    :func:`hvdtrain.data.wordpiece.candidates_limit` (by count, ties by word) reach the driver, so the driver's
    memory is bounded by the vocabulary size, not by the number of distinct words.
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

    top = (texts.mapInPandas(count_words, "word string, n long").groupBy("word").agg(F.sum("n").alias("n"))
           .orderBy(F.desc("n"), F.asc("word")).limit(wordpiece.candidates_limit(vocab_size)).collect())
    return {r["word"]: r["n"] for r in top}


def _tabular_stats(rows: Any, cfg: JobConfig) -> Optional[dict]:
    if not (cfg.source.numeric_columns or cfg.source.categorical_columns or cfg.source.datetime_columns):
        return None
    return tabular.fit(rows.where("split = 'train'"), cfg)


def _write_shards(rows: Any, fitted: Fitted, plan: Any, staging: str, cfg: JobConfig, fault: Any = None) -> list:
    from functools import partial

    encode_label = label_mod.encoder(cfg.task, fitted.labels)
    offsets = {s: plan.offset(s) for s in SPLITS}
    counts = dict(plan.counts)
    rows, num_cols, cat_cols = encoder_inputs(rows, cfg.source)
    several = len(cfg.source.text_columns) > 1  # a tuple of the row's texts (hvdtrain.data.features.encode_columns)
    weight = cfg.source.weight_column  # validated: a finite number >= 0 (etl.validate.weight_rules)
    # Partition = shard: (split offset + a hash of the key); inside it, rows in the order of a seeded hash of the
    # key (etl.split.add_order), never the key's own order, which on most real tables follows time or the
    # target. Shard contents and order are the same on every rerun, whatever the input partitioning.
    keyed = split_mod.add_order(rows, cfg.etl.seed, "_order").rdd.map(lambda r: (
        (offsets[r["split"]] + _stable_shard(r["key"], counts[r["split"]]), r["_order"], r["key"]),
        (tuple(r["text"].split(TEXT_SEP)) if several and r["text"] else r["text"], encode_label(r["label"]),
         tuple(r[c] for c in num_cols), tuple(r[c] for c in cat_cols),
         float(r[weight]) if weight else None)))
    ordered = keyed.repartitionAndSortWithinPartitions(plan.total, partitionFunc=lambda k: k[0])
    task = partial(writer.write_partition, plan=plan, staging=staging, fitted=fitted,
                   compression=cfg.etl.compression, fault=fault)
    return ordered.mapPartitionsWithIndex(task).collect()


def encoder_inputs(rows: Any, src: Any) -> tuple[Any, list[str], list[str]]:
    """(rows with the encoder's input columns added, numeric row columns, categorical row columns).

    Categorical values as the strings the fit counted and datetime values as the numbers it derived its
    features from, made by the fit's own Spark expressions (:mod:`etl.stats`), so nothing the writer encodes
    depends on this process's time zone or on how Spark hands a type to Python. The numeric row is the numeric
    columns, then the datetime columns (:func:`hvdtrain.data.features.transform`).
    """
    cats, dts = list(src.categorical_columns), list(src.datetime_columns)
    rows = rows.select("*", *[stats_mod.category_value(rows, c).alias(f"_cat{j}") for j, c in enumerate(cats)],
                       *[stats_mod.epoch_value(rows, c).alias(f"_dt{j}") for j, c in enumerate(dts)])
    return rows, [*src.numeric_columns, *(f"_dt{j}" for j in range(len(dts)))], [f"_cat{j}" for j in range(len(cats))]


def _stable_shard(key: str, count: int) -> int:
    import zlib

    return zlib.crc32(key.encode("utf-8")[::-1]) % count


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

        spark_log = session.log_file(cfg, args.master, args.verbose, "etl")
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
