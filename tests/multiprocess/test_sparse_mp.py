"""Sparse embedding gradients under ``horovodrun -np 2``: the same updates as the dense all-reduce, with the
large table's gradient sent as an allgather of touched rows (hvdtrain.training.steps.sparse_choice)."""
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

WORKER = r'''
import json, sys
import numpy as np, keras, tensorflow as tf
from hvdtrain.runtime import distributed
from hvdtrain.training import steps
rank = distributed.init()

def model():
    keras.utils.set_random_seed(1)
    ids = keras.Input((4,), dtype="int64", name="ids")
    x = keras.layers.Embedding(5000, 8, name="big")(ids)
    x = keras.layers.Embedding(50, 8, name="small")(ids % 50) + x
    out = keras.layers.Dense(3, name="logits")(keras.layers.Flatten()(x))
    return keras.Model({"ids": ids}, out)

seen = []
plain = distributed.allreduce_grads
def spy(grads, **kw):  # runs when the step is traced: which gradients reach the all-reduce as IndexedSlices
    seen.append([type(g).__name__ for g in grads])
    return plain(grads, **kw)
distributed.allreduce_grads = spy

weights = {}
for mode in ("dense", "sparse"):
    m, opt = model(), keras.optimizers.Adam(0.01)
    opt.build(m.trainable_variables)
    choice = steps.sparse_choice([tuple(v.shape) for v in m.trainable_variables], 1000 if mode == "sparse" else 0)
    red = steps.Reduction(sparse=choice)
    step = steps.make_train_step(m, opt, "label", ("ids",), red)
    rng = np.random.default_rng(10 + rank.rank)
    for _ in range(5):
        step({"ids": tf.constant(rng.integers(0, 5000, (16, 4))), "label": tf.constant(rng.integers(0, 3, 16))})
    weights[mode] = [w.numpy() for w in m.trainable_variables]
    names = [v.path for v in m.trainable_variables]
diff = max(float(np.abs(a - b).max()) for a, b in zip(weights["dense"], weights["sparse"]))
print("RESULT " + json.dumps({"rank": rank.rank, "max_diff": diff, "choice": dict(zip(names, choice)),
                              "kinds": dict(zip(names, seen[-1])),
                              "digest": float(sum(np.abs(w).sum() for w in weights["sparse"]))}), flush=True)
'''


def test_sparse_and_dense_reductions_give_the_same_weights_on_every_rank(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([str(mp.horovodrun()), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable,
                           str(script)], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = [json.loads(line.split("RESULT ", 1)[1]) for line in proc.stdout.splitlines() if "RESULT " in line]
    assert len(results) == 2
    choice, kinds = results[0]["choice"], results[0]["kinds"]
    big = next(name for name in choice if name.startswith("big"))
    assert choice[big] and [n for n, sparse in choice.items() if sparse] == [big]  # only the 5000-row table
    assert kinds[big] == "IndexedSlices"  # and its gradient reaches the reduction sparse
    assert all(r["max_diff"] < 1e-5 for r in results), results  # the same arithmetic, up to float rounding
    assert results[0]["digest"] == results[1]["digest"]  # both ranks hold the same weights
