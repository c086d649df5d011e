"""The shard writer's Spark side (issue 55): shard assignment, placement and row order in Spark SQL on the JVM,
word counts for the vocabulary in Spark SQL for plain text, and the shards' bytes unchanged by the move.

Each check has a Python reference it is held against: the shard of a key (:func:`etl.job.stable_shard`), Spark's
own hash partitioner (the place a shard lands), the tokenizer's words on a real corpus (the standard library's
own source and docstrings, with non-ASCII lines), and the shard digests the per-row Python writer produced
before (pinned below).
"""
import collections
import inspect
import json as json_mod
import textwrap

import pytest

from hvdtrain.core import config
from hvdtrain.data import manifest

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    from etl import session

    tmp = tmp_path_factory.mktemp("writer-jvm")
    cfg = config.from_dict({"name": "w", "workdir": str(tmp), "source": {"table": "x.y"},
                            "etl": {"output": str(tmp / "out")}}, base_dir=str(tmp))
    spark = session.get_session(cfg, "local[2]")
    yield spark
    spark.stop()


def test_the_spark_shard_of_a_key_matches_python_on_any_key(spark):
    """Shard = CRC32 of the key's characters reversed, mod the split's shard count: Spark SQL and Python agree on
    ASCII, accented, CJK, emoji (a surrogate pair in Java) and empty keys; for ASCII keys the reversed characters
    are the reversed bytes the per-row writer hashed, so shard contents did not move."""
    from pyspark.sql import functions as F

    from etl import job

    keys = ["k1", "r0000017", "café", "東京タワー", "a😀b", "", "Ünïcödé-42", *(f"row-{i}" for i in range(200))]
    got = spark.createDataFrame([(k,) for k in keys], "key string").select(
        "key", *[job.shard_of(F.col("key"), n).alias(f"s{n}") for n in (1, 3, 7, 1000)]).collect()
    for r in got:
        for n in (1, 3, 7, 1000):
            assert r[f"s{n}"] == job.stable_shard(r["key"], n), (r["key"], n)
    import zlib

    assert all(job.stable_shard(k, 7) == zlib.crc32(k.encode()[::-1]) % 7 for k in keys if k.isascii())


@pytest.mark.parametrize("shards,tasks", [(1, 1), (3, 3), (17, 17), (64, 64), (90, 8), (17, 5), (64, 63)])
def test_each_run_of_shards_lands_in_its_own_partition(spark, shards, tasks):
    """The placing keys are found by Spark's partitioner itself: repartitioning on them puts the shards of write
    task t, a contiguous run whose size differs from the others' by at most one shard, in partition t and nowhere
    else, and every partition gets its run, so the write tasks are balanced as the shards are."""
    from pyspark.sql import functions as F

    from etl import job

    places = job.placing_keys(spark, tasks)
    assert len(set(places)) == tasks
    df = spark.range(shards * 5).select((F.col("id") % shards).cast("int").alias("shard"))
    arr = F.array(*[F.lit(k) for k in places]).cast("array<bigint>")
    placed = df.withColumn("place", F.element_at(arr, job.task_of("shard", shards, tasks) + 1)) \
        .repartition(tasks, "place")
    seen = sorted((r["shard"], r["p"]) for r in placed.select("shard", F.spark_partition_id().alias("p"))
                  .distinct().collect())
    assert [s for s, _ in seen] == list(range(shards))  # each shard in one partition only
    assert [p for _, p in seen] == sorted(p for _, p in seen)  # in runs: task t's shards come before t + 1's
    runs = collections.Counter(p for _, p in seen)
    assert sorted(runs) == list(range(tasks)) and max(runs.values()) - min(runs.values()) <= 1


def _corpus() -> list[str]:
    """A real corpus nobody here wrote: lines of the standard library's source (code, docstrings, every ASCII
    punctuation character), plus lines that take the tokenizer's own path (accents, CJK, compatibility forms,
    control and zero-width characters, vertical tab and form feed)."""
    docs = [line for mod in (json_mod, textwrap, inspect, collections)
            for line in inspect.getsource(mod).splitlines() if line.strip()]
    return docs + ["Ünïcödé café naïve 東京タワー", "x\u00a0y\tz\r\nw", "\x00ctrl\x07 bell", "ﬁancé ＡＢＣ",
                   "a\u200bb", "\x7fdel", "tab\there", "\x0bvt\x0cff", "MiXeD CaSe, punct!?",
                   # a final line break Java's $ matches before: these must take the tokenizer's path
                   "abc\u2028", "Hello World\u0085", "foo.bar\u2029", "ends in a newline\n"]


