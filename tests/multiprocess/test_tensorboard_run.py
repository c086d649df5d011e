"""TensorBoard event files of real training runs (hvdtrain/observe/tensorboard.py), read back with TensorBoard's own
reader: the expected tags at the expected global steps, the graph once, and a run resumed from a mid-epoch
checkpoint continuing the same step axis without a duplicate step. Single process (no horovodrun)."""
from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from hvdtrain.core import config
from hvdtrain.data.synthetic import Layout, TextSpec, make_text_dataset
from hvdtrain.hadoop import fs
from hvdtrain.training import checkpoint

REPO = Path(__file__).resolve().parents[2]
TINY_MODEL = {"embed_dim": 8, "num_heads": 2, "ff_dim": 16, "num_layers": 1, "dropout": 0.0}


def _train(path: Path, *overrides: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "OMPI_", "PMI_"))}
    env.update(PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, "-m", "hvdtrain.training.train", str(path), *overrides], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]


def _steps(folder: Path) -> tuple[dict[str, list[int]], bool]:
    """{tag: steps in file order} and whether a graph is there, by TensorBoard's EventAccumulator."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(str(folder), size_guidance={ea.TENSORS: 0}, purge_orphaned_data=False)
    acc.Reload()
    tags = acc.Tags()
    return {tag: [e.step for e in acc.Tensors(tag)] for tag in tags["tensors"]}, tags["graph"]


@pytest.mark.timeout(900)
def test_event_files_have_the_tags_and_a_resumed_run_continues_the_step_axis(tmp_path: Path) -> None:
    make_text_dataset(str(tmp_path / "data"), TextSpec(layout=Layout(
        n_per_split={"train": 64, "validation": 16, "test": 16}, shards_per_split=2), max_length=8, seed=3))
    cfg = config.from_dict({
        "name": "tb", "workdir": str(tmp_path), "source": {"table": "demo.reviews"},
        "etl": {"output": str(tmp_path / "data")}, "model": TINY_MODEL,
        "train": {"epochs": 1, "batch_size": 8, "progress": "off", "validate_every_epoch": True},
        "checkpoint": {"every_steps": 4}, "tracking": {"enabled": False},
        "monitoring": {"step_breakdown": True}, "tensorboard": {"every_steps": 1},
    }, base_dir=str(tmp_path))
    path = tmp_path / "tb.yaml"
    path.write_text(cfg.to_yaml())
    events = Path(cfg.train.output) / "tensorboard"

    _train(path)  # 64 records / batch 8: steps 1-8, checkpoints at 4 and 8
    tags, graph = _steps(events)
    assert graph
    for tag in ("train/loss", "train/learning_rate", "train/samples_per_sec", "train/data_wait_seconds",
                "train/step_seconds"):
        assert tags[tag] == list(range(1, 9)), (tag, tags[tag])
    for tag in ("epoch/train_loss", "epoch/train_accuracy", "epoch/learning_rate", "epoch/samples_per_sec",
                "epoch/val_accuracy", "breakdown/slowest_rank_busy_seconds"):
        assert tags[tag] == [8], (tag, tags)

    # As if the run had died after step 8's events were published but before its checkpoint: resume at 4.
    fs.delete(next(i.uri for i in checkpoint.scan(cfg.checkpoint.dir) if i.step == 8))
    _train(path, "train.epochs=2")  # steps 5-16 again from the step-4 checkpoint
    tags, graph = _steps(events)
    assert graph
    assert tags["train/loss"] == list(range(1, 17)), tags["train/loss"]  # steps 5-8 once, not twice
    assert tags["epoch/train_loss"] == [8, 16]
    assert not [t for t, steps in tags.items() if max(Counter(steps).values()) > 1]
