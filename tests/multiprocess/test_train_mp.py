"""Training end to end on tiny synthetic datasets: under horovodrun -np 2 (Gloo), and as one process.

Each run is a subprocess, as a user would start it. The ranks must finish with
identical weights (rank 0 gathers every rank's weight digest into the report),
learn the separable task, and evaluate every record of each split exactly once.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest

from hvdtrain.core import config
from hvdtrain.data.synthetic import Layout, TabularSpec, TextSpec, make_tabular_dataset, make_text_dataset
from hvdtrain.training import leases
from tests.support import mp

pytestmark = pytest.mark.multiprocess

REPO = Path(__file__).resolve().parents[2]
TINY_MODEL = {"embed_dim": 16, "num_heads": 2, "ff_dim": 32, "num_layers": 1, "dropout": 0.1}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HOROVOD_", "OMPI_", "PMI_")) and k != "MLFLOW_TRACKING_URI"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO), MLFLOW_DISABLE_TELEMETRY="true")
    return env


def _job(tmp: Path, name: str, data_dir: Path, tracking: bool = False, model: Optional[dict] = None,
         **train: Any) -> tuple[Path, Path]:
    """Write a job config; returns (config path, train output folder)."""
    cfg = config.from_dict({
        "name": name, "workdir": str(tmp), "source": {"table": "demo.reviews"},
        "etl": {"output": str(data_dir)}, "model": model or TINY_MODEL,
        "train": {"epochs": 2, "batch_size": 16, "learning_rate": 0.003, "shuffle_buffer": 64, **train},
        "tracking": {"enabled": tracking},
    }, base_dir=str(tmp))
    path = tmp / f"{name}.yaml"
    tmp.mkdir(parents=True, exist_ok=True)
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


def _horovodrun(config_path: Path, timeout: float = 150, np: int = 2,
                launcher: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return _run([str(mp.horovodrun()), "-np", str(np), "-H", f"localhost:{np}", "--gloo", *launcher,
                 sys.executable, "-m", "hvdtrain.training.train", str(config_path)], timeout)


def wire_dtypes(timeline: Path) -> dict[str, set[str]]:
    """Horovod timeline: the dtypes each collective's tensors were sent in, by collective name."""
    events = json.loads(timeline.read_text())
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name" and "name" in
             e.get("args", {})}
    out: dict[str, set[str]] = {}
    for e in events:
        if "dtype" in e.get("args", {}):
            out.setdefault(names[e["pid"]], set()).add(e["args"]["dtype"])
    return out


def _outputs(output: Path) -> tuple[dict, dict]:
    return json.loads((output / "result.json").read_text()), json.loads((output / "eval_report.json").read_text())


def _assert_complete(report: dict, manifest) -> None:
    for split in ("validation", "test"):
        assert report["evaluation"][split]["records"] == manifest.split(split).records, split
    assert report["dataset"]["manifest_digest"] == manifest.digest()


