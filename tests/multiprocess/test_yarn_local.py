"""The YARN launcher end to end on local Spark: ``python -m yarn.submit CONFIG --master local[2]``.

The same spark-submit command, driver (``horovod.spark.run`` or, for an elastic job, ``run_elastic``) and rank
function as on a cluster, with local Spark in place of YARN and this interpreter in place of the packed
environment. The ranks import the shipped code zip, train on a small synthetic dataset, and must finish with
identical weights. The helpers here are shared with test_hadoop_cluster.py.
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

from hvdtrain.core import config
from hvdtrain.data.synthetic import Layout, TextSpec, make_text_dataset
from hvdtrain.hadoop import fs
from hvdtrain.training import leases
from tests.support.proc_watch import ProcessWatcher

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


def test_local_elastic_submission_goes_on_after_a_lost_rank_with_the_shipped_code(dataset: Path,
                                                                                    tmp_path: Path) -> None:
    """``train.elastic`` on Spark (``horovod.spark.run_elastic``): the rank of virtual rank 1 is SIGKILLed, the
    survivor goes on in the same process (its Spark task stays), and Spark's retry of the lost rank's task
    (``local[2,4]``: 4 tries) may join again as a new host. The fixed-size path (``horovod.spark.run``) runs in
    the Ctrl-C test here and, to the end with a lost container, on the minicluster (tests/hadoop)."""
    from benchmarks import kill_drill

    output, trace = tmp_path / "run", tmp_path / "trace"
    job = write_job(tmp_path, "yarnlocal", str(dataset), str(output), epochs=4, record_trace=str(trace),
                    elastic={"min_ranks": 1, "max_ranks": 2, "commit_every_steps": EVERY},
                    yarn={"env": {"HOROVOD_FUSION_THRESHOLD": "0"}})
    log = tmp_path / "submit.log"
    watcher = ProcessWatcher(GLOO_EXEC_FN)
    watcher.start()
    with open(log, "w") as out:
        proc = subprocess.Popen(submit_command(job, "--master", "local[2,4]", "--num-workers", "2"), cwd=REPO,
                                env=submit_env(), stdout=out, stderr=subprocess.STDOUT, text=True)
        try:
            killed = _kill_a_rank_after(trace / "rank1.keys", KILL_AFTER, proc, log)
            code = proc.wait(timeout=600)
        finally:
            watcher.stop()
            if proc.poll() is None:
                proc.kill()
    text = log.read_text()
    assert code == 0, text[-6000:]
    _assert_no_key_or_environment_on_the_workers_command_lines(watcher)
    doc = read_records(records_uri(text))
    assert doc["ok"] and doc["errors"] == [], doc["errors"]
    result = doc["result"]
    # Resized without restarting the survivor (Spark's retry of the lost task may already be back at the reset)
    assert result["sizes"][0] == 2 and len(result["sizes"]) >= 2, result
    assert len({r[0] for r in kill_drill.segments(str(trace / "rank0.keys"))}) == 1  # virtual rank 0: one process
    assert result["ranks_agree"] and result["test_accuracy"] >= 0.8, result
    assert printed_result(text) == result == json.loads((output / "result.json").read_text())
    # The ranks imported the zip spark-submit shipped, not the checkout.
    assert all(r["code_from"].endswith(os.path.join("hvdtrain-code.zip", "hvdtrain")) for r in doc["ranks"])
    assert re.search(r"hvdtrain: training finished on [12] ranks: test accuracy", text), text[-3000:]
    assert (output / "model.keras").is_file() and (output / "eval_report.json").is_file()
    total = result["steps"]
    assert total == 4 * result["steps_per_epoch"]
    for v in range(2):  # every step of every virtual rank trained; redone: at most one commit interval
        runs = kill_drill.segments(str(trace / f"rank{v}.keys"))
        assert set().union(*(r[2] for r in runs)) == set(range(total)), (v, [(r[0], r[1], len(r[2])) for r in runs])
        assert all(0 <= kill_drill.read_to(a) - b[1] <= EVERY for a, b in zip(runs, runs[1:])), v
    runs = kill_drill.segments(str(trace / "rank1.keys"))
    assert runs[0][0] == killed and runs[1][0] != killed  # another process took virtual rank 1 over


GLOO_EXEC_FN = "horovod.spark.task.gloo_exec_fn"


def _assert_no_key_or_environment_on_the_workers_command_lines(watcher: ProcessWatcher) -> None:
    """#54 item 5 (scripts/patches/0011): every worker got Horovod's key and the job's environment (here the
    driver's output lease tokens), and no command line held either; upstream put the key, pickled, in each
    ``gloo_exec_fn`` argv and the environment in ``env K=V ...``."""
    from horovod.runner.common.util import codec, secret

    assert watcher.matched, f"no {GLOO_EXEC_FN} process was seen: the check would be empty"
    for args, environ in watcher.matched.values():
        words = " ".join(args).split()
        carried = codec.loads_base64(words[words.index(GLOO_EXEC_FN) + 2])  # the settings after the addresses
        assert carried.key is None, args
        assert secret.HOROVOD_SECRET_KEY in environ and environ.get(leases.HELD_ENV), sorted(environ)
    # the job's lines (other jobs on the machine are not this test's: a local horovodrun writes its ranks' lease
    # tokens, not secrets, into theirs)
    on_lines = [c for c in watcher.cmdlines if GLOO_EXEC_FN in c
                and (f"{secret.HOROVOD_SECRET_KEY}=" in c or f"{leases.HELD_ENV}=" in c)]
    assert on_lines == [], on_lines


EVERY, KILL_AFTER = 3, 7  # the elastic test's commit interval, and the steps virtual rank 1 reads before its kill


def _kill_a_rank_after(trace: Path, steps: int, proc: subprocess.Popen, log: Path) -> int:
    """SIGKILL the process whose trace (one virtual rank's) has read ``steps`` steps; returns its pid."""
    from benchmarks import kill_drill

    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the job ended (exit {proc.returncode}) before the kill:\n{log.read_text()[-4000:]}"
        runs = kill_drill.segments(str(trace))
        if runs and len(runs[-1][2]) >= steps:
            os.kill(runs[-1][0], signal.SIGKILL)
            return runs[-1][0]
        time.sleep(0.05)
    pytest.fail(f"virtual rank 1 did not read {steps} steps in time:\n{log.read_text()[-4000:]}")


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
