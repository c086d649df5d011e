"""The launchers on a real Spark standalone cluster whose two workers are two hosts: host-a and host-b.

One cluster per session (``standalone_cluster`` in conftest.py). The same commands that target
YARN run with ``--master spark://127.0.0.1:PORT``: the ETL builds the dataset from the demo's
sample table, training reads it over WebHDFS (so each rank stages shards on its own host's disk)
and loses one executor JVM mid-training, and scoring applies the trained model. The steps share
their outputs, so the module runs them in order. An elastic job (``train.elastic``, Horovod's
``run_elastic``) then loses host-b's executor and must go on at one rank, then grow back on host-b.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from benchmarks import kill_drill
from hvdtrain.core import config
from hvdtrain.data import manifest
from tests.multihost.test_multihost import StageWatcher
from tests.multiprocess.test_yarn_local import read_records, records_uri, submit_env
from tests.standalone.conftest import HOSTS, StandaloneCluster
from tests.support.proc_watch import ProcessWatcher
from tests.support.webhdfs_server import WebHdfsServer

# One cluster and three Spark applications: minutes on an idle machine, far more under load (15 min for the ETL
# alone at a load average of 25 on 2 cores).
pytestmark = [pytest.mark.standalone, pytest.mark.timeout(3600)]

REPO = Path(__file__).resolve().parents[2]
ROWS = 400
SECRET = "Pl4nted-St4ndal0ne-5ecret"  # yarn.env PGPASSWORD (#54): in every rank, on no command line
EPOCHS, BATCH, EVERY = 3, 8, 4
TINY_MODEL = {"embed_dim": 16, "num_heads": 2, "ff_dim": 32, "num_layers": 1, "dropout": 0.1}


@dataclass
class World:
    cluster: StandaloneCluster
    folder: Path
    server: WebHdfsServer
    config: Path  # the job's YAML: ETL, training and scoring read the same one


@pytest.fixture(scope="module")
def world(standalone_cluster: StandaloneCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    folder = tmp_path_factory.mktemp("standalone")
    root = folder / "namenode"
    root.mkdir()
    with WebHdfsServer(str(root)) as server:
        cfg = config.from_dict({
            "name": "standalone", "workdir": str(folder),
            "source": {"table": "demo.reviews", "sample": {"rows": ROWS, "num_classes": 2, "seed": 3}},
            "etl": {"output": str(root / "ds"), "max_length": 16, "vocab_size": 120, "min_shards_per_split": 2},
            "model": TINY_MODEL,
            "train": {"epochs": EPOCHS, "batch_size": BATCH, "learning_rate": 0.003, "shuffle_buffer": 64,
                      "progress": "log", "record_trace": str(folder / "trace")},
            "checkpoint": {"every_steps": EVERY, "keep_last": 2},
            "fault": {"peer_timeout": 30, "stall_timeout": 180, "restart_backoff": 1},
            "tracking": {"enabled": False},
            # One core and a small heap per executor: each worker offers one core, so one rank per host.
            "yarn": {"executor_cores": 1, "executor_memory": "1g", "driver_memory": "1g",
                     "python": sys.executable, "env": {"HOROVOD_GLOO_IFACE": "lo", "PGPASSWORD": SECRET}},
        }, base_dir=str(folder))
        path = folder / "job.yaml"
        path.write_text(cfg.to_yaml())
        yield World(standalone_cluster, folder, server, path)


def finish(proc: subprocess.Popen, timeout: float) -> int:
    """Wait for a launcher; past ``timeout`` stop it as Ctrl-C would (it releases its application) and fail."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
        pytest.fail(f"{' '.join(proc.args)} did not finish in {timeout}s")


def submit(module: str, w: World, *args: str, timeout: float = 900) -> str:
    """Run a launcher against the cluster; its output (it must exit 0)."""
    log = w.folder / f"{module}.log"
    with open(log, "w") as out:
        # The driver (client mode) binds and advertises loopback only.
        proc = subprocess.Popen([sys.executable, "-m", module, str(w.config), "--master", w.cluster.url, *args],
                                cwd=REPO, env=submit_env(SPARK_LOCAL_IP="127.0.0.1"), stdout=out,
                                stderr=subprocess.STDOUT, text=True)
        code = finish(proc, timeout)
    text = log.read_text()
    assert code == 0, f"exit {code}\n{text[-8000:]}"
    assert f"--master {w.cluster.url}" in text  # the launcher echoed the spark-submit it ran
    return text


