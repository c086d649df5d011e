"""Checkpoint policies (pure), atomic publishing and verification, with injected storage faults."""
from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from hvdtrain.core.errors import DataError, StorageError
from hvdtrain.hadoop import fs
from hvdtrain.training import checkpoint as ck
from tests.support import faulty_fs


def info(step, ok=True, **metrics):
    return ck.CheckpointInfo(ck.checkpoint_name(step), f"/x/{step}", step, metrics=metrics,
                             status="ok" if ok else "uncommitted")


def test_save_due_every_n_steps_and_at_epoch_ends():
    due = [s for s in range(1, 31) if ck.save_due(s, steps_per_epoch=10, every_steps=4, at_epoch_end=True)]
    assert due == [4, 8, 10, 12, 16, 20, 24, 28, 30]
    assert [s for s in range(1, 31) if ck.save_due(s, 10, 0, True)] == [10, 20, 30]
    assert not any(ck.save_due(s, 10, 0, False) for s in range(1, 31))


def test_retention_keeps_newest_and_best_and_drops_broken_older_ones():
    infos = [info(10, acc=0.5), info(20, acc=0.9), info(30, acc=0.7), info(35, ok=False), info(40, acc=0.6),
             info(50, ok=False)]
    d = ck.retention(infos, keep_last=2, keep_best=1, metric="acc", mode="max")
    # newest two valid (30, 40), best (20), and the uncommitted one newer than all valid (maybe in flight)
    assert d.keep == ["ckpt-0000000020", "ckpt-0000000030", "ckpt-0000000040", "ckpt-0000000050"]
    assert d.delete == ["ckpt-0000000010", "ckpt-0000000035"]
    low = ck.retention(infos, keep_last=1, keep_best=1, metric="acc", mode="min")
    assert "ckpt-0000000010" in low.keep


def state(seed=0):
    rng = np.random.default_rng(seed)
    return {"w": rng.normal(size=(4, 3)).astype(np.float32), "step": np.array(7, np.int64)}


def test_publish_order_is_data_then_checksums_then_commit(tmp_path):
    handler = faulty_fs.install(faulty_fs.FaultyHandler())
    try:
        root = f"faulty://{tmp_path}/ckpts"
        w = ck.CheckpointWriter(root, background=True)
        w.save(7, state(), {"epoch": 1, "metrics": {"validation_accuracy": 0.8}})
        w.wait()
    finally:
        faulty_fs.uninstall()
    opened = [os.path.basename(p) for op, p in handler.calls if op == "write"]
    data = [n for n in opened if n in ck.DATA_FILES]
    assert opened.index(ck.CHECKSUMS) > max(opened.index(n) for n in data)
    assert opened[-1].startswith(ck.COMMIT)  # written atomically: COMMIT.tmp-xxxx, renamed last
    _, arrays, meta = ck.restore_latest(f"{tmp_path}/ckpts")
    np.testing.assert_array_equal(arrays["w"], state()["w"])
    assert meta["step"] == 7 and meta["metrics"]["validation_accuracy"] == 0.8


def test_invalid_checkpoints_are_skipped_with_a_warning_naming_them(tmp_path, caplog):
    root = str(tmp_path / "ckpts")
    w = ck.CheckpointWriter(root, keep_last=10, background=False)
    for step in (1, 2, 3):
        w.save(step, state(step), {"epoch": 0})
    os.remove(os.path.join(root, ck.checkpoint_name(3), ck.COMMIT))  # publish cut before the marker
    with open(os.path.join(root, ck.checkpoint_name(2), ck.STATE), "r+b") as fh:  # bit rot
        fh.seek(100)
        fh.write(b"\x00\x01\x02")
    with caplog.at_level(logging.WARNING):
        best = ck.latest_valid(root)
        restored, arrays, _ = ck.restore_latest(root)
    assert best.step == 1 and restored.step == 1
    np.testing.assert_array_equal(arrays["w"], state(1)["w"])
    assert "ckpt-0000000003: uncommitted" in caplog.text and "ckpt-0000000002: corrupt" in caplog.text
    statuses = {i.name: i.status for i in ck.scan(root)}
    assert statuses == {"ckpt-0000000001": "ok", "ckpt-0000000002": "corrupt", "ckpt-0000000003": "uncommitted"}


def test_transient_storage_faults_are_retried(tmp_path, monkeypatch):
    monkeypatch.setattr(fs, "with_retries", _fast_retries(fs.with_retries))
    faulty_fs.install(faulty_fs.FaultyHandler(fail_first=3))
    try:
        ck.CheckpointWriter(f"faulty://{tmp_path}/c", background=False).save(5, state(), {"epoch": 1})
    finally:
        faulty_fs.uninstall()
    assert ck.latest_valid(str(tmp_path / "c")).step == 5


def test_persistent_storage_faults_fail_with_the_path_and_last_error(tmp_path, monkeypatch):
    monkeypatch.setattr(fs, "with_retries", _fast_retries(fs.with_retries))
    faulty_fs.install(faulty_fs.FaultyHandler(fail_first=10_000))
    try:
        w = ck.CheckpointWriter(f"faulty://{tmp_path}/c", background=True)
        w.save(5, state(), {"epoch": 1})
        with pytest.raises(DataError, match=r"publishing a checkpoint under faulty://.*/c failed: .*"
                                            r"failed after 5 attempts; last error: connection reset"):
            w.wait()
    finally:
        faulty_fs.uninstall()


