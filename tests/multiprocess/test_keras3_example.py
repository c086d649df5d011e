"""examples/keras3_horovod.py, the canonical Horovod Keras recipe, under horovodrun -np 2 --gloo.

A user's Horovod script must run unchanged on this project's build (TF 2.21, Keras 3): the
ranks start from different weights, so they end identical only if BroadcastGlobalVariablesCallback
and DistributedOptimizer work; MetricAverageCallback makes the logged losses equal; the loss falls.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.multiprocess
def test_keras3_horovod_example_ranks_end_identical_and_loss_falls(tmp_path: Path) -> None:
    bindir = Path(sys.executable).parent
    env = dict(os.environ, PYTHONPATH=str(REPO), PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    proc = subprocess.run([str(bindir / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo",
                           sys.executable, str(REPO / "examples" / "keras3_horovod.py"),
                           "--out", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]

    assert ranks[0]["initial_weights_sha256"] != ranks[1]["initial_weights_sha256"]
    assert ranks[0]["final_weights_sha256"] == ranks[1]["final_weights_sha256"]
    assert ranks[0]["loss"] == ranks[1]["loss"]  # averaged across ranks by MetricAverageCallback
    loss = ranks[0]["loss"]
    assert loss[-1] < 0.6 * loss[0], loss
    assert ranks[0]["lr"][0] < ranks[0]["lr"][-1]  # warm-up ramps the scaled learning rate
