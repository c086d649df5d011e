"""BatchNormalization under ``horovodrun -np 2``: each rank updates the moving statistics from its own batches;
hvdtrain averages them over ranks before every evaluation, checkpoint and export, so the ranks agree and the
exported statistics are the ranks' mean, not rank 0's alone. Dropout's seed-generator state stays per rank."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hvdtrain.core import config
from hvdtrain.data.synthetic import Layout, TabularSpec, make_tabular_dataset
from tests.support import mp

pytestmark = pytest.mark.multiprocess
REPO = Path(__file__).resolve().parents[2]

WORKER = r'''
import json
import numpy as np, keras, tensorflow as tf
from hvdtrain.runtime import distributed
from hvdtrain.training import state
from tests.support import builders
from hvdtrain.data.contract import InputShape
rank = distributed.init()
keras.utils.set_random_seed(1)  # the same initial weights on both ranks
contract = InputShape(max_length=0, vocab_size=0, num_classes=3, label_feature="label", kind="custom",
                      inputs=("numeric",), numeric_features=4)
model = builders.batch_norm_mlp(contract, {})
for v in model.non_trainable_variables:  # each rank's own dropout randomness, as hvdtrain seeds each rank
    if "seed" in v.path:
        v.assign(np.array([100 + rank.rank, 0], dtype="int64"))
for _ in range(3):
    model({"numeric": tf.constant(np.random.default_rng(rank.rank).normal(rank.rank * 3.0, 1.0 + rank.rank,
                                                                            (16, 4)).astype("float32"))},
          training=True)
local = [np.array(v) for v in state.rank_local_statistics(model)]
seeds = [np.array(v) for v in model.non_trainable_variables if "seed" in v.path]
state.average_statistics(model)
print("RESULT " + json.dumps({"rank": rank.rank, "local": [a.tolist() for a in local],
                              "averaged": [np.array(v).tolist() for v in state.rank_local_statistics(model)],
                              "names": [v.path for v in state.rank_local_statistics(model)],
                              "seeds_before": [s.tolist() for s in seeds],
                              "seeds_after": [np.array(v).tolist() for v in model.non_trainable_variables
                                              if "seed" in v.path]}), flush=True)
'''


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HOROVOD_", "OMPI_", "PMI_")) and k != "MLFLOW_TRACKING_URI"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO), MLFLOW_DISABLE_TELEMETRY="true")
    return env


def _horovodrun(*args: str, timeout: float = 150) -> subprocess.CompletedProcess:
    cmd = [str(mp.horovodrun()), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, *args]
    proc = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}"
    return proc


def test_moving_statistics_become_the_mean_of_the_ranks_and_seeds_stay_per_rank(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    proc = _horovodrun(str(script), timeout=120)
    results = sorted((json.loads(line.split("RESULT ", 1)[1]) for line in proc.stdout.splitlines()
                      if "RESULT " in line), key=lambda r: r["rank"])
    assert [r["rank"] for r in results] == [0, 1], proc.stdout[-2000:]
    r0, r1 = results
    assert r0["names"] == ["bn/moving_mean", "bn/moving_variance"], r0["names"]
    for i in range(2):
        local0, local1 = np.array(r0["local"][i]), np.array(r1["local"][i])
        assert np.abs(local0 - local1).max() > 0.1  # the ranks saw different batches
        expected = (local0.astype(np.float64) + local1) / 2
        np.testing.assert_allclose(r0["averaged"][i], expected, rtol=1e-6)
        assert r0["averaged"][i] == r1["averaged"][i]  # bit for bit
    assert r0["seeds_before"] and r0["seeds_after"] == r0["seeds_before"] and r1["seeds_after"] == r1["seeds_before"]
    assert r0["seeds_after"] != r1["seeds_after"]  # each rank keeps its own dropout randomness


def test_a_batch_norm_model_trains_with_ranks_agreeing_and_exports_their_mean_statistics(tmp_path: Path) -> None:
    import keras

    layout = Layout(n_per_split={"train": 256, "validation": 32, "test": 32}, shards_per_split=2)
    make_tabular_dataset(str(tmp_path / "data"), TabularSpec(layout=layout, num_classes=3, num_numeric=4,
                                                             cardinalities=(), seed=3))
    cfg = config.from_dict({
        "name": "bn", "workdir": str(tmp_path), "source": {"table": "demo.tabular"},
        "etl": {"output": str(tmp_path / "data")},
        "model": {"kind": "custom", "builder": "tests.support.builders:batch_norm_mlp", "params": {"units": 8}},
        "train": {"epochs": 2, "batch_size": 16, "learning_rate": 0.01, "shuffle_buffer": 64,
                  "validate_every_epoch": True, "progress": "off"},
        "tracking": {"enabled": False}, "monitoring": {"enabled": False},
    }, base_dir=str(tmp_path))
    path = tmp_path / "bn.yaml"
    path.write_text(cfg.to_yaml())
    _horovodrun("-m", "hvdtrain.training.train", str(path))
    output = Path(cfg.train.output)
    report = json.loads((output / "eval_report.json").read_text())
    assert report["rank_digest"]["agree"], report["rank_digest"]
    bn = keras.saving.load_model(output / "model.keras", compile=False).get_layer("bn")
    mean, variance = np.array(bn.moving_mean), np.array(bn.moving_variance)
    assert np.abs(mean).max() > 1e-3 and np.abs(variance - 1).max() > 1e-3  # trained, not the initial 0 and 1
