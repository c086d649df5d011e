"""hvdtrain/observe/tensorboard.py with real TensorFlow and TensorBoard, no training: the hook driven by hand, events
published through hvdtrain.hadoop.fs to an ``hdfs://`` folder (a local folder behind the scheme), a resume's
truncation, and ``hvdtrain tensorboard`` serving a staged copy on 127.0.0.1."""
from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow.fs as pafs
import pytest

from hvdtrain.core.errors import UsageError
from hvdtrain.hadoop import fs
from hvdtrain.observe import tensorboard
from hvdtrain.observe.events import EpochStats, LoopState, StepInfo

REMOTE = "hdfs://nn:8020/runs/job"


@pytest.fixture
def hdfs(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "hdfs"
    root.mkdir()
    fs.register_scheme("hdfs", lambda netloc: pafs.SubTreeFileSystem(str(root), pafs.LocalFileSystem()))
    yield root
    fs.register_scheme("hdfs", None)


def _steps(folder: Path) -> dict[str, list[int]]:
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(str(folder), size_guidance={ea.TENSORS: 0}, purge_orphaned_data=False)
    acc.Reload()
    return {tag: [e.step for e in acc.Tensors(tag)] for tag in acc.Tags()["tensors"]}


def _run_hook(local: Path, steps: range, saved: int, resume_step: int = 0) -> None:
    hook = tensorboard.start_hook(str(local), REMOTE, every_steps=2, world_size=2, resume_step=resume_step,
                                  learning_rate=lambda: 0.01, saved_step=lambda: saved)
    assert hook is not None
    for step in steps:
        hook.on_step(StepInfo(1, step, step, 0.001, np.float32(8.0), 4, 0.01))
        hook.after_step(LoopState(step, 1, False, lambda: np.zeros(3), 0.0, []))
    hook.end_epoch(EpochStats(1, len(steps), 8 * len(steps), 2.0, 0.5, 1.0, learning_rate=0.01))
    hook.log_metrics({"time_compute_fraction": 0.9}, 1)
    hook.close()


def test_hook_writes_in_the_background_and_publishes_through_the_filesystem_layer(tmp_path: Path, hdfs: Path) -> None:
    _run_hook(tmp_path / "local", range(1, 9), saved=4)
    published = hdfs / "runs" / "job" / "tensorboard"
    tags = _steps(published)
    assert tags["train/loss"] == [2, 4, 6, 8] and tags["train/samples_per_sec"] == [2, 4, 6, 8]
    assert tags["epoch/train_loss"] == [8] and tags["breakdown/time_compute_fraction"] == [8]


def test_a_resume_drops_the_events_after_its_checkpoint_and_a_fresh_run_the_old_ones(tmp_path: Path,
                                                                                      hdfs: Path) -> None:
    _run_hook(tmp_path / "first", range(1, 9), saved=8)
    _run_hook(tmp_path / "resumed", range(5, 13), saved=12, resume_step=4)
    published = hdfs / "runs" / "job" / "tensorboard"
    assert _steps(published)["train/loss"] == [2, 4, 6, 8, 10, 12]  # 6 and 8 once, from the resumed run
    assert _steps(published)["epoch/train_loss"] == [12]  # the first run's epoch end (8) came after step 4
    _run_hook(tmp_path / "fresh", range(1, 3), saved=2)
    assert _steps(published)["train/loss"] == [2]


def test_hvdtrain_tensorboard_serves_a_staged_copy_on_loopback(tmp_path: Path, hdfs: Path) -> None:
    _run_hook(tmp_path / "local", range(1, 5), saved=4)
    seen: dict[str, object] = {}

    def look(url: str) -> None:
        seen["url"] = url
        with urllib.request.urlopen(url + "data/plugin/scalars/tags", timeout=30) as response:
            seen["tags"] = json.load(response)

    assert tensorboard.serve(REMOTE, port=0, ready=lambda line: None, wait=look) == 0
    assert str(seen["url"]).startswith("http://127.0.0.1:")
    assert "train/loss" in next(iter(seen["tags"].values()))
    with pytest.raises(UsageError, match="no TensorBoard event files"):
        tensorboard.find_logdir(str(tmp_path / "nothing"))


def test_a_failed_run_leaves_the_previous_output_byte_identical_events_included(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """#54 item 8: a run's events go to its checkpoint folder while it trains and reach train.output only with the
    rest of its outputs (the swap); before, a fresh run deleted the published events and wrote into them."""
    from types import SimpleNamespace

    from hvdtrain.core import config
    from hvdtrain.training import assemble

    output = tmp_path / "out"  # the previous run's published output
    (output / "tensorboard").mkdir(parents=True)
    (output / "tensorboard" / f"{tensorboard.EVENTS_PREFIX}old").write_bytes(b"the old run's events")
    (output / "model.keras").write_bytes(b"the old model")
    before = {str(p.relative_to(output)): p.read_bytes() for p in output.rglob("*") if p.is_file()}
    cfg = config.from_dict({"name": "tb", "workdir": str(tmp_path), "source": {"table": "db.t"},
                            "train": {"output": str(output)}, "tensorboard": {"every_steps": 1}},
                           base_dir=str(tmp_path))
    tags: dict[str, str] = {}
    ctx = SimpleNamespace(cfg=cfg, rank=SimpleNamespace(is_chief=True, size=1), stage_dir=str(tmp_path / "stage"),
                          tracker=SimpleNamespace(set_tags=tags.update))
    observed = SimpleNamespace(optimizer=None, resumed=None, checkpointer=SimpleNamespace(
        last_save=SimpleNamespace(step=2), model=None))
    monkeypatch.setattr(assemble, "current_learning_rate", lambda optimizer: 0.01)  # no optimizer here
    board = assemble._tensorboard(ctx, observed)  # type: ignore[arg-type]
    assert board is not None
    for step in (1, 2):
        board.on_step(StepInfo(1, step, step, 0.001, np.float32(8.0), 4, 0.01))
        board.after_step(LoopState(step, 1, False, lambda: np.zeros(3), 0.0, []))  # step 2: a checkpoint was saved
    board.close()  # the run fails here: nothing is published to train.output
    assert {str(p.relative_to(output)): p.read_bytes() for p in output.rglob("*") if p.is_file()} == before
    live = Path(cfg.checkpoint.dir) / "tensorboard"  # where the run's events went instead, beside its checkpoints
    assert _steps(live)["train/loss"] == [1, 2]
