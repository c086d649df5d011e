"""``hvdtrain tune`` for real: 6 trials, eta 3, every trial ``horovodrun -np 2`` on a tiny text dataset shaped
like the demo's (hvdtrain.data.synthetic), 2 trials at once, MLflow in a local store.

One study serves every test here: the driver is SIGKILLed while trials run, then the same command is run
again and must finish the study (the killed driver's trials failed by the heartbeat check and queued again).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hvdtrain.core import config
from hvdtrain.data.synthetic import Layout, TextSpec, make_text_dataset
from hvdtrain.hadoop import fs

pytestmark = pytest.mark.multiprocess

REPO = Path(__file__).resolve().parents[2]
TRIALS = 6


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HOROVOD_", "OMPI_", "PMI_")) and k != "MLFLOW_TRACKING_URI"}
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)  # optuna may sit there
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=path, MLFLOW_DISABLE_TELEMETRY="true")
    return env


def _trial_processes(marker: str) -> list[int]:
    """Processes of this study's trials still alive (their command line names the study's folder)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline and "hvdtrain.training.train" in cmdline:
            out.append(int(pid))
    return out


def _describe(pid: int) -> str:
    """A process for a failure message: pid, state, parent and command line."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return f"{pid} (gone)"
    return f"{pid} state {stat[0]} ppid {stat[1]}: {cmdline[:400]}"


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tune")
    make_text_dataset(str(tmp / "data"), TextSpec(layout=Layout(n_per_split={"train": 128, "validation": 64,
                                                                             "test": 64})))
    cfg = config.from_dict({
        "name": "tune_demo", "workdir": str(tmp / "work"), "source": {"table": "demo.reviews"},
        "etl": {"output": str(tmp / "data")},
        "model": {"embed_dim": 8, "num_heads": 1, "ff_dim": 16, "num_layers": 1, "dropout": 0.0},
        "train": {"epochs": 3, "batch_size": 32, "shuffle_buffer": 64, "progress": "log"},  # 2 steps per epoch
        "tracking": {"registered_model_name": "tune_demo_best", "log_every_steps": 0},
        "monitoring": {"enabled": False}, "tune": {"heartbeat_seconds": 1},
    }, base_dir=str(tmp))
    job = tmp / "job.yaml"
    job.write_text(cfg.to_yaml())
    space = tmp / "space.yaml"
    space.write_text("train.learning_rate: {loguniform: [1.0e-5, 3.0e-2]}\nmodel.embed_dim: {choice: [8, 16]}\n")
    cmd = [sys.executable, "-m", "hvdtrain.cli", "tune", str(job), "--space", str(space), "--trials", str(TRIALS),
           "--np", "2", "--parallel", "2", "--eta", "3", "--min-epochs", "1",
           "--metric", "validation_loss"]  # accuracy on 64 rows after 2 steps ties, and a tie is promoted
    first = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in first.stdout:  # kill the driver while its trials 2 and 3 run
        seen.append(line)
        if "tune: trial 3 started" in line:
            break
    time.sleep(3)
    first.kill()
    first.wait()
    marker = str(tmp / "work" / "tune")
    deadline = time.time() + 60
    while _trial_processes(marker) and time.time() < deadline:  # the trials follow their driver
        time.sleep(1)
    orphans = [_describe(pid) for pid in _trial_processes(marker)]  # what outlived it, should one ever do so
    second = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=1200)
    assert second.returncode == 0, f"first run:\n{''.join(seen)[-3000:]}\nsecond run:\n{second.stdout[-4000:]}\n" \
                                   f"{second.stderr[-6000:]}"
    cfg = config.load(job)
    return {"cfg": cfg, "first": "".join(seen), "second": second.stdout, "orphans": orphans}


def _load(cfg):
    import optuna

    from hvdtrain import tune

    return optuna.load_study(study_name=cfg.tune.study, storage=tune.storage_url(cfg.tune))


def _client(cfg):
    import mlflow

    from hvdtrain.observe import tracking

    return mlflow.MlflowClient(tracking.resolve_store(None, {}, cfg.workdir).tracking_uri)


def test_the_study_ends_every_trial_and_prunes_some(study):
    from hvdtrain import tune

    trials = _load(study["cfg"]).get_trials()
    states = [t.state.name for t in trials]
    assert tune.done_count(trials) == TRIALS, states
    assert states.count("PRUNED") >= 1 and states.count("COMPLETE") >= 1, states
    for t in trials:
        if t.state.name == "PRUNED":  # stopped at a rung before the full budget, reported every epoch up to it
            assert t.user_attrs["pruned_at_epoch"] == max(t.intermediate_values) < 3
            assert sorted(t.intermediate_values) == list(range(1, max(t.intermediate_values) + 1))


def test_a_pruned_trial_ends_cleanly_on_every_rank_with_its_checkpoint(study):
    import json

    pruned = [t for t in _load(study["cfg"]).get_trials() if t.state.name == "PRUNED"]
    for t in pruned:
        result = json.loads(fs.read_bytes(fs.join(t.user_attrs["output"], "result.json")))
        assert result["world_size"] == 2 and result["ranks_agree"] is True  # both ranks stopped at one epoch
        assert result["epochs_run"] == t.user_attrs["pruned_at_epoch"]
        checkpoints = Path(t.user_attrs["output"]).parent / "checkpoints"
        assert any(p.name.startswith("ckpt-") for p in checkpoints.iterdir())


def test_the_killed_drivers_trials_were_failed_and_queued_again(study):
    trials = _load(study["cfg"]).get_trials()
    failed = [t for t in trials if t.state.name == "FAIL"]
    assert failed, "the driver was killed while trials ran: some must have been failed"
    for t in failed:
        retry = [r for r in trials if r.system_attrs.get("failed_trial") == t.number]
        assert len(retry) == 1 and retry[0].params == t.params, (t.number, [r.number for r in retry])
        assert retry[0].state.name in ("COMPLETE", "PRUNED")
    assert "tune: trial 3 started" in study["first"]
    assert study["orphans"] == [], f"trial processes outlived their killed driver: {study['orphans']}"


def test_mlflow_has_one_parent_and_a_child_per_trial(study):
    cfg = study["cfg"]
    client = _client(cfg)
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    runs = client.search_runs([exp.experiment_id], max_results=100)
    parents = [r for r in runs if "hvdtrain.tune.study" in r.data.tags and "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1
    parent = parents[0]
    trials = {t.user_attrs.get("mlflow_run_id"): t for t in _load(cfg).get_trials()
              if t.state.name in ("COMPLETE", "PRUNED")}
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id
                and "pruned" in r.data.tags]
    assert len(children) == TRIALS and {r.info.run_id for r in children} == set(trials)
    assert all(r.info.status == "FINISHED" for r in children)
    killed = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id
              and "pruned" not in r.data.tags]  # the runs of trials whose driver was killed
    assert all(r.info.status == "FAILED" for r in killed), [(r.info.run_id, r.info.status) for r in killed]
    for child in children:
        t = trials[child.info.run_id]
        assert child.data.tags["pruned"] == str(t.state.name == "PRUNED")
        assert float(child.data.params["train.learning_rate"]) == pytest.approx(t.params["train.learning_rate"])
        history = client.get_metric_history(child.info.run_id, "val_loss")
        assert [m.value for m in sorted(history, key=lambda m: m.step)] == \
            pytest.approx([t.intermediate_values[e] for e in sorted(t.intermediate_values)])


def test_the_parent_run_holds_the_best_trial_and_the_plot(study):
    cfg = study["cfg"]
    client = _client(cfg)
    best = _load(cfg).best_trial
    runs = client.search_runs([client.get_experiment_by_name(cfg.tracking.experiment).experiment_id],
                              "tags.`hvdtrain.tune.study` = 'tune_demo'")
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    assert parent.info.status == "FINISHED"
    assert parent.data.metrics["best_validation_loss"] == pytest.approx(best.value)
    assert parent.data.metrics["best_trial"] == best.number
    assert parent.data.tags["best.model.embed_dim"] == str(best.params["model.embed_dim"])
    local = Path(client.download_artifacts(parent.info.run_id, "trials.png"))
    assert local.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    versions = client.search_model_versions("name='tune_demo_best'")
    assert [v.run_id for v in versions] == [best.user_attrs["mlflow_run_id"]]


def test_the_command_prints_trials_sorted_and_the_best(study):
    out = study["second"]
    best = _load(study["cfg"]).best_trial
    header = next(i for i, line in enumerate(out.splitlines()) if line.startswith("trial  state"))
    rows = out.splitlines()[header + 1:]
    values = [float(r.split()[2]) for r in rows if len(r.split()) > 2 and r.split()[1] in ("COMPLETE", "PRUNED")]
    assert values == sorted(values) and len(values) == TRIALS  # a loss: the smallest first
    assert f"best trial {best.number}: validation_loss {best.value:.4f}" in out
    assert f"model folder  {best.user_attrs['output']}" in out
    assert os.path.isfile(os.path.join(best.user_attrs["output"], "model.keras"))
