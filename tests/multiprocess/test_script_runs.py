"""Users' own Horovod scripts, unchanged: examples/keras3_horovod.py (the canonical Horovod Keras recipe:
model.fit with hvd.DistributedOptimizer, BroadcastGlobalVariablesCallback, MetricAverageCallback, LR warm-up)
under ``hvdtrain run --np 2`` (horovodrun, Gloo; the launcher only adds a start timeout and execs the script),
and examples/gradient_tape_horovod.py (DistributedGradientTape) under ``hvdtrain yarn run --master local[2]``
(the YARN submission path on local Spark). Each rank writes a SHA-256 of its final weights; the ranks start
from different weights and must end identical."""
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


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "OMPI_", "PMI_"))}
    bindir = str(Path(sys.executable).parent)
    env.update(PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2", PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}")
    return env


def _hvdtrain(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hvdtrain.cli", *args], cwd=REPO, env=_env(), capture_output=True,
                          text=True, timeout=timeout)


def _assert_ranks_agree(out: Path, proc: subprocess.CompletedProcess) -> list[dict]:
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["initial_weights_sha256"] != ranks[1]["initial_weights_sha256"]
    assert ranks[0]["final_weights_sha256"] == ranks[1]["final_weights_sha256"]
    assert ranks[0]["loss"] == ranks[1]["loss"] and ranks[0]["loss"][-1] < ranks[0]["loss"][0]
    return ranks


def test_keras3_recipe_under_hvdtrain_run_ends_identical_and_learns(tmp_path: Path) -> None:
    mp.horovodrun()
    proc = _hvdtrain("run", "--np", "2", "examples/keras3_horovod.py", "--out", str(tmp_path))
    ranks = _assert_ranks_agree(tmp_path, proc)  # identical only if the broadcast and the optimizer work
    loss = ranks[0]["loss"]  # averaged across ranks by MetricAverageCallback
    assert loss[-1] < 0.6 * loss[0], loss
    assert ranks[0]["lr"][0] < ranks[0]["lr"][-1]  # warm-up ramps the scaled learning rate
    assert "check-script" not in proc.stderr  # the example is Keras 3 code


@pytest.mark.spark
def test_hvdtrain_yarn_run_on_local_spark(tmp_path: Path) -> None:
    """One script through the YARN path: the path ships any script the same way (both run under ``hvdtrain run``
    above), and this one reports the HOROVOD_RANK each rank was given."""
    mp.horovodrun()
    script = "gradient_tape_horovod.py"
    output, history = tmp_path / "job", tmp_path / "spark-history"
    proc = _hvdtrain("yarn", "run", "--num-workers", "2", "--master", "local[2]", "--output", str(output),
                     "--set", f"spark.event_log_dir={history}", f"examples/{script}", "--epochs", "2",
                     "--out", str(tmp_path / "ranks"), timeout=1200)
    ranks = _assert_ranks_agree(tmp_path / "ranks", proc)
    assert [r["env_rank"] for r in ranks] == ["0", "1"]  # HOROVOD_RANK as Horovod sets it
    record = json.loads((output / "yarn_result.json").read_text())
    assert [(r["rank"], r["exit_code"]) for r in record["ranks"]] == [(0, 0), (1, 0)]
    assert "loss" in (output / "logs" / "rank0.log").read_text()  # every rank's output, collected
    assert (output / "logs" / "rank1.log").exists()
    assert any(history.rglob("*local-*")), "no Spark event log written"  # spark.event_log_dir


FAILING = """
import os, sys
rank = int(os.environ["HOROVOD_RANK"])
print("rank", rank, "of", os.environ["HOROVOD_SIZE"], flush=True)
sys.exit(3 if rank == 1 else 0)
"""


def test_hvdtrain_run_exits_with_the_worst_ranks_code_and_checks_first(tmp_path: Path) -> None:
    mp.horovodrun()
    script = tmp_path / "fails.py"
    script.write_text(FAILING + "if False:\n    import tensorflow as tf\n    tf.keras.optimizers.Adam(lr=1)\n")
    proc = _hvdtrain("run", "--np", "2", str(script), timeout=300)
    assert proc.returncode == 3, (proc.stdout + proc.stderr)[-3000:]
    assert f"check-script: {script}:8:" in proc.stderr and "learning_rate=" in proc.stderr
    assert "failed on 2 rank(s): the worst rank exited with code 3" in proc.stderr


REPORTS_MALLOC = """
import json, os, sys
# /proc/self/environ is the environment the process was started with: what glibc's malloc read
start = dict(v.split("=", 1) for v in open("/proc/self/environ").read().split("\\0") if "=" in v)
out = os.path.join(sys.argv[1], "rank%s.json" % os.environ["HOROVOD_RANK"])
json.dump({"MALLOC_TOP_PAD_": start.get("MALLOC_TOP_PAD_")}, open(out, "w"))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/environ")
def test_ranks_start_with_mallocs_top_pad_unless_the_user_set_one(tmp_path: Path) -> None:
    """Every rank's process starts with glibc's MALLOC_TOP_PAD_ (hvdtrain.runtime.launch.malloc_env), and a user's own
    value wins."""
    mp.horovodrun()
    script = tmp_path / "reports.py"
    script.write_text(REPORTS_MALLOC)
    proc = _hvdtrain("run", "--np", "2", str(script), str(tmp_path), timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)] == [
        {"MALLOC_TOP_PAD_": str(64 << 20)}] * 2
    env = {**_env(), "MALLOC_TOP_PAD_": "1048576"}
    proc = subprocess.run([sys.executable, "-m", "hvdtrain.cli", "run", "--np", "2", str(script), str(tmp_path)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert json.loads((tmp_path / "rank1.json").read_text()) == {"MALLOC_TOP_PAD_": "1048576"}
