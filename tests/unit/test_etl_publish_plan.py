"""Pure parts of publishing: row accounting per stage, and the publish plan from typed shard results."""
import dataclasses
import json

import pytest

from etl import accounting, faults, publish, writer
from etl.accounting import RowCounts
from etl.fitted import Fitted
from hvdtrain.core import config
from hvdtrain.core.errors import ConfigError, DataError
from hvdtrain.data import manifest


def counts(**over) -> RowCounts:
    base = dict(rows_in=100, rejected={"text_null": 3, "key_null": 2}, before_dedup=95, after_dedup=93,
                label_unknown=1, by_split={"train": 80, "validation": 7, "test": 5},
                written={"train": 80, "validation": 7, "test": 5})
    base.update(over)
    return RowCounts(**base)


def test_consistent_counts_pass_and_add_up():
    c = counts()
    accounting.check(c)
    assert (c.duplicates, c.rejected_total, c.rows_written) == (2, 6, 92)
    assert c.rows_in == c.rows_written + c.rejected_total + c.duplicates
    assert c.by_rule == {"text_null": 3, "key_null": 2, "label_unknown": 1}


@pytest.mark.parametrize("over, stage", [
    (dict(before_dedup=94, after_dedup=92, by_split={"train": 79, "validation": 7, "test": 5},
          written={"train": 79, "validation": 7, "test": 5}), "validate"),   # a row lost before dedup
    (dict(by_split={"train": 79, "validation": 7, "test": 5},
          written={"train": 79, "validation": 7, "test": 5}), "split"),      # lost between dedup and split
    (dict(written={"train": 80, "validation": 6, "test": 5}), r"write \(validation\)"),  # lost by a writer
    (dict(written={"train": 81, "validation": 7, "test": 5}), r"write \(train\)"),  # a record written twice
])
def test_a_row_lost_or_gained_anywhere_names_the_stage(over, stage):
    with pytest.raises(DataError, match=rf"row accounting failed at stage '{stage}'.*nothing was published"):
        accounting.check(counts(**over))


def test_fault_hooks_are_off_by_default_and_parse_strictly(monkeypatch):
    monkeypatch.delenv(faults.ENV, raising=False)
    assert faults.from_env() is None
    monkeypatch.setenv(faults.ENV, "drop_row:write:k1")
    assert faults.from_env().drops("write") == "k1" and faults.from_env().drops("split") is None
    once = faults.parse("fail_write_once:3")
    assert once.fails_write(3, 0) and not once.fails_write(3, 1) and not once.fails_write(2, 0)
    assert faults.parse("write_twice:2").writes_twice(2) and not faults.parse("write_twice:2").writes_twice(1)
    with pytest.raises(ConfigError, match="HVDTRAIN_ETL_FAULT is not a fault hook.*unset it"):
        faults.parse("drop_row:nowhere:k1")


def result(partition, split, index, records, label_counts):
    return writer.ShardResult(partition=partition, split=split, index=index, staged=f"/out/_staging/r/{partition}.tf",
                              records=records, bytes=10 * records, sha256=f"sha{partition}", class_counts=label_counts)


