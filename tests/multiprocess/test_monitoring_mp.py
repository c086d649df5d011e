"""Monitoring during a real ``horovodrun -np 2`` run: scrape rank 0's /metrics while it trains, parse every
rank's textfile with prometheus_client's parser, find the step-time breakdown in MLflow and summarize the
Horovod timeline the run captured."""
from __future__ import annotations

import glob
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import parser  # a required dependency (setup.py)

from hvdtrain.data.synthetic import Layout, TextSpec, make_text_dataset
from hvdtrain.observe import timeline
from tests.multiprocess.test_train_mp import REPO, _env, _job, _outputs
from tests.support import mp

pytestmark = pytest.mark.multiprocess


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def _parse(text: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for family in parser.text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def _one(samples: dict[str, list], name: str) -> float:
    (sample,) = samples[name]
    return sample.value


def _watch(proc: subprocess.Popen, port: int, rank1_file: Path) -> tuple[dict, dict]:
    """While training runs: one scrape of /metrics and one read of rank 1's file, both mid-training."""
    scraped, filed = None, None
    while proc.poll() is None and (scraped is None or filed is None):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
                got = _parse(resp.read().decode())
            if scraped is None and _one(got, "hvdtrain_step") >= 1:
                scraped = got
        except OSError:
            pass  # not serving yet (or any more)
        if filed is None and rank1_file.is_file():
            got = _parse(rank1_file.read_text())
            if _one(got, "hvdtrain_training_active") == 1 and _one(got, "hvdtrain_step") >= 1:
                filed = got
        time.sleep(0.1)
    return scraped, filed


def test_metrics_breakdown_and_timeline_of_a_two_rank_run(tmp_path: Path) -> None:
    mp.horovodrun()
    make_text_dataset(str(tmp_path / "data"), TextSpec(layout=Layout(
        n_per_split={"train": 480, "validation": 32, "test": 32}, shards_per_split=2), seed=4))
    port = _free_port()
    config_path, output = _job(tmp_path, "mon", tmp_path / "data", tracking=True,
                               timeline={"start_step": 3, "steps": 4})
    overrides = [f"monitoring.port={port}", "monitoring.interval_seconds=0.2", "checkpoint.every_steps=5",
                 "monitoring.step_breakdown=true"]
    env = {**_env(), "PYTHONPATH": os.pathsep.join([str(REPO), *os.environ.get("PYTHONPATH", "").split(os.pathsep)])}
    proc = subprocess.Popen([str(mp.horovodrun()), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, "-m",
                             "hvdtrain.training.train", str(config_path), *overrides], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    files = tmp_path / "metrics"
    try:
        scraped, filed = _watch(proc, port, files / "hvdtrain_mon_rank1.prom")
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr[-5000:]
    result, report = _outputs(output)
    run_id = result["run_id"]

    # mid-training: rank 0's endpoint and rank 1's file, each with its own rank label
    assert scraped is not None, "never scraped /metrics while training"
    assert filed is not None, "never read rank 1's file while training"
    for samples, rank in ((scraped, "0"), (filed, "1")):
        assert _one(samples, "hvdtrain_training_active") == 1 and 1 <= _one(samples, "hvdtrain_step") <= 30
        for name, found in samples.items():
            for s in found:
                assert (s.labels["job"], s.labels["run_id"], s.labels["rank"]) == ("mon", run_id, rank), name
                assert s.labels["host"] == socket.gethostname(), name

    # after training: every rank's final file
    assert sorted(os.listdir(files)) == ["hvdtrain_mon_rank0.prom", "hvdtrain_mon_rank1.prom"]
    for rank in (0, 1):
        final = _parse((files / f"hvdtrain_mon_rank{rank}.prom").read_text())
        assert _one(final, "hvdtrain_training_active") == 0
        assert _one(final, "hvdtrain_samples_total") == 30 * 16
        assert _one(final, "hvdtrain_step_duration_seconds_count") == 30 and _one(final, "hvdtrain_step") == 30
        assert _one(final, "hvdtrain_epoch") == 2
        assert 0 < _one(final, "hvdtrain_allreduce_seconds_total") < _one(final, "hvdtrain_step_duration_seconds_sum")
        assert _one(final, "hvdtrain_checkpoint_save_duration_seconds_count") == 6  # steps 5, 10, ..., 30
        assert (_one(final, "hvdtrain_checkpoint_save_bytes") > 0) == (rank == 0)  # rank 0 writes
        assert _one(final, "hvdtrain_learning_rate") == pytest.approx(0.003 * 2)
        assert 0 < _one(final, "hvdtrain_loss") < 5
        assert _one(final, "hvdtrain_skipped_steps_total") == 0 and _one(final, "hvdtrain_restarts_total") == 0
        assert abs(time.time() - _one(final, "hvdtrain_last_progress_timestamp_seconds")) < 600

    # the step-time breakdown: logged by rank 0, in MLflow per epoch
    assert len(re.findall(r"epoch \d time over 2 ranks: input wait \d+%, compute \d+%, all-reduce \d+%", stderr)) == 2
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow/mlflow.db")
    fractions = client.get_metric_history(run_id, "time_allreduce_fraction")
    assert [m.step for m in fractions] == [1, 2] and all(0 < m.value < 1 for m in fractions)
    assert {m.value for m in client.get_metric_history(run_id, "slowest_rank")} <= {0.0, 1.0}

    # the Horovod timeline: written by rank 0, attached to the run, summarized
    (attached,) = glob.glob(f"{tmp_path}/mlflow/artifacts/**/timeline/{timeline.FILENAME}", recursive=True)
    phases, activities = timeline.summarize_events(timeline.load_events(Path(attached).read_text(), attached))
    by = {p.phase: p for p in phases}
    assert by["negotiation"].count > 0 and by["all-reduce"].wall_seconds > 0
    assert by["memcpy into fusion buffer"].count > 0 and "GLOO_ALLREDUCE" in activities
    cli = subprocess.run([sys.executable, "-m", "hvdtrain.cli", "timeline", "summarize", str(output / timeline.FILENAME)],
                         cwd=REPO, env=env, capture_output=True, text=True)
    assert cli.returncode == 0 and re.search(r"^all-reduce\s+\d", cli.stdout, re.M), cli.stderr