@pytest.mark.parametrize("lowercase,nfkc,strip", [(True, True, True), (False, False, False)])
def test_word_counts_in_spark_sql_match_the_tokenizer_on_a_real_corpus(spark, lowercase, nfkc, strip):
    """Plain ASCII text is split into words by Spark SQL, the rest by the tokenizer: the counts equal the
    tokenizer's own (normalizer + pre-tokenizer) on every line, word for word."""
    from etl import job, text
    from hvdtrain.data import wordpiece

    docs = _corpus()
    opts = text.TextOptions(max_length=16, lowercase=lowercase, nfkc=nfkc, strip_control_chars=strip)
    exact = collections.Counter(w for d in docs for w in text.words(text.base(opts), d))
    cap = 50_000  # candidates_limit(cap) exceeds the corpus's distinct words: every count is compared
    assert wordpiece.candidates_limit(cap) > len(exact)
    got = job.top_word_counts(spark.createDataFrame([(d,) for d in docs], "text string").repartition(3), opts, cap)
    assert got == dict(wordpiece.top_words(exact, wordpiece.candidates_limit(cap)))


# Shard digests of three datasets as the per-row Python writer (before issue 55) wrote them from the table below:
# the JVM-side shuffle and sort, Arrow batches and column-wise encoding must not change a byte. Re-pinned once, on
# 2026-11-30, when hashed categorical columns moved from BLAKE2b to XXH64 (``features.HASH``, Spark SQL's
# ``xxhash64``): decoded, the new shards differed from the old ones only in the hashed column's ids, each the
# bucket its scheme gives the row's value.
PINNED = "tests/spark/data/etl_writer_pinned.json"


def _table(spark, path: str) -> None:
    spark.range(3000).selectExpr(
        "concat('r', id) AS id", "concat('u', CAST((id * 7919) % 700 AS STRING)) AS user",
        "concat('i', CAST((id * 104729) % 60 AS STRING)) AS item", "CAST((id % 1000) / 10.0 AS DOUBLE) AS amount",
        "concat_ws(' ', transform(sequence(0, 5), j -> concat('w', CAST((id * (j + 3) + j) % 90 AS STRING))))"
        " AS text", "CAST(id % 3 AS STRING) AS label").repartition(4).write.mode("overwrite").parquet(path)


def pinned_digests(spark, tmp: str) -> dict:
    """The three datasets' shards: text, numeric and categorical (one hashed) features; the same gzip-compressed;
    a regression on ``amount``."""
    import os

    from etl import job

    _table(spark, os.path.join(tmp, "src"))
    out = {}
    for name, extra in [("plain", {}), ("gzip", {"etl": {"compression": "gzip"}}),
                        ("regression", {"task": {"kind": "regression"},
                                        "source": {"label_column": "amount", "numeric_columns": []}})]:
        data: dict = {"name": "pinned", "workdir": tmp,
                      "source": {"path": os.path.join(tmp, "src"), "format": "parquet",
                                 "numeric_columns": ["amount"], "categorical_columns": ["user", "item"]},
                      "etl": {"output": os.path.join(tmp, name), "max_length": 12, "vocab_size": 200,
                              "max_categories": 40, "categorical_hash_buckets": {"user": 500},
                              "min_shards_per_split": 3, "min_shard_mb": 0.01}}
        for block, values in extra.items():
            data.setdefault(block, {}).update(values)
        cfg = config.from_dict(data, base_dir=tmp)
        job.run(spark, cfg)
        m = manifest.read(cfg.etl.output)
        out[name] = {s: [[sh.path, sh.records, sh.sha256] for sh in split.shards] for s, split in m.splits.items()}
    return out


def test_shards_are_byte_identical_to_the_per_row_writers(spark, tmp_path):
    import os

    with open(os.path.join(os.path.dirname(__file__), "data", "etl_writer_pinned.json")) as fh:
        want = json_mod.load(fh)
    assert pinned_digests(spark, str(tmp_path)) == want


@pytest.mark.parametrize("upper", [False, True])
def test_a_source_column_named_like_the_etls_own_is_refused_in_one_line(spark, tmp_path, upper):
    """The write tasks' columns are prefixed ``__hvd_``: a configured column with that prefix would collide, in
    any case (Spark resolves column names case-insensitively unless spark.sql.caseSensitive)."""
    from etl import sources
    from etl.writer import INTERNAL
    from hvdtrain.core.errors import DataError

    name = f"{INTERNAL.upper() if upper else INTERNAL}n0"
    path = str(tmp_path / "src")
    spark.sql(f"SELECT 'k' AS id, 'a' AS label, 'w' AS text, 1.0 AS {name}").write.parquet(path)
    cfg = config.from_dict({"name": "r", "workdir": str(tmp_path),
                            "source": {"path": path, "format": "parquet", "numeric_columns": [name]},
                            "etl": {"output": str(tmp_path / "out")}}, base_dir=str(tmp_path))
    with pytest.raises(DataError) as err:
        sources.read(spark, cfg)
    assert "\n" not in str(err.value) and f"'{name}'" in str(err.value) and "rename" in str(err.value)
