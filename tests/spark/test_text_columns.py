"""Several text columns (source.text_columns): the ETL learns one vocabulary over all of them and writes each row's
texts as one input_ids sequence, [SEP] between them; scoring encodes the same rows to the same ids."""
from __future__ import annotations

import numpy as np
import pytest

from hvdtrain import score
from hvdtrain.core import config
from hvdtrain.data import features, manifest
from tests.support.spark_jvm import module_session

pytestmark = pytest.mark.spark

_WORDS = ["alpha", "beta", "gamma", "delta", "omega", "kappa"]


def _rows(n: int = 60) -> list[tuple]:
    rng = np.random.default_rng(3)
    out = []
    for i in range(n):
        title = " ".join(rng.choice(_WORDS[:3], 2)) if i % 7 else None  # some rows have no title
        body = " ".join(rng.choice(_WORDS[3:] + ["zebra"] * (i % 2), 12))  # long: shares the budget
        out.append((f"k{i:03d}", title, body, ["a", "b"][i % 2]))
    return out


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tmp_path_factory.mktemp("text_columns")


@pytest.fixture(scope="module")
def cfg(base):
    return config.from_dict({"name": "texts", "workdir": str(base),
                             "source": {"path": str(base / "in"), "format": "parquet",
                                        "text_columns": ["title", "body"]},
                             "etl": {"output": str(base / "data"), "max_length": 12, "vocab_size": 60,
                                     "min_shards_per_split": 1, "min_shard_mb": 0,
                                     "splits": {"train": 0.8, "validation": 0.1, "test": 0.1}}},
                            base_dir=str(base))


@pytest.fixture(scope="module")
def spark(cfg):
    yield from module_session(cfg)


def test_two_text_columns_etl_and_scoring_give_the_same_ids(spark, cfg) -> None:
    from etl import job
    from tests.spark.test_etl_spark import read_back

    assert cfg.source.text_column == "title"  # the first of text_columns
    source = spark.createDataFrame(_rows(), "id string, title string, body string, label string")
    source.write.parquet(cfg.source.path)
    job.run(spark, cfg)
    m = manifest.read(cfg.etl.output)
    text = m.preprocessing["text"]
    assert text["columns"] == ["title", "body"] and text["separator"] == "[SEP]"
    vocab = open(f"{cfg.etl.output}/vocab.txt", encoding="utf-8").read().splitlines()
    assert {"alpha", "omega", "zebra"} <= set(vocab)  # learned over both columns
    tok_json = open(f"{cfg.etl.output}/tokenizer.json", encoding="utf-8").read()
    sep = vocab.index("[SEP]")
    written = {}
    for split in m.splits:
        records = read_back(m, split)
        for k, ids in zip(records["key"], records["input_ids"]):
            written[k.decode() if isinstance(k, bytes) else k] = ids
    assert len(written) == 60 and all((ids == sep).sum() == 1 for ids in written.values())

    bundle = score.ModelBundle(b"", {"labels": ["a", "b"], "preprocessing": m.preprocessing}, tok_json, "test")
    spec = score.make_spec(bundle, score.ScoreOptions(key_column="id"))
    frame = source.toPandas()
    reasons, numeric = score.reject_reasons(frame, spec)
    assert reasons == [None] * 60
    ids = score.encode_rows(frame, spec, features.FeatureEncoder(tok_json, None), numeric)["input_ids"]
    for key, row in zip(frame["id"], ids):
        np.testing.assert_array_equal(row, written[key], err_msg=key)
    assert written["k000"][0] == sep and written["k001"][0] != sep  # k000 has no title: [SEP] comes first


def test_shares_give_short_columns_what_they_have() -> None:
    assert features.shares([3, 100], 10) == [3, 7]
    assert features.shares([100, 100], 9) == [4, 5]
    assert features.shares([2, 3], 10) == [2, 3]
    assert features.shares([0, 0, 50], 11) == [0, 0, 11]


def test_a_text_holding_the_join_character_still_splits_into_its_columns() -> None:
    tok = features.from_vocab(features.learn_vocab({"alpha": 3, "beta": 2}, 40), features.TextOptions(max_length=8))
    plain = features.encode_columns(tok, [("alpha", "beta")])
    np.testing.assert_array_equal(features.encode_columns(tok, [("al\x1fpha", "beta")])[0], plain[0])
