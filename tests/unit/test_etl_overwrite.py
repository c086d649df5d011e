"""Publishing over a dataset (``etl.overwrite``): the old one stays whole and readable until the new one is complete.

The publish step (etl/publish.py: plan_publish + act, as etl.job.run calls them) runs
on staged files over three filesystems: the local disk, ``faulty://`` (the local disk
with injected failures, tests/support/faulty_fs.py) and ``webhdfs://`` (tests/support/webhdfs_server.py:
the NameNode/DataNode REST protocol over a local folder, with failures and lost
answers). No Spark: the shards are staged as the write tasks would leave them.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Callable

import pytest

from etl import job as etl_job
from etl import publish, writer
from etl.accounting import RowCounts
from etl.fitted import Fitted
from hvdtrain.core import config
from hvdtrain.data import manifest
from hvdtrain.hadoop import fs, ledger
from tests.support import faulty_fs

SHARDS = writer.ShardPlan({"train": 2, "validation": 1, "test": 1})
ROWS = {"train": 80, "validation": 10, "test": 10}


def shard_bytes(tag: str, i: int) -> bytes:
    return f"dataset {tag} shard {i} ".encode() * (50 + 7 * i)


def publish_dataset(out: str, tag: str, tmp: Path, then: Callable[[], None] = lambda: None) -> dict:
    """Stage four shards and a rejects folder for dataset ``tag`` under ``out/_staging/<tag>``, call ``then``
    (to arm a fault), then publish them the way etl.job.run does (a version folder when a dataset is there)."""
    cfg = config.from_dict({"name": "ow", "workdir": str(tmp), "source": {"table": "db.t"},
                            "etl": {"output": out, "max_length": 8, "overwrite": True}}, base_dir=str(tmp))
    replacing = etl_job.check_output(cfg.etl)
    staging = fs.join(out, "_staging", tag)
    results = []
    for i, (split, index) in enumerate([("train", 0), ("train", 1), ("validation", 0), ("test", 0)]):
        data = shard_bytes(tag, i)
        staged = fs.join(staging, f"{i}.tf")
        fs.write_bytes_atomic(staged, data)
        records = ROWS[split] // SHARDS.counts[split]
        results.append(writer.ShardResult(partition=i, split=split, index=index, staged=staged, records=records,
                                          bytes=len(data), sha256=hashlib.sha256(data).hexdigest(),
                                          class_counts={0: records}))
    fs.write_bytes_atomic(fs.join(staging, "rejects", "part-0.parquet"), f"rejects of {tag}".encode())
    counts = RowCounts(rows_in=103, rejected={"text_null": 3}, before_dedup=100, after_dedup=100, label_unknown=0,
                       by_split=dict(ROWS), written=dict(ROWS))
    fitted = Fitted(labels=["a", "b"], text_specs=manifest.text_features(8, 4),
                            vocab=["[PAD]", "[UNK]", tag, "w"], tokenizer_json=f'{{"tag": "{tag}"}}')
    facts = publish.RunFacts(staging=staging, stage_seconds={}, created_at=tag, versions={},
                             generation=f"v-{tag}" if replacing else "")
    then()
    report = publish.act(publish.plan_publish(cfg, SHARDS, results, fitted, counts, facts))
    fs.delete(fs.join(out, "_staging"))
    return report


def assert_whole(out: str, tag: str, tmp: Path) -> manifest.Manifest:
    """The manifest is valid, names dataset ``tag``, and every shard verifies (size and SHA-256, as staging does)."""
    m = manifest.read(out)
    assert m.created_at == tag
    i = 0
    for split in ("train", "validation", "test"):
        for shard in m.split(split).shards:
            local = tmp / f"check-{i}"
            fs.copy_to_local(m.shard_uri(shard), str(local), sha256=shard.sha256, size=shard.bytes)
            assert local.read_bytes() == shard_bytes(tag, i)
            i += 1
    assert i == 4
    assert fs.read_bytes(fs.join(m.root, m.vocab["path"])).decode().splitlines()[2] == tag
    assert tag in fs.read_bytes(fs.join(m.root, m.vocab["tokenizer"])).decode()
    return m


@pytest.fixture
def no_backoff(monkeypatch):
    """Injected failures are permanent: fail at once instead of after the retry policy's sleeps."""
    real = fs.with_retries
    monkeypatch.setattr(fs, "with_retries", lambda fn, what, *a, **k: real(fn, what, fs.RetryPolicy(attempts=1)))


