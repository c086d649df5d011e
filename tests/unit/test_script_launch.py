"""Running a user's Horovod script: ``hvdtrain run`` (horovodrun) and ``hvdtrain yarn run`` (the plan,
the dry run, the exit code). Fast: no Spark, no Horovod; the end-to-end runs are in
tests/multiprocess/test_script_runs.py.
"""
from __future__ import annotations

import io
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from hvdtrain import cli
from hvdtrain.core import config
from hvdtrain.core.errors import ConfigError
from hvdtrain.runtime import supervise
from tests.unit.test_yarn_command import ENV, GPU_BUILD, FakeSubmission, deps, inputs
from yarn import driver, executor, submit
from yarn import run as yarn_run

REPO = Path(__file__).resolve().parents[2]
KERAS2_SCRIPT = "import tensorflow as tf\nopt = tf.keras.optimizers.SGD(lr=0.1)\n"


def test_worst_rank_decides_the_exit_code() -> None:
    assert supervise.worst_code([0, 3, 1]) == 3
    assert supervise.worst_code([0, -9, 4]) == 137  # killed by SIGKILL
    assert supervise.worst_code([], 1) == 1 and supervise.worst_code([0, 0]) == 0
    output = "Process 0 exit with status code 1.\nProcess 1 exit with status code 7.\n"
    assert supervise.rank_codes(output) == [1, 7]
    # the rank horovodrun terminated after rank 1's failure (SIGTERM, 143) is not the job's failure
    output = ("Process 1 exit with status code 3.\nTerminating remaining workers after failure of Process 1.\n"
              "Process 0 exit with status code 143.\n")
    assert supervise.worst_code(supervise.rank_codes(output)) == 3
    records = [{"rank": 0, "exit_code": 0}, {"rank": 1, "exit_code": 3, "error": "x"}]
    assert driver.job_exit_code(records, script=True) == 3
    assert driver.job_exit_code([], script=True) == 1


def test_local_command_is_the_script_under_horovodrun() -> None:
    cmd = cli.horovod_command(["python", "train.py", "--epochs", "2"], 3, 60)
    assert cmd[1:] == ["-np", "3", "-H", "localhost:3", "--gloo", "--start-timeout", "60",
                       sys.executable, "-m", "hvdtrain.runtime.rank_env", "python", "train.py", "--epochs", "2"]
    assert cli.horovod_command(["python", "t.py"], 1) == ["python", "t.py"]
    args = cli.parse_args(["run", "--np", "2", "--max-restarts", "1", "t.py", "--np", "7", "x=1"])
    assert (args.np, args.max_restarts, args.script, args.script_args) == (2, 1, "t.py", ["--np", "7", "x=1"])


def test_run_refuses_a_missing_script(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["run", "--np", "2", str(tmp_path / "nope.py")]) == 2
    assert "nope.py does not exist" in capsys.readouterr().err


def _job(tmp_path: Path, **yarn) -> config.JobConfig:
    return config.from_dict({"name": "train", "workdir": str(tmp_path), "tracking": {"enabled": False},
                             "yarn": yarn})


def test_yarn_plan_ships_the_script_folder_and_runs_it_on_every_rank(tmp_path: Path) -> None:
    job = submit.ScriptJob("/tmp/stage/script.zip", "train.py", ("--epochs", "2"), "hdfs://nn:8020/runs/t")
    plan = submit.build_plan(_job(tmp_path, queue="prod", env={"NCCL_DEBUG": "INFO"}), "yarn", inputs(),
                             is_file=lambda p: True, script=job)
    argv = plan.argv
    assert argv[argv.index("--files") + 1] == "/tmp/stage/script.zip"  # client mode: the YAML stays here
    assert argv[argv.index("--queue") + 1] == "prod" and f"{ENV}#env" in argv
    assert "spark.executorEnv.NCCL_DEBUG=INFO" in argv
    assert argv[-10:] == ["--result", "hdfs://nn:8020/runs/t/yarn_result.json", "--script-zip", "script.zip",
                          "--script", "train.py", "--script-args", '["--epochs", "2"]',
                          "--logs", "hdfs://nn:8020/runs/t/logs"]
    local = submit.build_plan(_job(tmp_path), "local[2]", inputs(archive=None), is_file=lambda p: True, script=job)
    assert local.argv[local.argv.index("--script-zip") + 1] == "/tmp/stage/script.zip"  # the rehearsal's ranks


