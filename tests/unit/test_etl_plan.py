"""Pure parts of the ETL: sample generator, split, shard plan, tokenizer."""
import collections

import numpy as np
import pytest

from etl import sample, split, text, writer
from hvdtrain.core.config import SampleConfig


def test_sample_rows_are_deterministic_and_noise_rate_is_as_configured():
    cfg = SampleConfig(rows=4000, label_noise=0.2, seed=3)
    rows = list(sample.generate(cfg))
    assert rows == list(sample.generate(cfg))
    assert rows[1000:1010] == list(sample.generate(cfg, 1000, 1010))  # partitions generate independently
    classes, filler = sample.vocabularies(cfg)
    names = sample.label_names(cfg.num_classes)
    noisy = 0
    for _, doc, label in rows:
        votes = collections.Counter(i for w in doc.split() for i, ws in enumerate(classes) if w in ws)
        if votes:
            noisy += names[votes.most_common(1)[0][0]] != label
    assert noisy / len(rows) == pytest.approx(0.2, abs=0.03)


def test_accuracy_ceiling():
    assert sample.accuracy_ceiling(SampleConfig(label_noise=0.0, class_word_rate=1.0)) == pytest.approx(1.0)
    cfg = SampleConfig(label_noise=0.1, class_word_rate=0.3, min_words=12, max_words=40)
    assert 0.88 < sample.accuracy_ceiling(cfg) < 0.9


def test_split_is_by_key_hash_and_matches_fractions():
    fractions = {"train": 0.8, "validation": 0.1, "test": 0.1}
    keys = [f"doc-{i}" for i in range(20000)]
    got = collections.Counter(split.split_of(k, fractions) for k in keys)
    assert got["train"] / 20000 == pytest.approx(0.8, abs=0.01)
    assert split.split_of("doc-17", fractions) == split.split_of("doc-17", fractions)
    assert split.bucket_bounds(fractions) == [("train", 0, 8000), ("validation", 8000, 9000), ("test", 9000, 10000)]


def test_shard_plan_has_enough_shards_for_ranks_and_size():
    plan = writer.plan_shards({"train": 1000, "validation": 10, "test": 0}, max_length=64, target_mb=64,
                              min_shards=4, min_shard_mb=0)
    assert plan.counts == {"train": 4, "validation": 4, "test": 0}
    big = writer.plan_shards({"train": 2_000_000, "validation": 1, "test": 3}, 128, 64, 2)
    assert big.counts["train"] > 10 and big.counts["validation"] == 1 and big.counts["test"] == 1
    assert [plan.locate(i) for i in range(plan.total)] == [("train", i) for i in range(4)] + \
        [("validation", i) for i in range(4)]