def test_etl_runs_on_the_cluster(world: World) -> None:
    submit("yarn.etl_submit", world, "--create-sample-table")
    m = manifest.read(str(world.folder / "namenode" / "ds"))
    assert sum(m.split(s).records for s in m.splits) + m.source["rows_rejected"] \
        + m.source["duplicates_dropped"] == ROWS


def _kill_an_executor_mid_training(w: World, proc: subprocess.Popen, deadline: float) -> int:
    """SIGKILL host-b's executor JVM once rank 0 trained past the first checkpoint; returns the batch it had reached."""
    trace = str(w.folder / "trace" / "rank0.keys")
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"training ended (exit {proc.returncode}) before the kill"
        now = kill_drill._current_pid(trace, 0)
        if now is not None and now[1] >= EVERY + 2:
            pids = w.cluster.executor_pids("host-b")
            assert len(pids) == 1, pids
            os.kill(pids[0], signal.SIGKILL)
            return now[1]
        time.sleep(0.05)
    pytest.fail("training did not pass its first checkpoint in time")


@pytest.fixture(scope="module")
def trained(world: World) -> Iterator[dict[str, Any]]:
    """Training over WebHDFS on both hosts, one executor JVM killed mid-training, relaunched by the restart policy."""
    cmd = [sys.executable, "-m", "yarn.submit", str(world.config), "--master", world.cluster.url, "--num-workers", "2",
           "--max-restarts", "1", f"etl.output={world.server.uri('/ds')}"]
    roots = {h: world.cluster.host_tmp(h) for h in HOSTS}
    log = world.folder / "train.log"
    processes = ProcessWatcher("horovod.spark.task.gloo_exec_fn")  # every rank a Spark task starts
    processes.start()
    with StageWatcher(roots) as watcher, open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=submit_env(SPARK_LOCAL_IP="127.0.0.1"), stdout=out,
                                stderr=subprocess.STDOUT, text=True)
        try:
            _kill_an_executor_mid_training(world, proc, time.monotonic() + 900)
        finally:
            code = finish(proc, 900)
            processes.stop()
    text = log.read_text()
    assert code == 0, text[-8000:]
    yield {"doc": read_records(records_uri(text)), "staged": watcher.seen, "log": text,
           "output": Path(config.load(str(world.config)).train.output), "processes": processes}


def test_training_spans_both_hosts_with_local_ranks_by_host(trained: dict[str, Any]) -> None:
    doc = trained["doc"]
    assert doc["ok"] and doc["world_size"] == 2 and doc["result"]["ranks_agree"] is True, doc
    assert sorted(r["host"] for r in doc["ranks"]) == list(HOSTS)  # one rank in each worker's namespace
    report = json.loads((trained["output"] / "eval_report.json").read_text())
    placement = sorted((r["host"], r["local_rank"], r["local_size"]) for r in report["rank_digest"]["ranks"])
    assert placement == [("host-a", 0, 1), ("host-b", 0, 1)]  # Horovod saw two hosts, one slot each
    assert report["rank_digest"]["agree"] and len({r["sha256"] for r in report["rank_digest"]["ranks"]}) == 1
    assert all(r["code_from"].endswith(os.path.join("hvdtrain-code.zip", "hvdtrain")) for r in doc["ranks"])


def test_the_ranks_get_yarn_env_s_secret_from_the_shipped_file_never_a_command_line(trained: dict[str, Any]) -> None:
    """#54: on a cluster master, yarn.env's PGPASSWORD is not the executors' environment but a 0600 file shipped
    with --files that the executors' Python daemon (yarn.spark_daemon) reads back; the training driver leaves it out
    of what Horovod's driver sends. Every rank of both tries (on both hosts) still has it, and no command line
    while they ran (spark-submit, the driver, the workers' executor JVMs, the daemons, the ranks) held it."""
    watched = trained["processes"]
    ranks = {pid: env for pid, (_, env) in watched.matched.items() if env.get("HOROVOD_HOSTNAME", "").startswith("host-")}
    assert len(ranks) >= 4, sorted(ranks)  # two tries of two ranks
    assert {pid: env.get("PGPASSWORD") == SECRET for pid, env in ranks.items()} == {pid: True for pid in ranks}
    assert any("yarn.spark_daemon" in c for c in watched.cmdlines)
    assert [c for c in watched.cmdlines if SECRET in c] == []