def test_yarn_run_dry_run_shows_the_same_submission(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    script = tmp_path / "code" / "train.py"
    script.parent.mkdir()
    script.write_text(KERAS2_SCRIPT)
    (tmp_path / "me.keytab").write_text("k")
    out = io.StringIO()
    code = yarn_run.main(["--num-workers", "3", "--gpus-per-worker", "1", "--queue", "ml", "--principal", "me@R",
                          "--keytab", str(tmp_path / "me.keytab"), "--set", f"yarn.env_cache={tmp_path}/envs",
                          "--set", "yarn.env.GLOO_X=1", "--output", "hdfs://nn/runs/x", "--dry-run",
                          str(script), "--epochs", "5"], deps(out, probe_build=lambda: GPU_BUILD))
    assert code == 0
    text = out.getvalue()
    for expected in ("--queue ml", "--principal me@R", "--conf spark.executor.resource.gpu.amount=1",
                     "--conf spark.executor.instances=3", "--num-proc 3", "--conf spark.executorEnv.GLOO_X=1",
                     "--script train.py", "--script-args " + shlex.quote('["--epochs", "5"]'),
                     "--name hvdtrain-train"):
        assert expected in text, expected
    err = capsys.readouterr().err
    assert f"{script}:2:" in err and "learning_rate=" in err  # check-script ran first
    assert not (tmp_path / "envs").exists()


def test_yarn_run_exit_code_is_the_worst_ranks(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    script = tmp_path / "code" / "train.py"
    script.parent.mkdir()
    script.write_text("print('hi')\n")
    (script.parent / "helper.py").write_text("X = 1\n")
    seen = {}

    class Job(FakeSubmission):
        def wait(self) -> int:
            p = self.plans[-1]
            seen["zip"] = zipfile.ZipFile(p.argv[p.argv.index("--script-zip") + 1]).namelist()
            Path(p.result_uri).parent.mkdir(parents=True)
            Path(p.result_uri).write_text(json.dumps({"ranks": [
                {"rank": 0, "host": "h", "exit_code": 0, "log": "l0"},
                {"rank": 1, "host": "h", "exit_code": 3, "log": "l1"}]}))
            return 3

    code = yarn_run.main(["--num-workers", "2", "--master", "local[2]", "--output", str(tmp_path / "out"),
                          str(script)], deps(io.StringIO(), submission=Job(3)))
    assert code == 3 and sorted(seen["zip"]) == ["helper.py", "train.py"]
    assert "failed (the worst rank exited 3)" in capsys.readouterr().err


def test_a_huge_script_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "data.bin").write_bytes(b"x" * 2048)
    with pytest.raises(ConfigError, match="holds 0 MB.*read data from HDFS"):
        yarn_run.zip_folder(str(tmp_path), str(tmp_path / "out.zip"), limit=1024)
    assert yarn_run.job_name("2-train v2.py") == "script_2-train_v2"


def test_rank_runs_the_unpacked_script_and_keeps_its_log(tmp_path: Path, monkeypatch) -> None:
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "train.py").write_text("import os, sys\nprint('rank', os.environ['HOROVOD_RANK'], sys.argv[1:])\n"
                                     "open('data.txt').read()\nsys.exit(4)\n")
    (folder / "data.txt").write_text("shipped")
    zipped = yarn_run.zip_folder(str(folder), str(tmp_path / "s.zip"))
    monkeypatch.setenv("HOROVOD_RANK", "1")
    record = executor.run_script({"zip": zipped, "script": "train.py", "args": ["--a"], "logs": str(tmp_path / "logs"),
                                  "executor_cores": 1})
    assert record["exit_code"] == 4 and record["rank"] == 1 and "exited with code 4" in record["error"]
    assert (tmp_path / "logs" / "rank1.log").read_text() == "rank 1 ['--a']\n"
    assert record["container_log"] is None  # off YARN: no container log folder