def _refused(cmd: list[str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=150)
    assert proc.returncode != 0, proc.stderr[-3000:]
    return proc


def test_two_ranks_agree_learn_and_export_once_no_other_job_holds_the_outputs(tmp_path: Path) -> None:
    layout = Layout(n_per_split={"train": 480, "validation": 61, "test": 67}, shards_per_split=4)
    manifest = make_text_dataset(str(tmp_path / "data"), TextSpec(layout=layout, class_rate=0.35, seed=11))
    config_path, output = _job(tmp_path, "mp", tmp_path / "data", tracking=True)
    # Another job holds the outputs (#54): ranks started by plain horovodrun all stop with rank 0's one-line
    # refusal (none waits for rank 0 in a collective), and `hvdtrain train` refuses before launching any rank.
    with leases.hold(str(output), str(tmp_path / "checkpoints" / "mp")):
        held = f"train.output {output} is being written by"
        ranks = _refused([str(mp.horovodrun()), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, "-m",
                          "hvdtrain.training.train", str(config_path)])
        assert {line.split("]", 1)[0] for line in ranks.stdout.splitlines() + ranks.stderr.splitlines()
                if held in line and f"pid {os.getpid()} since" in line} >= {"[0", "[1"}, ranks.stderr[-3000:]
        cli = _refused([sys.executable, "-m", "hvdtrain.cli", "train", str(config_path), "--np", "2"])
        assert cli.returncode == 3 and held in cli.stderr.strip().splitlines()[-1], cli.stderr[-3000:]
        assert "horovodrun" not in cli.stdout, cli.stdout  # no rank was launched
        assert not output.exists() and not (tmp_path / "mlflow").exists()  # the refused jobs wrote nothing
    proc = _horovodrun(config_path)
    result, report = _outputs(output)
    # where the time to the first step went: plain horovodrun, so the clock starts with the rank's process
    startup = report["startup"]
    assert list(startup) == ["interpreter and imports", "rendezvous", "data plan", "tracking", "model build",
                             "first step", "total"], startup
    assert all(v >= 0 for v in startup.values()) and startup["total"] > 0
    assert startup["total"] == pytest.approx(sum(v for k, v in startup.items() if k != "total"), abs=0.01)
    assert re.search(r"\[rank 0\] INFO start-up: [\d.]+ s to the first step \(interpreter and imports", proc.stderr)
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


def test_eight_ranks_train_and_evaluate_exactly_with_fewer_shards_than_ranks(tmp_path: Path) -> None:
    """8 Gloo ranks (1 intra-op thread each: 2 cores / 8 local ranks), a tiny model, 2 epochs of 3 steps on a
    train split of 3 very uneven shards (whole shards would leave most ranks nothing); validation has 3 shards
    and test 2, so some ranks have no evaluation batch. No hang; every rank runs the same steps on an equal
    share; the record trace shows each record at most once per epoch; evaluation counts every record exactly
    once."""
    from hvdtrain.data.trace import read_trace

    manifest = make_text_dataset(str(tmp_path / "data"), TextSpec(layout=Layout(shard_sizes={
        "train": [150, 40, 10], "validation": [21, 9, 3], "test": [17, 6]}), max_length=8, seed=8))
    trace = tmp_path / "trace"
    config_path, output = _job(tmp_path, "eight", tmp_path / "data", epochs=2, batch_size=8,
                               model={**TINY_MODEL, "embed_dim": 8, "ff_dim": 16}, record_trace=str(trace))
    _horovodrun(config_path, timeout=300, np=8)
    result, report = _outputs(output)
    ranks = report["rank_digest"]["ranks"]
    assert [r["rank"] for r in ranks] == list(range(8)) and [r["local_size"] for r in ranks] == [8] * 8
    assert report["rank_digest"]["agree"] and result["world_size"] == 8
    steps = report["training"]["steps_per_epoch"]
    assert steps == 200 // (8 * 8) == 3
    batches = [read_trace(str(trace / f"rank{r}.keys")) for r in range(8)]
    assert all(sorted(b) == list(range(2 * steps)) for b in batches)  # equal steps on every rank
    for epoch in range(2):
        seen = [k for b in batches for n in range(epoch * steps, (epoch + 1) * steps) for k in b[n]]
        assert len(seen) == len(set(seen)) == 8 * steps * 8  # each record at most once in the epoch
        assert 200 - len(seen) < 8 * 8  # fewer than size x batch left out
    _assert_complete(report, manifest)
    for split in ("validation", "test"):
        assert sum(map(sum, report["evaluation"][split]["confusion_matrix"])) == manifest.split(split).records


# -- features of the Horovod step, exact evaluation and exports ---------------------------------------

# Loads the exports in a fresh interpreter, predicts on token ids with both, and evaluates the test split
# single-process (one thread, as each of the two ranks had) with the same counting code.
FRESH_PROCESS_CHECK = """
import json, sys
import numpy as np, tensorflow as tf, keras
tf.config.threading.set_intra_op_parallelism_threads(1)
from hvdtrain import data
from hvdtrain.runtime import distributed
from hvdtrain.data import manifest
from hvdtrain.model import metrics
from hvdtrain.model import evaluation
from hvdtrain.training import steps
out, dataset = sys.argv[1], sys.argv[2]
model = keras.saving.load_model(out + '/model.keras')
served = tf.saved_model.load(out + '/saved_model')
ids = np.zeros((3, 16), np.int64)
ids[:, :6] = [[5, 6, 7, 8, 9, 10], [40, 41, 42, 43, 44, 45], [7, 50, 8, 51, 9, 52]]
mask = (ids > 0).astype(np.int64)
from_keras = model.predict({'input_ids': ids, 'attention_mask': mask}, verbose=0)
from_saved = served.serve({'input_ids': tf.constant(ids), 'attention_mask': tf.constant(mask)}).numpy()
distributed.init(use_horovod=False)
m = manifest.read(dataset)
batches = data.eval_dataset(m, 'test', rank=0, size=1, batch_size=16, features=['input_ids', 'attention_mask', 'label'])
counts = evaluation.count_split(steps.make_eval_step(model, 'label'), batches, 'label',
                                evaluation.empty_counts('multiclass', m.num_classes))
print(json.dumps({'keras': from_keras.tolist(), 'saved': from_saved.tolist(), 'cm': counts.confusion.tolist(),
                  'roc_auc': metrics.roc_auc_from_histogram(counts.histogram)}))
"""


def test_two_ranks_match_one_process_and_the_export_reloads(tmp_path: Path) -> None:
    """LR scaling: -np 2 reaches the accuracy of one process started without horovodrun; evaluation is exact in
    both; exports load elsewhere."""
    layout = Layout(n_per_split={"train": 640, "validation": 100, "test": 200}, shards_per_split=4)
    manifest = make_text_dataset(str(tmp_path / "data"), TextSpec(layout=layout, num_classes=2, class_rate=0.5, seed=21))
    # float16 on the wire and clipping with the overlapped all-reduce (the default, grouped, runs elsewhere)
    features = dict(epochs=4, fp16_allreduce=True, allreduce="overlap", lr_schedule="cosine", warmup_steps=5,
                    clip_norm=1.0,
                    early_stopping={"metric": "loss", "patience": 1}, progress="log", progress_every_steps=5)
    np2_config, np2_out = _job(tmp_path / "np2", "np2", tmp_path / "data", **features)
    timeline = tmp_path / "timeline.json"
    proc = _horovodrun(np2_config, timeout=400, launcher=("--timeline-filename", str(timeline)))
    one_config, one_out = _job(tmp_path / "one", "one", tmp_path / "data", **features)
    one_proc = _run([sys.executable, "-m", "hvdtrain.training.train", str(one_config)], timeout=300)  # no horovodrun
    (two, report), (one, one_report) = _outputs(np2_out), _outputs(one_out)
    # one process without horovodrun: the local backend, its result on stdout, no tracking (off in _job)
    assert json.loads(one_proc.stdout) == one and one["run_id"] is None
    assert one_report["training"]["world_size"] == 1 and one_report["training"]["backend"] == "local"
    _assert_complete(one_report, manifest)

    assert report["rank_digest"]["agree"] and two["world_size"] == 2 and one["world_size"] == 1
    assert min(two["test_accuracy"], one["test_accuracy"]) >= 0.9, (two, one)
    gap = abs(two["test_accuracy"] - one["test_accuracy"])
    assert gap <= 0.01 + 1e-9, (two["test_accuracy"], one["test_accuracy"])  # within 1 point (2 of 200 records)
    training = report["training"]
    assert training["steps_per_epoch"] == 640 // 32
    # gradients: the all-reduced float tensors that are not broadcasts (metric sums travel as float64);
    # compressed, each is named after its float16 cast
    grads = {name: dtypes for name, dtypes in wire_dtypes(timeline).items()
             if "Broadcast" not in name and dtypes & {"float16", "float32"}}
    assert not any("Grouped" in name for name in grads), grads  # one all-reduce per gradient
    assert grads and all(dtypes == {"float16"} for dtypes in grads.values()), grads  # float16 on the wire
    assert training["learning_rate"] == pytest.approx(0.006) and training["decay_steps"] == 4 * 20
    stopping = report["early_stopping"]
    assert len(stopping["values"]) == training["epochs"] and 1 <= stopping["best_epoch"] <= training["epochs"]
    assert all(h["validation"]["records"] == 100 for h in training["history"])
    assert "epoch 1/4 step 5/20: loss" in proc.stderr  # plain progress lines: stderr is not a terminal here
    _assert_complete(report, manifest)
    assert (np2_out / "confusion_matrix.png").stat().st_size > 1000

    check = _run([sys.executable, "-c", FRESH_PROCESS_CHECK, str(np2_out), str(tmp_path / "data")], timeout=120)
    fresh = json.loads(check.stdout.strip().splitlines()[-1])
    test = report["evaluation"]["test"]
    assert fresh["cm"] == test["confusion_matrix"]  # -np 2 counts == one process's counts
    assert fresh["roc_auc"] == test["roc_auc"] and test["roc_auc"] >= 0.9
    assert len(fresh["keras"]) == 3 and len(fresh["keras"][0]) == 2
    np.testing.assert_allclose(fresh["saved"], fresh["keras"], atol=1e-4)


def test_mlp_on_tabular_data_with_accumulation_and_bfloat16(tmp_path: Path) -> None:
    layout = Layout(n_per_split={"train": 768, "validation": 96, "test": 96})
    manifest = make_tabular_dataset(str(tmp_path / "data"), TabularSpec(layout=layout, num_classes=3, num_numeric=6,
                                                                        cardinalities=[5, 8, 3], seed=4))
    config_path, output = _job(tmp_path, "tabular", tmp_path / "data",
                               model={"kind": "mlp", "hidden_units": [32, 16], "dropout": 0.0},
                               epochs=3, learning_rate=0.005, grad_accum_steps=2, mixed_precision="bfloat16",
                               allreduce="overlap",
                               lr_schedule="linear", validate_every_epoch=True, progress="off")
    _horovodrun(config_path)
    result, report = _outputs(output)
    assert report["rank_digest"]["agree"] and result["world_size"] == 2
    training = report["training"]
    # each optimizer step: 2 micro-batches of 16 on each of 2 ranks
    assert training["steps_per_epoch"] == 768 // 64 and training["global_batch_size"] == 64
    assert [h["examples"] for h in training["history"]] == [768] * 3
    assert all(h["validation"] is not None for h in training["history"]) and report["early_stopping"] is None
    assert result["test_accuracy"] >= 0.8, report["evaluation"]["test"]
    _assert_complete(report, manifest)
    labels = json.loads((output / "labels.json").read_text())
    assert labels["model_kind"] == "mlp" and labels["inputs"] == ["numeric", "categorical"]
    assert labels["preprocessing"]["tabular"]["cardinalities"] == [5, 8, 3]
