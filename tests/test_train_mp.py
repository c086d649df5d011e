"""Training end to end on tiny synthetic datasets: under horovodrun -np 2 (Gloo), and as one process.

Each run is a subprocess, as a user would start it. The ranks must finish with
identical weights (rank 0 gathers every rank's weight digest into the report),
learn the separable task, and evaluate every record of each split exactly once.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hvdtrain import config
from hvdtrain.synthetic import make_text_dataset

pytestmark = pytest.mark.multiprocess

REPO = Path(__file__).resolve().parents[1]
HOROVODRUN = Path(sys.executable).parent / "horovodrun"
TINY_MODEL = {"embed_dim": 16, "num_heads": 2, "ff_dim": 32, "num_layers": 1, "dropout": 0.1}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HOROVOD_", "OMPI_", "PMI_")) and k != "MLFLOW_TRACKING_URI"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO), MLFLOW_DISABLE_TELEMETRY="true")
    return env


def _job(tmp: Path, name: str, data_dir: Path, tracking: bool = False, **train: Any) -> tuple[Path, Path]:
    """Write a job config; returns (config path, train output folder)."""
    cfg = config.from_dict({
        "name": name, "workdir": str(tmp), "source": {"table": "demo.reviews"},
        "etl": {"output": str(data_dir)}, "model": TINY_MODEL,
        "train": {"epochs": 2, "batch_size": 16, "learning_rate": 0.003, "shuffle_buffer": 64, **train},
        "tracking": {"enabled": tracking},
    }, base_dir=str(tmp))
    path = tmp / f"{name}.yaml"
    path.write_text(cfg.to_yaml())
    return path, Path(cfg.train.output)


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(cmd)} did not finish in {timeout}s (a rank is stuck?)\n"
                    f"{(exc.stderr or b'')[-3000:]!r}")
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}"
    return proc


def _horovodrun(config_path: Path, timeout: float = 150) -> subprocess.CompletedProcess:
    if not HOROVODRUN.exists():
        pytest.skip(f"horovodrun not found next to {sys.executable}")
    return _run([str(HOROVODRUN), "-np", "2", "-H", "localhost:2", "--gloo",
                 sys.executable, "-m", "hvdtrain.train", str(config_path)], timeout)


def _outputs(output: Path) -> tuple[dict, dict]:
    return json.loads((output / "result.json").read_text()), json.loads((output / "eval_report.json").read_text())


def _assert_complete(report: dict, manifest) -> None:
    for split in ("validation", "test"):
        assert report["evaluation"][split]["records"] == manifest.split(split).records, split
    assert report["dataset"]["manifest_digest"] == manifest.digest()


def test_two_ranks_agree_learn_and_export(tmp_path: Path) -> None:
    manifest = make_text_dataset(str(tmp_path / "data"), n_per_split={"train": 480, "validation": 61, "test": 67},
                                 shards_per_split=4, class_rate=0.35, seed=11)
    config_path, output = _job(tmp_path, "mp", tmp_path / "data", tracking=True)
    _horovodrun(config_path)
    result, report = _outputs(output)
    digests = report["rank_digest"]
    assert [d["rank"] for d in digests["ranks"]] == [0, 1]
    assert digests["agree"] and digests["ranks"][0]["sha256"] == digests["ranks"][1]["sha256"]
    assert result["ranks_agree"] and result["world_size"] == 2
    assert result["test_accuracy"] >= 0.8, report["evaluation"]["test"]
    _assert_complete(report, manifest)
    training = report["training"]
    assert training["steps_per_epoch"] == 480 // (16 * 2) and training["steps"] == 2 * 15
    assert [h["examples"] for h in training["history"]] == [480, 480]
    assert (output / "model.keras").is_file() and (output / "saved_model" / "saved_model.pb").is_file()
    assert json.loads((output / "labels.json").read_text())["labels"] == manifest.labels
    assert result["run_id"] and (tmp_path / "mlflow" / "mlflow.db").is_file()


def test_uneven_shards_and_fewer_shards_than_ranks_do_not_hang(tmp_path: Path) -> None:
    # train: whole shards would give rank 1 a tenth of rank 0's records; validation: 3 very
    # different shards read whole (ranks run different numbers of eval batches); test: one shard.
    manifest = make_text_dataset(str(tmp_path / "data"), shard_sizes={
        "train": [300, 30, 12], "validation": [40, 3, 1], "test": [27]}, seed=5)
    config_path, output = _job(tmp_path, "uneven", tmp_path / "data", epochs=1)
    _horovodrun(config_path, timeout=120)
    result, report = _outputs(output)
    assert report["rank_digest"]["agree"]
    assert report["training"]["steps_per_epoch"] == 342 // 32
    _assert_complete(report, manifest)


def test_single_process_without_horovodrun(tmp_path: Path) -> None:
    manifest = make_text_dataset(str(tmp_path / "data"), n_per_split={"train": 320, "validation": 33, "test": 35},
                                 shards_per_split=2, seed=2)
    config_path, output = _job(tmp_path, "single", tmp_path / "data")
    proc = _run([sys.executable, "-m", "hvdtrain.train", str(config_path), "train.epochs=1"], timeout=90)
    result, report = _outputs(output)
    assert json.loads(proc.stdout) == result
    assert report["training"]["world_size"] == 1 and report["training"]["backend"] == "local"
    assert result["run_id"] is None  # tracking disabled
    assert result["test_accuracy"] >= 0.8
    _assert_complete(report, manifest)