def test_each_host_stages_its_shards_in_a_folder_named_by_its_hostname(trained: dict[str, Any]) -> None:
    for host, folders in trained["staged"].items():
        used = {name for name, copies in folders.items() if copies}
        assert used and all(name.startswith(f"hvdtrain-stage-{host}-") for name in used), (host, folders)


def test_a_killed_executor_jvm_is_recovered_by_the_restart_policy_with_exact_resume(trained: dict[str, Any],
                                                                                   world: World) -> None:
    doc = trained["doc"]
    assert len(doc["restarts"]) == 1, doc["restarts"]
    report = json.loads((trained["output"] / "eval_report.json").read_text())
    assert report["resumed_from"], report  # the relaunch continued from a checkpoint, not from step 0
    steps = manifest.read(str(world.folder / "namenode" / "ds")).split("train").records // (BATCH * 2)
    kill_drill.assert_resumed_once_exactly(str(world.folder / "trace"), 2, EPOCHS, steps, BATCH, EVERY)


def test_scoring_runs_on_the_cluster(world: World, trained: dict[str, Any]) -> None:
    out = submit("yarn.score", world, "--model", str(trained["output"]), "--output-table", "demo.preds",
                 "--partition", "ds=1", "--overwrite")
    report = json.loads((Path(config.load(str(world.config)).score.report_dir) / "score_report.json").read_text())
    assert report["rows_in"] == ROWS and report["scored"] + report["rejected"] == ROWS, (report, out[-2000:])
    assert report["scored"] > 0 and report["tasks"] >= 1


ELASTIC_EPOCHS = 80  # 1,600 steps: long enough for host-b to come back (a new executor, a new task, a new rank)


def test_an_elastic_job_goes_on_without_a_lost_host_and_grows_back_when_it_returns(world: World,
                                                                                  trained: dict[str, Any]) -> None:
    folder = world.folder / "elastic"
    trace, output = folder / "trace", folder / "run"
    cmd = [sys.executable, "-m", "yarn.submit", str(world.config), "--master", world.cluster.url, "--num-workers", "2",
           f"etl.output={world.server.uri('/ds')}", f"train.epochs={ELASTIC_EPOCHS}", f"train.output={output}",
           f"train.record_trace={trace}", f"checkpoint.dir={folder / 'checkpoints'}",
           f"train.elastic={{min_ranks: 1, max_ranks: 2, commit_every_steps: {EVERY}}}"]
    log = world.folder / "elastic.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=submit_env(SPARK_LOCAL_IP="127.0.0.1"), stdout=out,
                                stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 900
            while not trace.joinpath("rank1.keys").exists() or \
                    len(kill_drill.segments(str(trace / "rank1.keys"))[-1][2]) < EVERY + 2:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
                time.sleep(0.05)
            pids = world.cluster.executor_pids("host-b")
            assert len(pids) == 1, pids
            os.kill(pids[0], signal.SIGKILL)
        finally:
            code = finish(proc, 900)
    text = log.read_text()
    assert code == 0, text[-8000:]
    doc = read_records(records_uri(text))
    result = doc["result"]
    sizes = result["sizes"]
    assert sizes[0] == 2 and 1 in sizes and sizes[-1] == 2 and result["ranks_agree"], result  # shrank, grew back
    assert sorted(r["host"] for r in doc["ranks"]) == list(HOSTS), doc["ranks"]  # a rank on host-b again
    total = result["steps"]
    for v in range(2):  # every step of both virtual ranks trained; redone at most one commit interval
        runs = kill_drill.segments(str(trace / f"rank{v}.keys"))
        assert set().union(*(r[2] for r in runs)) == set(range(total)), v
        assert all(0 <= kill_drill.read_to(a) - b[1] <= EVERY for a, b in zip(runs, runs[1:])), v