@pytest.mark.parametrize("rows", [1, 50, 2_000, 20_000, 100_000, 400_000, 3_000_000, 50_000_000, 500_000_000])
def test_default_shard_counts_fit_a_large_cluster_and_keep_small_shards_above_a_megabyte(rows: int):
    from hvdtrain.core.config import EtlConfig

    etl = EtlConfig()
    plan = writer.plan_shards({"train": rows, "validation": 0, "test": 0}, etl.max_length, etl.target_shard_mb,
                              etl.min_shards_per_split, etl.min_shard_mb)
    n = plan.counts["train"]
    split_mb = rows * writer.record_bytes(etl.max_length) / 1e6
    assert 1 <= n <= rows
    assert split_mb / n <= etl.target_shard_mb  # no shard above the target size
    if split_mb >= 64 * etl.min_shard_mb:
        assert n >= 64  # a large split spreads over 16 hosts x 4 GPUs
    if n > 1:
        assert split_mb / n >= etl.min_shard_mb * 0.999  # no shard below about 1 MB
    # As many shards as the bounds allow: one more would break the 1 MB floor, or the 64 minimum is met.
    assert n >= 64 or n == int(split_mb // etl.min_shard_mb) or n == 1


def test_vocabulary_is_deterministic_and_tokenizer_pads_to_length():
    opts = text.TextOptions(lowercase=True, max_length=6)
    base = text.base(opts)
    texts = ["the cat sat", "the dog ran far away", "Café ＡＢＣ"] * 20
    counts = collections.Counter(w for t in texts for w in text.words(base, t))
    assert counts["café"] == 20 and counts["abc"] == 20  # lowercased, NFKC-folded
    vocab = text.learn_vocab(counts, vocab_size=60)
    assert vocab == text.learn_vocab(dict(reversed(list(counts.items()))), vocab_size=60)
    assert vocab[:2] == ["[PAD]", "[UNK]"] and "##a" in vocab and "the" in vocab
    tok = text.from_vocab(vocab, opts)
    ids, mask = text.encode(tok, ["the cat", "the dog ran far away again and again", "CAFÉ abc"])
    assert ids.shape == (3, 6) and mask.shape == (3, 6)
    assert mask[0].tolist() == [1, 1, 0, 0, 0, 0] and ids[0, 2] == 0  # [PAD] is id 0
    assert mask[1].sum() == 6  # truncated
    assert text.vocab_lines(tok) == vocab
    # an unseen word of seen characters is spelled from pieces, never lost; one with an unseen character
    # ('z') becomes a single [UNK], as WordPiece does
    assert tok.encode("tacos").tokens == ["t", "##a", "##c", "##o", "##s", "[PAD]"]
    assert tok.encode("zebra").tokens == ["[UNK]"] + ["[PAD]"] * 5
    with pytest.raises(ValueError, match="lacks \\[PAD\\]"):
        text.from_vocab(["a", "b"], opts)
    with pytest.raises(ValueError, match="line 3 is blank"):  # ids are line numbers: no gaps
        text.from_vocab(["[PAD]", "[UNK]", "", "a"], opts)
    with pytest.raises(ValueError, match="'a' on line 4 repeats line 3"):
        text.from_vocab(["[PAD]", "[UNK]", "a", "a"], opts)


CORPUS = ("the runner was running and jumping while the walkers were walking and talking; readers kept reading "
          "the reports, players played and kept playing, the eaters were eating what was eaten").split()


@pytest.mark.parametrize("cap", [10, 20, 40, 60, 100, 400])
def test_learned_wordpiece_fits_the_cap_and_spells_unseen_words_with_learned_pieces(cap: int):
    opts = text.TextOptions(max_length=12)
    words = text.words(text.base(opts), " ".join(CORPUS))
    counts = collections.Counter(words)
    vocab = text.learn_vocab(counts, vocab_size=cap)
    assert len(vocab) <= cap and len(set(vocab)) == len(vocab)  # a hard cap counting specials and characters
    assert vocab[:len(text.SPECIAL_TOKENS)] == text.SPECIAL_TOKENS[:cap]
    if cap < 100:
        return
    assert len(vocab) == cap or len(vocab) > 60  # the merges fill it (or run out of pairs)
    tok = text.from_vocab(vocab, opts)
    for unseen in ("talkers", "replaying", "stalking"):
        assert unseen not in counts
        pieces = [t for t in tok.encode(unseen).tokens if t != text.PAD]
        assert text.UNK not in pieces, (unseen, pieces)
        assert any(len(p.removeprefix("##")) > 1 for p in pieces), (unseen, pieces)  # a learned subword


def test_learned_wordpiece_is_a_function_of_the_counts_alone():
    from hvdtrain.data import wordpiece

    counts = collections.Counter(CORPUS * 3 + ["rare"])
    vocab = text.learn_vocab(counts, 90)
    shuffled = list(counts.items())
    np.random.RandomState(0).shuffle(shuffled)
    assert text.learn_vocab(dict(shuffled), 90) == vocab
    assert text.learn_vocab(dict(sorted(counts.items(), reverse=True)), 90) == vocab
    # every tie between equally frequent pairs or characters is broken the same way: no set/dict order leaks
    ties = {w: 5 for w in ("ab", "ba", "cd", "dc", "abcd", "dcba")}
    assert text.learn_vocab(ties, 24) == text.learn_vocab(dict(reversed(list(ties.items()))), 24)
    # the driver's candidates: the most frequent words, ties by word
    assert wordpiece.top_words({"b": 2, "a": 2, "c": 3, "d": 1}, 3) == [("c", 3), ("a", 2), ("b", 2)]
    # a cap too small for every character keeps the most frequent ones (the rest spell as [UNK])
    assert wordpiece.alphabet({"ab": 3, "bc": 1}, 4) == ["a", "b", "##a", "##b"]


def test_normalization_options():
    raw = "Hello\u0007 ＷＯＲＬＤ"
    on = text.words(text.base(text.TextOptions()), raw)
    off = text.words(text.base(text.TextOptions(lowercase=False, nfkc=False)), raw)
    assert on == ["hello", "world"]
    assert off[0] == "Hello" and off[1] == "ＷＯＲＬＤ"
    left = text.from_vocab(text.SPECIAL_TOKENS + list("abc"), text.TextOptions(max_length=2, truncation="left"))
    assert left.encode("a b c").tokens == ["b", "c"]


def test_tabular_transform_imputes_scales_and_indexes_with_train_stats():
    from etl import tabular

    stats = {"numeric_columns": ["age", "income"], "categorical_columns": ["city"], "impute": "median",
             "impute_value": 0.0, "scale": True,
             "numeric": {"age": {"mean": 40.0, "std": 10.0, "median": 35.0, "count": 9},
                         "income": {"mean": 5.0, "std": 0.0, "median": 5.0, "count": 9}},
             "categories": {"city": ["paris", "rome"]}}
    num, cat = tabular.transform(stats, [(50, 5), (None, None)], [("rome",), ("oslo",)])
    assert num.dtype == np.float32 and cat.dtype == np.int64
    np.testing.assert_allclose(num, [[1.0, 0.0], [-0.5, 0.0]])  # median 35 -> (35-40)/10; zero std -> not divided
    assert cat.tolist() == [[2], [0]]  # unseen city -> the unknown bucket 0
    assert tabular.cardinalities(stats) == [3]
    stats["impute"] = "constant"
    stats["impute_value"] = 40.0
    assert tabular.transform(stats, [(None, 5)], [(None,)])[0][0, 0] == 0.0


def test_spark_conf_keeps_an_hdfs_warehouse_and_a_local_metastore(tmp_path):
    from etl import session
    from hvdtrain.core import config

    cfg = config.from_dict({"name": "w", "workdir": str(tmp_path), "source": {"table": "a.b"},
                            "hive": {"warehouse_dir": "hdfs://nn:8020/warehouse"},
                            "spark": {"conf": {"spark.executor.memory": "2g"}}})
    conf = session.spark_conf(cfg, "local[2]")
    assert conf["spark.sql.warehouse.dir"] == "hdfs://nn:8020/warehouse"
    assert conf["spark.hadoop.javax.jdo.option.ConnectionURL"].startswith(f"jdbc:derby:;databaseName={tmp_path}")
    assert conf["spark.master"] == "local[2]" and conf["spark.executor.memory"] == "2g"
    # shuffle sizes: Spark's adaptive execution unless etl.shuffle_partitions fixes them
    assert conf["spark.sql.adaptive.enabled"] == "true" and "spark.sql.shuffle.partitions" not in conf
    cfg.etl.shuffle_partitions = 400
    assert session.spark_conf(cfg, "local[2]")["spark.sql.shuffle.partitions"] == "400"


def test_a_local_run_logs_spark_to_a_file_and_hides_its_bars_unless_verbose(tmp_path):
    from etl import session
    from hvdtrain.core import config

    cfg = config.from_dict({"name": "w", "workdir": str(tmp_path), "source": {"table": "a.b"}})
    assert session.log_file(cfg.workdir, "local[2]", False, "etl") == str(tmp_path / "logs" / "spark-etl.log")
    assert session.log_file(cfg.workdir, "local[2]", True, "etl") is None  # --verbose: Spark on the console
    assert session.log_file(cfg.workdir, None, False, "etl") is None  # spark-submit started the driver already
    quiet = session.spark_conf(cfg, "local[2]", log_config="/w/log4j2.properties")
    assert quiet["spark.ui.showConsoleProgress"] == "false"
    assert quiet["spark.driver.extraJavaOptions"].split() == [
        "-Dlog4j2.configurationFile=file:/w/log4j2.properties", f"-Dderby.system.home={tmp_path}/hive/metastore"]
    assert session.spark_conf(cfg, "local[2]", progress_bars=True)["spark.ui.showConsoleProgress"] == "true"
    props = session.LOG4J2_PROPERTIES.format(path="/w/spark-etl.log")
    assert "appender.file.fileName = /w/spark-etl.log" in props and "%d{yy/MM/dd HH:mm:ss}" in props


def test_etl_job_takes_overrides_around_its_options():
    from etl import job

    args = job.parse_args(["--config", "c.yaml", "etl.max_length=8", "--overwrite", "etl.vocab_size=50", "-v",
                           "--master", "local[1]", "etl.compression=gzip"])
    assert args.overrides == ["etl.max_length=8", "etl.vocab_size=50", "etl.compression=gzip"]
    assert args.overwrite and args.verbose and args.master == "local[1]"


def test_write_tasks_are_a_few_per_core_and_never_more_than_the_shards():
    from etl import job

    assert job.write_tasks(90, 2) == 2 * job.TASKS_PER_CORE  # the bench's 90 shards on local[2]
    assert job.write_tasks(3, 2) == 3 and job.write_tasks(1, 64) == 1  # one shard a task at most
    assert job.write_tasks(5000, 200) == 200 * job.TASKS_PER_CORE  # a cluster's cores, not its shards
    assert job.write_tasks(0, 2) == 1 and job.write_tasks(7, 0) == min(7, job.TASKS_PER_CORE)


@pytest.mark.parametrize("prior", [None, "true"])
def test_the_write_tasks_tokenizer_setting_is_restored_however_the_task_ends(monkeypatch, prior):
    import os

    if prior is None:
        monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    else:
        monkeypatch.setenv("TOKENIZERS_PARALLELISM", prior)

    def task(fail: bool):  # a write task's generator, as Spark drives it
        with writer.one_thread_tokenizer():
            yield os.environ.get("TOKENIZERS_PARALLELISM")
            if fail:
                raise RuntimeError("task failed")
            yield "second"

    assert list(task(False)) == ["false", "second"] and os.environ.get("TOKENIZERS_PARALLELISM") == prior
    failing = task(True)
    assert next(failing) == "false"
    with pytest.raises(RuntimeError):
        next(failing)
    assert os.environ.get("TOKENIZERS_PARALLELISM") == prior
    stopped = task(False)  # Spark stops reading (a failed stage): the generator is closed
    next(stopped)
    stopped.close()
    assert os.environ.get("TOKENIZERS_PARALLELISM") == prior