def _zipped_script(tmp_path: Path, source: str) -> tuple[str, Path]:
    """(a user's folder holding train.py = ``source``, zipped as ``yarn run`` ships it; an empty container log folder)."""
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "train.py").write_text(source)
    container_logs = tmp_path / "container-logs"
    container_logs.mkdir()
    return yarn_run.zip_folder(str(folder), str(tmp_path / "s.zip")), container_logs


def test_on_yarn_the_rank_log_is_written_in_the_container_log_folder_and_copied(tmp_path: Path, monkeypatch) -> None:
    """A NodeManager sets LOG_DIRS; the rank's log is rank<N>.log in the first folder, appended to by a relaunch in
    the same container; the copy under ``logs`` is each run's own output."""
    zipped, container_logs = _zipped_script(tmp_path, "import sys\nprint('run', sys.argv[1])\n")
    monkeypatch.setenv("LOG_DIRS", f"{container_logs},{tmp_path / 'other-disk'}")
    monkeypatch.setenv("CONTAINER_ID", "container_1_0001_01_000002")
    monkeypatch.setenv("HOROVOD_RANK", "0")
    for n in ("1", "2"):
        record = executor.run_script({"zip": zipped, "script": "train.py", "args": [n], "logs": str(tmp_path / "logs"),
                                      "executor_cores": 1})
        assert record["exit_code"] == 0 and record["container_log"] == "rank0.log"
        assert (tmp_path / "logs" / "rank0.log").read_text() == f"run {n}\n"
    assert (container_logs / "rank0.log").read_text() == "run 1\nrun 2\n"
    assert executor.container_log_dir({"LOG_DIRS": ""}) is None
    assert executor.rank_banner({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "CONTAINER_ID": "container_9"}) == \
        "hvdtrain: rank 1 of 2 starts in container_9"
    summary = json.dumps({"ranks": [{**record, "host": "h"}]})
    (tmp_path / "yarn_result.json").write_text(summary)
    code, text = yarn_run.script_summary(str(tmp_path / "yarn_result.json"))
    assert code == 0 and "(as written: yarn logs -containerId container_1_0001_01_000002 -log_files rank0.log)" in text


RANK_RUNNER = "import json, sys\nfrom yarn import executor\nexecutor.run_script(json.loads(sys.argv[1]))\n"


@pytest.mark.slow
def test_a_killed_ranks_output_is_in_its_container_log_folder_before_the_kill(tmp_path: Path) -> None:
    """What YARN's log aggregation uploads of a container killed mid-run: the rank's output so far, since it is
    written to the container's log folder as it comes (the copy under ``logs`` is made only at the end)."""
    zipped, container_logs = _zipped_script(tmp_path, "import time\nprint('epoch 1 done', flush=True)\ntime.sleep(600)\n")
    spec = {"zip": zipped, "script": "train.py", "args": [], "logs": str(tmp_path / "logs"), "executor_cores": 1}
    env = {**os.environ, "LOG_DIRS": str(container_logs), "HOROVOD_RANK": "3", "PYTHONPATH": str(REPO)}
    # Its own session: the kill takes the rank and the script, as a NodeManager kills a container's process group
    rank = subprocess.Popen([sys.executable, "-c", RANK_RUNNER, json.dumps(spec)], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL)
    log = container_logs / "rank3.log"
    try:
        deadline = time.monotonic() + 60
        while b"epoch 1 done" not in (log.read_bytes() if log.exists() else b""):
            assert rank.poll() is None and time.monotonic() < deadline, "the script's line never reached rank3.log"
            time.sleep(0.05)
    finally:
        os.killpg(rank.pid, signal.SIGKILL)
        rank.wait()
    assert log.read_text() == "epoch 1 done\n"
    assert not (tmp_path / "logs").exists()  # the end-of-run copy never happened: the container's log is what is left
