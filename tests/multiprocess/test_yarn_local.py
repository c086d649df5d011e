"""The YARN launcher end to end on local Spark: ``python -m yarn.submit CONFIG --master local[2]``.

The same spark-submit command, driver (``horovod.spark.run``) and rank function as on a
cluster, with local Spark in place of YARN and this interpreter in place of the packed
environment. The ranks import the shipped code zip, train on a small synthetic dataset, and
must finish with identical weights. The helpers here are shared with test_hadoop_cluster.py.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import pytest

from hvdtrain import config, fs
from hvdtrain.synthetic import Layout, TextSpec, make_text_dataset

pytestmark = [pytest.mark.multiprocess, pytest.mark.spark]

REPO = Path(__file__).resolve().parents[2]
TINY_MODEL = {"embed_dim": 16, "num_heads": 2, "ff_dim": 32, "num_layers": 1, "dropout": 0.1}
RECORDS_LINE = re.compile(r"^hvdtrain: every rank's record: (\S+)$", re.M)


# -- helpers (shared with test_hadoop_cluster.py) ---------------------------------------------------

def submit_env(**extra: str) -> dict[str, str]:
    """This environment without a launcher's leftovers, with the repo importable."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HOROVOD_", "OMPI_", "PMI_")) and k != "MLFLOW_TRACKING_URI"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO), MLFLOW_DISABLE_TELEMETRY="true", **extra)
    return env


def write_job(folder: Path, name: str, data: str, output: str, tracking: bool = False,
              yarn: Optional[dict[str, Any]] = None, **train: Any) -> Path:
    """A job config for a small dataset; returns its path."""
    cfg = config.from_dict({
        "name": name, "workdir": str(folder), "source": {"table": "demo.reviews"},
        "etl": {"output": data}, "model": TINY_MODEL,
        "train": {"epochs": 2, "batch_size": 16, "learning_rate": 0.003, "shuffle_buffer": 64, "output": output,
                  **train},
        "tracking": {"enabled": tracking}, "yarn": yarn or {},
    }, base_dir=str(folder))
    path = folder / f"{name}.yaml"
    path.write_text(cfg.to_yaml())
    return path


def submit_command(config_path: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "yarn.submit", str(config_path), *args]


def run_submit(cmd: list[str], timeout: float, env: Optional[dict[str, str]] = None) -> subprocess.CompletedProcess:
    """Run the launcher as a user would; fail with the output's tail unless it exits 0."""
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env or submit_env(), capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(cmd)} did not finish in {timeout}s\n{(exc.stderr or b'')[-4000:]!r}")
    assert proc.returncode == 0, \
        f"exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-6000:]}"
    return proc


def records_uri(stdout: str) -> str:
    """Where the driver wrote every rank's record (it prints the path)."""
    match = RECORDS_LINE.search(stdout)
    assert match, f"the driver did not print where the records are:\n{stdout[-3000:]}"
    return match.group(1)


def read_records(uri: str) -> dict[str, Any]:
    return json.loads(fs.read_bytes(uri))


def assert_trained(doc: dict[str, Any], world_size: int, min_accuracy: float) -> None:
    """Every rank trained, rank 0 reported, the ranks ended with identical weights."""
    assert doc["ok"] and doc["errors"] == [], doc["errors"]
    assert doc["world_size"] == world_size and [r["rank"] for r in doc["ranks"]] == list(range(world_size))
    result = doc["result"]
    assert result["world_size"] == world_size and result["ranks_agree"] is True
    assert result["test_accuracy"] >= min_accuracy, result
    assert not any(r["tensorflow_preloaded"] for r in doc["ranks"])  # GPUs pinned before TF loads


def printed_result(stdout: str) -> dict[str, Any]:
    """The JSON the driver prints after its rank-0 marker."""
    from yarn.driver import RESULT_MARK

    text = stdout[stdout.index(RESULT_MARK) + len(RESULT_MARK):]
    return json.JSONDecoder().raw_decode(text.lstrip())[0]


# -- tests ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("yarn-data")
    make_text_dataset(str(root), TextSpec(layout=Layout(n_per_split={"train": 480, "validation": 61, "test": 67},
                                                        shards_per_split=4), class_rate=0.35, seed=11))
    return root


def test_local_submission_trains_on_two_ranks_with_the_shipped_code(dataset: Path, tmp_path: Path) -> None:
    output = tmp_path / "run"
    job = write_job(tmp_path, "yarnlocal", str(dataset), str(output),
                    yarn={"env": {"HOROVOD_FUSION_THRESHOLD": "0"}})
    start = time.monotonic()
    proc = run_submit(submit_command(job, "--master", "local[2]", "--num-workers", "2"), timeout=240)
    elapsed = time.monotonic() - start
    doc = read_records(records_uri(proc.stdout))
    assert_trained(doc, world_size=2, min_accuracy=0.8)
    assert printed_result(proc.stdout) == doc["result"] == json.loads((output / "result.json").read_text())
    # The ranks imported the zip spark-submit shipped, not the checkout.
    assert all(r["code_from"].endswith(os.path.join("hvdtrain-code.zip", "hvdtrain")) for r in doc["ranks"])
    assert "hvdtrain: training finished on 2 ranks: test accuracy" in proc.stdout
    assert (output / "model.keras").is_file() and (output / "eval_report.json").is_file()
    print(f"local YARN rehearsal: {elapsed:.0f}s")


def test_ctrl_c_releases_the_local_job(dataset: Path, tmp_path: Path) -> None:
    import psutil

    # Epochs enough that the job cannot end before the signal, which is sent once the ranks train.
    job = write_job(tmp_path, "yarnstop", str(dataset), str(tmp_path / "run"), epochs=5000)
    log = tmp_path / "stderr.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(submit_command(job, "--master", "local[2]", "--num-workers", "2"), cwd=REPO,
                                env=submit_env(), stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            for line in proc.stdout:  # the launcher echoes the command, then the driver names its app
                if line.startswith("hvdtrain: Spark application"):
                    break
            children = psutil.Process(proc.pid).children()
            assert children, "spark-submit is not running under the launcher"
            group = os.getpgid(children[0].pid)  # spark-submit leads a session of its own
            deadline = time.monotonic() + 600
            while "epoch 1/" not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.5)  # until the ranks train: Horovod, Gloo and the input pipeline are all up
            assert proc.poll() is None, f"the job ended before the signal:\n{log.read_text()[-3000:]}"
            proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=90)
        finally:
            if proc.poll() is None:
                proc.kill()
    stderr = log.read_text()
    assert code == 130, stderr[-3000:]
    assert "hvdtrain: interrupted; the application was released" in stderr
    deadline = time.monotonic() + 30
    while _alive(group) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _alive(group), "spark-submit, the driver or a rank outlived the launcher"


def _alive(group: int) -> bool:
    """Whether any process of a process group still runs (zombies do not count)."""
    import psutil

    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == group and p.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.Error):
            continue
    return False