def test_a_publish_failing_midway_leaves_the_old_dataset_whole_then_a_clean_one_replaces_it(tmp_path, no_backoff):
    out = tmp_path / "ds"
    publish_dataset(str(out), "A", tmp_path)
    assert_whole(str(out), "A", tmp_path)
    handler = faulty_fs.install(faulty_fs.FaultyHandler(fail=(("move", "v-B/train/part-00001"),),
                                                        error=OSError(5, "Input/output error (injected)")))
    try:
        with pytest.raises(OSError, match="injected"):
            publish_dataset(f"faulty://{out}", "B", tmp_path)  # the second shard's move fails
        assert any(op == "move" and "v-B/train/part-00000" in p for op, p in handler.calls)  # it was midway
        handler.fail = (("move", "manifest.json.next"),)  # killed just before the manifest is replaced
        with pytest.raises(OSError, match="injected"):
            publish_dataset(f"faulty://{out}", "B", tmp_path)
    finally:
        faulty_fs.uninstall()
    assert_whole(str(out), "A", tmp_path)
    assert (out / "rejects" / "part-0.parquet").read_text() == "rejects of A"
    assert not (out / "v-B").exists()  # the failed run's half was removed
    (out / "v-dead").mkdir()  # what a run killed with SIGKILL leaves behind, recorded in its ledger (#54)
    (out / "v-dead" / "junk").write_bytes(b"x")
    ledger.write(str(out), ledger.read(str(out)).adding(ledger.tree("v-dead")))
    publish_dataset(str(out), "B", tmp_path)
    assert_whole(str(out), "B", tmp_path)
    assert sorted(os.listdir(out)) == [ledger.NAME, "etl_report.json", "manifest.json", "rejects",
                                       "v-B"]  # A and v-dead gone
    assert (out / "rejects" / "part-0.parquet").read_text() == "rejects of B"
    publish_dataset(str(out), "C", tmp_path)  # a version replaces a version
    assert_whole(str(out), "C", tmp_path)
    assert sorted(os.listdir(out)) == [ledger.NAME, "etl_report.json", "manifest.json", "rejects", "v-C"]


def test_a_reader_polling_during_the_swap_always_finds_a_manifest(tmp_path, monkeypatch):
    """The reader looks after every change the publish makes to the local disk (each rename, delete, mkdir):
    every state in between two steps is one a concurrent reader could meet."""
    import pyarrow.fs as pafs

    out = str(tmp_path / "ds")
    publish_dataset(out, "A", tmp_path)
    seen: list[str] = []

    class Observed(pafs.LocalFileSystem):
        def move(self, src, dst):
            super().move(src, dst)
            seen.append(manifest.read(out).created_at)  # raises DataError if a reader found no manifest

        def delete_file(self, path):
            super().delete_file(path)
            seen.append(manifest.read(out).created_at)

        def delete_dir(self, path):
            super().delete_dir(path)
            seen.append(manifest.read(out).created_at)

    monkeypatch.setattr(pafs, "LocalFileSystem", Observed)
    for tag in ("B", "C"):
        publish_dataset(out, tag, tmp_path)
    switches = [(a, b) for a, b in zip(seen, seen[1:]) if a != b]
    assert switches == [("A", "B"), ("B", "C")] and len(seen) > 30, seen  # old until one step, then new
    assert_whole(out, "C", tmp_path)


def test_where_rename_cannot_replace_a_reader_takes_the_complete_next_manifest(tmp_path):
    out = tmp_path / "ds"
    publish_dataset(str(out), "A", tmp_path)
    os.rename(out / "manifest.json", out / "manifest.json.next")  # libhdfs: deleted, the rename is next
    assert_whole(str(out), "A", tmp_path)
    with pytest.raises(Exception, match="already holds a dataset"):  # still a published dataset
        etl_job.check_output(config.from_dict({"source": {"table": "a.b"}, "etl": {"output": str(out)}}).etl)


@pytest.mark.slow
def test_webhdfs_publish_failing_midway_leaves_the_old_dataset_whole(server, tmp_path, no_backoff):
    out = server.uri("/warehouse/ds")
    publish_dataset(out, "A", tmp_path)
    with pytest.raises(PermissionError, match="Permission denied"):  # the third shard's move: AccessControlException
        publish_dataset(out, "B", tmp_path, then=lambda: server.deny("/warehouse/ds/_staging/B/2.tf"))
    renamed = [p for method, op, p in server.requests if op == "RENAME" and p.endswith(".tf") and "/B/" in p]
    assert renamed == ["/warehouse/ds/_staging/B/0.tf", "/warehouse/ds/_staging/B/1.tf",
                       "/warehouse/ds/_staging/B/2.tf"]  # midway: two shards were moved, the third was refused
    server.denied.clear()
    fs.delete(fs.join(out, "_staging"))
    assert_whole(out, "A", tmp_path)
    assert fs.listdir(out) == [ledger.NAME, "etl_report.json", "manifest.json", "rejects", "test",
                               "tokenizer.json", "train", "validation", "vocab.txt"]  # A's files, no v-B


@pytest.mark.slow
def test_webhdfs_renames_whose_answers_are_lost_count_as_done(server, tmp_path, caplog):
    out = server.uri("/warehouse/ds")
    publish_dataset(out, "A", tmp_path)
    server.lose_response("RENAME", 1000)  # every rename happens; none is answered
    publish_dataset(out, "B", tmp_path)
    assert_whole(out, "B", tmp_path)
    assert server.lost["RENAME"] < 1000 - 8  # shards, vocabulary, manifest and report were all renamed unanswered
    assert "counted as done" in caplog.text
    # The manifest went over the old one in one rename2 (OVERWRITE), never deleted first.
    manifest_ops = [(op, p) for _, op, p in server.requests if p.endswith("/manifest.json")]
    assert ("DELETE", "/warehouse/ds/manifest.json") not in manifest_ops
    assert sorted(fs.listdir(out)) == [ledger.NAME, "etl_report.json", "manifest.json", "rejects", "v-B"]