def test_truncated_write_is_caught_and_never_committed(tmp_path):
    faulty_fs.install(faulty_fs.FaultyHandler(truncate=(ck.STATE,)))
    try:
        w = ck.CheckpointWriter(f"faulty://{tmp_path}/c", background=False)
        with pytest.raises(DataError, match="wrote .* bytes but the file has"):
            w.save(5, state(), {"epoch": 1})
    finally:
        faulty_fs.uninstall()
    assert ck.latest_valid(str(tmp_path / "c")) is None
    assert [i.status for i in ck.scan(str(tmp_path / "c"))] == ["uncommitted"]


def test_a_committed_checkpoint_the_storage_cannot_read_stops_the_resume(tmp_path, monkeypatch):
    """Never silently go back in time: only provably bad checkpoints are skipped."""
    monkeypatch.setattr(fs, "with_retries", _fast_retries(fs.with_retries))
    root = tmp_path / "c"
    w = ck.CheckpointWriter(str(root), keep_last=10, background=False)
    for step in (1, 2):
        w.save(step, state(step), {"epoch": 0})
    faulty_fs.install(faulty_fs.FaultyHandler(fail=(("read", f"{ck.checkpoint_name(2)}/{ck.STATE}"),)))
    try:
        with pytest.raises(StorageError, match=r"checkpoint faulty://.*ckpt-0000000002 could not be read .*"
                                               r"failed after 5 attempts.*go back in time.*move ckpt-0000000002 out"):
            ck.restore_latest(f"faulty://{root}")
        with pytest.raises(StorageError, match="ckpt-0000000002 could not be read"):
            ck.latest_valid(f"faulty://{root}")
    finally:
        faulty_fs.uninstall()
    assert ck.restore_latest(str(root))[0].step == 2  # the storage is back: the same, newest checkpoint


def test_a_failed_prune_after_a_good_publish_is_a_warning(tmp_path, caplog):
    faulty_fs.install(faulty_fs.FaultyHandler(fail=(("rmdir", ck.checkpoint_name(1)),),
                                              error=PermissionError(13, "Permission denied (injected)")))
    try:
        w = ck.CheckpointWriter(f"faulty://{tmp_path}/c", keep_last=1, keep_best=0, background=True)
        with caplog.at_level(logging.WARNING):
            for step in (1, 2):
                w.save(step, state(step), {"epoch": step})
            w.wait()  # raises nothing: the new checkpoint is safe
    finally:
        faulty_fs.uninstall()
    assert [i.step for i in ck.scan(str(tmp_path / "c"))] == [1, 2] and w.prune_failures == 1
    assert "ckpt-0000000002 is published, but pruning older checkpoints" in caplog.text
    assert "Permission denied (injected)" in caplog.text


def test_writer_prunes_to_retention(tmp_path):
    root = str(tmp_path / "c")
    w = ck.CheckpointWriter(root, keep_last=2, keep_best=1, metric="acc", background=True)
    for step, acc in [(1, 0.9), (2, 0.1), (3, 0.2), (4, 0.3)]:
        w.save(step, state(step), {"epoch": step, "metrics": {"acc": acc}})
    w.wait()
    assert [i.step for i in ck.scan(root)] == [1, 3, 4]


def _fast_retries(real):
    def fast(fn, what, policy=fs.RetryPolicy(), sleep=None, rng=None):
        return real(fn, what, policy, sleep=lambda s: None, rng=rng)
    return fast


def test_cli_lists_and_verifies(tmp_path, capsys):
    from hvdtrain import cli

    root = str(tmp_path / "c")
    w = ck.CheckpointWriter(root, keep_last=5, background=False)
    w.save(10, state(), {"epoch": 1, "metrics": {"validation_accuracy": 0.75}})
    w.save(20, state(1), {"epoch": 2, "metrics": {"validation_accuracy": 0.8}})
    assert cli.main(["checkpoints", "list", root]) == 0
    out = capsys.readouterr().out
    assert "ckpt-0000000010" in out and "0.7500" in out and out.count(" ok") == 2
    with open(os.path.join(root, ck.checkpoint_name(20), ck.META), "ab") as fh:
        fh.write(b" ")
    assert cli.main(["checkpoints", "verify", root]) == 3  # a data error
    assert "corrupt (meta.json does not match its checksum)" in capsys.readouterr().out
    assert cli.main(["checkpoints", "list", str(tmp_path / "none")]) == 3


def test_pack_round_trips_dtypes_and_shapes_without_pickle():
    arrays = {"a": np.arange(6, dtype=np.int64).reshape(2, 3), "b": np.float32(1.5) * np.ones((0, 4), np.float32),
              "scalar": np.array(3.25, np.float64), "h": np.array([1, 2], np.float16)}
    out = ck.unpack(ck.pack(arrays))
    assert set(out) == set(arrays)
    for k in arrays:
        assert out[k].dtype == arrays[k].dtype and out[k].shape == arrays[k].shape
        np.testing.assert_array_equal(out[k], arrays[k])
    with pytest.raises(DataError, match="bad magic"):
        ck.unpack(b"PK\x03\x04 a zip file")