def test_publish_plan_moves_successful_attempts_and_builds_the_manifest():
    cfg = config.from_dict({"name": "p", "workdir": "/w", "source": {"table": "db.t"},
                            "etl": {"output": "/out", "max_length": 8}}, base_dir="/w")
    shards = writer.ShardPlan({"train": 2, "validation": 1, "test": 1})
    results = [result(3, "test", 0, 5, {0: 5}), result(0, "train", 0, 41, {0: 40, 1: 1}),
               result(2, "validation", 0, 7, {1: 7}), result(1, "train", 1, 39, {1: 39})]
    fitted = Fitted(labels=["neg", "pos"], text_specs=manifest.text_features(8, 4),
                            vocab=["[PAD]", "[UNK]", "a", "b"], tokenizer_json="{}")
    facts = publish.RunFacts(staging="/out/_staging/r", stage_seconds={"read": 1.0}, created_at="T", versions={})
    plan = publish.plan_publish(cfg, shards, results, fitted, counts(), facts)
    assert plan.moves == [("/out/_staging/r/0.tf", "/out/train/part-00000-of-00002.tfrecord"),
                          ("/out/_staging/r/1.tf", "/out/train/part-00001-of-00002.tfrecord"),
                          ("/out/_staging/r/2.tf", "/out/validation/part-00000-of-00001.tfrecord"),
                          ("/out/_staging/r/3.tf", "/out/test/part-00000-of-00001.tfrecord")]
    assert plan.side_moves == [("/out/_staging/r/rejects", "/out/rejects")] and plan.clear_existing is False
    assert plan.dirs == ["/out/test", "/out/train", "/out/validation"]
    m = plan.manifest
    assert m.split("train").class_counts() == {"neg": 40, "pos": 40} and m.split("test").records == 5
    assert m.source["rows_in"] == 100 and m.source["duplicates_dropped"] == 2 and m.vocab["size"] == 4
    files = dict(plan.files)
    assert files["/out/vocab.txt"] == b"[PAD]\n[UNK]\na\nb\n"
    report = json.loads(dict(plan.side_files)["/out/etl_report.json"])
    assert report["rows_by_split"] == {"train": 80, "validation": 7, "test": 5} and report["rows_rejected"] == 6
    with pytest.raises(DataError, match=r"stage 'write \(train\)'"):  # a lost record: no plan, nothing moves
        publish.plan_publish(cfg, shards, [result(0, "train", 0, 40, {0: 40})] + results[1:], fitted, counts(), facts)


def test_replacing_a_dataset_plans_the_new_one_in_a_version_folder_the_manifest_names():
    """Over a published dataset (etl.overwrite), nothing of the new one lands on the old one's paths."""
    cfg = config.from_dict({"name": "p", "workdir": "/w", "source": {"table": "db.t"},
                            "etl": {"output": "/out", "max_length": 8, "overwrite": True}}, base_dir="/w")
    shards = writer.ShardPlan({"train": 1, "validation": 1, "test": 1})
    results = [result(0, "train", 0, 80, {0: 80}), result(1, "validation", 0, 7, {1: 7}),
               result(2, "test", 0, 5, {0: 5})]
    fitted = Fitted(labels=["neg", "pos"], text_specs=manifest.text_features(8, 4),
                            vocab=["[PAD]", "[UNK]", "a", "b"], tokenizer_json="{}")
    facts = publish.RunFacts(staging="/out/_staging/r", stage_seconds={}, created_at="T", versions={},
                             generation="v-r")
    plan = publish.plan_publish(cfg, shards, results, fitted, counts(), facts)
    assert [dst for _, dst in plan.moves] == ["/out/v-r/train/part-00000-of-00001.tfrecord",
                                              "/out/v-r/validation/part-00000-of-00001.tfrecord",
                                              "/out/v-r/test/part-00000-of-00001.tfrecord"]
    assert [uri for uri, _ in plan.files] == ["/out/v-r/vocab.txt", "/out/v-r/tokenizer.json"]
    assert plan.manifest.split("train").shards[0].path == "v-r/train/part-00000-of-00001.tfrecord"
    assert (plan.manifest.vocab["path"], plan.manifest.vocab["tokenizer"]) == ("v-r/vocab.txt", "v-r/tokenizer.json")
    assert plan.clear_existing is False  # the old dataset stays until the manifest is replaced
    assert plan.keep == {"manifest.json", "_staging", "v-r", "rejects", "etl_report.json"}
    fresh = publish.plan_publish(cfg, shards, results, fitted, counts(),
                                 dataclasses.replace(facts, generation=""))
    assert fresh.clear_existing and fresh.moves[0][1] == "/out/train/part-00000-of-00001.tfrecord"
