"""float16 all-reduce safety under horovodrun -np 2: an overflowing step is skipped on every rank, never applied."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import mp

pytestmark = pytest.mark.multiprocess

REPO = Path(__file__).resolve().parents[2]

# Each rank: a tiny MLP, three optimizer steps with float16 on the wire. Step 2's inputs are so large that
# the gradients overflow float16 (> 65504) in the all-reduce, on rank 1 only: the all-reduced gradients are
# inf on both ranks, and both must skip it.
SCRIPT = """
import hashlib, json, sys
import numpy as np, tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(1)
from hvdtrain.runtime import distributed
from hvdtrain.training import state, steps
from hvdtrain.core.config import ModelConfig, TrainConfig
from hvdtrain.data.contract import InputShape
from hvdtrain.model.models import build_model
rank = distributed.init()
shape = InputShape(0, 0, 3, "label", kind="mlp", inputs=("numeric",), numeric_features=4)
def run(mode):
    tf.keras.utils.set_random_seed(3)
    model = build_model(ModelConfig(kind="mlp", hidden_units=[8], dropout=0.0), shape)
    optimizer = state.build_optimizer(TrainConfig(learning_rate=0.01), rank.size, 10)
    optimizer.build(model.trainable_variables)
    distributed.broadcast_state(model, optimizer)
    guard = steps.FiniteGuard()
    step = steps.make_optimizer_step(model, optimizer, "label", ("numeric",), 1, steps.Reduction(True, mode), guard)
    rng = np.random.default_rng(rank.rank)
    def digest():
        return hashlib.sha256(b"".join(np.asarray(w).tobytes() for w in model.get_weights())).hexdigest()
    seen = [digest()]
    for k in range(3):
        x = rng.normal(size=(8, 4)).astype(np.float32)
        if k == 1 and rank.rank == 1:
            x *= 1e9
        step([{"numeric": tf.constant(x), "label": tf.constant(rng.integers(0, 3, 8))}])
        seen.append(digest())
    finite = all(np.isfinite(w).all() for w in model.get_weights())
    print("RESULT " + json.dumps({"rank": rank.rank, "mode": mode, "digests": seen, "skipped": guard.count(),
                                  "finite": bool(finite), "iterations": int(optimizer.iterations.numpy())}), flush=True)
for mode in ("grouped", "overlap"):  # both all-reduce modes (train.allreduce), in one launch
    run(mode)
"""


def test_an_overflowing_float16_allreduce_is_skipped_together_and_never_applied(tmp_path: Path) -> None:
    script = tmp_path / "fp16_overflow.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    env.update(PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([str(mp.horovodrun()), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, str(script)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = sorted((json.loads(line.split("RESULT ", 1)[1]) for line in proc.stdout.splitlines()
                      if "RESULT " in line), key=lambda r: (r["mode"], r["rank"]))
    assert [(r["mode"], r["rank"]) for r in results] == [("grouped", 0), ("grouped", 1), ("overlap", 0),
                                                         ("overlap", 1)]
    for r in results:
        d = r["digests"]
        assert r["finite"] and r["skipped"] == 1 and r["iterations"] == 2, r["mode"]
        assert d[0] != d[1] and d[2] == d[1] and d[3] != d[2], r["mode"]  # steps 1 and 3 applied, 2 skipped
    assert results[0]["digests"] == results[1]["digests"]  # the ranks skipped together and agree
    assert results[2]["digests"] == results[3]["digests"]
    assert results[0]["digests"] == results[2]["digests"]  # overlapped or grouped: the same arithmetic
