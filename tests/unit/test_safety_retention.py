"""Checkpoint retention deletes only what it proved incomplete, never what the storage merely failed to show it.

Before, one storage error while pruning (after fs's retries) marked a checkpoint "unreadable", and retention
deleted every checkpoint that was not "ok", the one kept for ``keep_best`` included.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from hvdtrain.hadoop import fs
from hvdtrain.training import checkpoint as ck
from tests.support import faulty_fs


def _state(seed: int) -> dict[str, np.ndarray]:
    return {"w": np.random.default_rng(seed).normal(size=(3, 2)).astype(np.float32)}


@pytest.fixture
def no_backoff(monkeypatch):
    real = fs.with_retries

    def fast(fn, what, policy=fs.RetryPolicy(), sleep=None, rng=None):
        return real(fn, what, policy, sleep=lambda s: None, rng=rng)
    monkeypatch.setattr(fs, "with_retries", fast)


def _three_checkpoints(root: str) -> None:
    """ckpt 1 is the best by acc, 3 the newest; with keep_last=1, keep_best=1 only 2 is for deleting."""
    w = ck.CheckpointWriter(root, keep_last=10, background=False)
    for step, acc in ((1, 0.9), (2, 0.1), (3, 0.2)):
        w.save(step, _state(step), {"epoch": step, "metrics": {"acc": acc}})


@pytest.mark.parametrize("fault", [("read", f"{ck.checkpoint_name(1)}/{ck.META}"),  # meta.json: the metric
                                   ("list", ck.checkpoint_name(1))])  # its folder: is there a COMMIT?
def test_a_storage_error_while_pruning_never_deletes_the_best_checkpoint(tmp_path, no_backoff, fault) -> None:
    root = tmp_path / "c"
    _three_checkpoints(str(root))
    handler = faulty_fs.install(faulty_fs.FaultyHandler(fail=(fault,)))  # transient, past every retry
    try:
        pruned = ck.CheckpointWriter(f"faulty://{root}", keep_last=1, keep_best=1, metric="acc",
                                     background=False).prune()
    finally:
        faulty_fs.uninstall()
    assert any(op == fault[0] for op, _ in handler.calls)  # the fault did hit
    assert ck.checkpoint_name(1) in pruned.keep
    assert [i.step for i in ck.scan(str(root))] == [1, 3]  # only 2, read and ranked, is gone
    assert ck.restore_latest(str(root))[0].step == 3


def test_a_denied_read_is_not_proof_either(tmp_path) -> None:
    root = tmp_path / "c"
    _three_checkpoints(str(root))
    faulty_fs.install(faulty_fs.FaultyHandler(fail=(("read", f"{ck.checkpoint_name(1)}/{ck.CHECKSUMS}"),),
                                              error=PermissionError(13, "Permission denied (injected)")))
    try:
        ck.CheckpointWriter(f"faulty://{root}", keep_last=1, keep_best=1, metric="acc", background=False).prune()
    finally:
        faulty_fs.uninstall()
    assert ck.checkpoint_name(1) in os.listdir(root)


def test_only_a_checkpoint_proven_incomplete_is_eligible() -> None:
    def info(step: int, status: str = "ok", **metrics: float) -> ck.CheckpointInfo:
        return ck.CheckpointInfo(ck.checkpoint_name(step), f"/x/{step}", step, metrics=metrics, status=status)

    infos = [info(1, "unreadable"), info(2, "uncommitted"), info(3, "corrupt"), info(4, "missing"),
             info(5, acc=0.1), info(6, acc=0.3)]
    decision = ck.retention(infos, keep_last=1, keep_best=1, metric="acc")
    assert decision.delete == [ck.checkpoint_name(2), ck.checkpoint_name(3), ck.checkpoint_name(5)]
    assert ck.checkpoint_name(1) in decision.keep  # maybe the best: the storage did not say


def test_an_uncommitted_folder_seen_in_a_good_listing_is_still_pruned(tmp_path) -> None:
    root = tmp_path / "c"
    _three_checkpoints(str(root))
    os.remove(root / ck.checkpoint_name(2) / ck.COMMIT)  # an interrupted publish, older than the newest
    ck.CheckpointWriter(str(root), keep_last=1, keep_best=1, metric="acc", background=False).prune()
    assert sorted(os.listdir(root)) == [ck.checkpoint_name(1), ck.checkpoint_name(3)]
