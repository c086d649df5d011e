"""``etl --overwrite`` replaces only an hvdtrain dataset, and deletes only what hvdtrain wrote (issue #28, item 1)."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from etl import job as etl_job
from etl import publish, writer
from etl.accounting import RowCounts
from hvdtrain.core import config
from hvdtrain.core.errors import DataError
from hvdtrain.data import manifest
from hvdtrain.hadoop import fs, ledger

SHARDS = writer.ShardPlan({"train": 1, "validation": 1, "test": 1})
ROWS = {"train": 8, "validation": 1, "test": 1}


def job(out: Path, tmp: Path, overwrite: bool = True) -> config.JobConfig:
    return config.from_dict({"name": "ow", "workdir": str(tmp), "source": {"table": "db.t"},
                             "etl": {"output": str(out), "max_length": 8, "overwrite": overwrite}},
                            base_dir=str(tmp))


def stage_shards(out: Path, tag: str) -> list[writer.ShardResult]:
    """One staged shard per split of dataset ``tag`` under ``out/_staging/<tag>``, as the write tasks report them."""
    staging = fs.join(str(out), "_staging", tag)
    results = []
    for i, split in enumerate(("train", "validation", "test")):
        data = f"{tag}{i}".encode() * 10
        staged = fs.join(staging, f"{i}.tf")
        fs.write_bytes_atomic(staged, data)
        results.append(writer.ShardResult(partition=i, split=split, index=0, staged=staged, records=ROWS[split],
                                          bytes=len(data), sha256=hashlib.sha256(data).hexdigest(),
                                          class_counts={0: ROWS[split]}))
    return results


def plan(out: Path, tag: str, tmp: Path) -> publish.PublishPlan:
    """Stage one shard per split for dataset ``tag`` and plan its publish (check_output first, as etl.job.run)."""
    cfg = job(out, tmp)
    replacing = etl_job.check_output(cfg.etl)
    staging = fs.join(str(out), "_staging", tag)
    results = stage_shards(out, tag)
    counts = RowCounts(rows_in=10, rejected={}, before_dedup=10, after_dedup=10, label_unknown=0,
                       by_split=dict(ROWS), written=dict(ROWS))
    fitted = publish.Fitted(labels=["a"], text_specs=manifest.text_features(8, 4), vocab=["[PAD]", "[UNK]"],
                            tokenizer_json="{}")
    facts = publish.RunFacts(staging=staging, stage_seconds={}, created_at=tag, versions={},
                             generation=f"v-{tag}" if replacing else "")
    return publish.plan_publish(cfg, SHARDS, results, fitted, counts, facts)


def test_overwrite_refuses_a_folder_holding_anything_but_an_hvdtrain_dataset(tmp_path):
    home = tmp_path / "alice"  # etl.output=/user/alice
    home.mkdir()
    (home / "thesis.tex").write_text("years of work")
    (home / "train").mkdir()  # a name hvdtrain also writes: the foreign file alone decides
    with pytest.raises(DataError) as err:
        etl_job.check_output(job(home, tmp_path, overwrite=True).etl)
    message = str(err.value)
    assert "thesis.tex" in message and str(home) in message and "--overwrite to" not in message
    assert (home / "thesis.tex").read_text() == "years of work"


def test_overwrite_replaces_an_unfinished_hvdtrain_etl_and_keeps_names_it_did_not_write(tmp_path):
    out = tmp_path / "ds"
    (out / "train").mkdir(parents=True)  # a first ETL killed before its manifest, after its ledger (#54)
    (out / "train" / "part-00000-of-00001.tfrecord").write_bytes(b"half")
    (out / "vocab.txt").write_text("old")
    ledger.write(str(out), ledger.Ledger("hvdtrain etl", (ledger.exact("train/part-00000-of-00001.tfrecord"),
                                                          ledger.exact("vocab.txt"))))
    with pytest.raises(DataError, match="unfinished hvdtrain ETL.*--overwrite"):
        etl_job.check_output(job(out, tmp_path, overwrite=False).etl)
    publish.act(plan(out, "A", tmp_path))
    assert manifest.read(str(out)).created_at == "A"
    replacing = plan(out, "B", tmp_path)
    (out / "notes.md").write_text("mine")  # appears between the check and the publish: refused, never deleted
    with pytest.raises(DataError, match=r"holds files hvdtrain did not write \(notes.md\)"):
        publish.act(replacing)
    assert manifest.read(str(out)).created_at == "A" and (out / "notes.md").read_text() == "mine"
    (out / "notes.md").unlink()
    publish.act(plan(out, "B", tmp_path))
    assert manifest.read(str(out)).created_at == "B"
    assert not (out / "train").exists()  # the replaced dataset's own files are gone
