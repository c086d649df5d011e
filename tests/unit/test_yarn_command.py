"""The YARN launcher's plan and its guards: exact spark-submit argv lists, one-line errors,
dry runs that run nothing, the environment cache, and releasing the application on the way out.

Everything here is fast: no Spark, no Horovod, no cluster. Facts about the world (the Horovod
build, where spark-submit is, whether a keytab exists) are passed in.
"""
from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from hvdtrain.core import config, secrets
from hvdtrain.core.errors import ConfigError, EnvironmentProblem
from hvdtrain.hadoop import fs
from hvdtrain.hadoop.envcheck import CommandResult, HorovodBuild
from yarn import driver, executor, packaging, submit
from yarn.submit import DRIVER_SCRIPT, GPU_SCRIPT, Inputs, SubmitPlan

SPARK_SUBMIT = "/opt/spark/bin/spark-submit"
PYTHON = "/home/ml/hvdtrain/.venv/bin/python"
ZIP = "/tmp/stage/hvdtrain-code.zip"
YAML = "/tmp/stage/hvdtrain-job.yaml"
ENV = "hdfs://nn:8020/user/ml/envs/0123abcd.tar.gz"
CPU_BUILD = HorovodBuild(version="0.28.1", tensorflow=True, gloo=True)
GPU_BUILD = HorovodBuild(version="0.28.1", tensorflow=True, gloo=True, nccl=True, cuda=True)


def job(**yarn: Any) -> config.JobConfig:
    return config.from_dict({
        "name": "reviews", "workdir": "/home/ml/work", "source": {"table": "db.reviews"},
        "etl": {"output": "hdfs://nn:8020/data/reviews"}, "train": {"output": "hdfs://nn:8020/runs/reviews"},
        "tracking": {"uri": "http://mlflow:5000"}, "yarn": yarn,
    })


def inputs(build: HorovodBuild = CPU_BUILD, archive: str | None = ENV) -> Inputs:
    return Inputs(SPARK_SUBMIT, PYTHON, ZIP, YAML, archive, build)


def plan(cfg: config.JobConfig, master: str = "yarn", build: HorovodBuild = CPU_BUILD, **kw: Any) -> SubmitPlan:
    archive = None if master.startswith("local") else ENV
    return submit.build_plan(cfg, master, inputs(build, archive), is_file=kw.pop("is_file", lambda p: True))


def driver_args(config_arg: str, n: int, executable: str = "./env/bin/python", timeout: int = 600) -> list[str]:
    return [DRIVER_SCRIPT, "--config", config_arg, "--num-proc", str(n), "--start-timeout", str(timeout),
            "--executable", executable, "--result", "hdfs://nn:8020/runs/reviews/yarn_result.json"]


def confs(*pairs: str) -> list[str]:
    return [x for pair in pairs for x in ("--conf", pair)]


YARN_CORE = ("spark.task.maxFailures=1", "spark.yarn.maxAppAttempts=1", "spark.dynamicAllocation.enabled=false")
# Spark's UI and event logs hide secrets, by hvdtrain's regex unless the user set one (#54 item 6)
REDACTION = tuple(f"{k}={v}" for k, v in secrets.spark_redaction_conf({}).items())
C1 = "-XX:TieredStopAtLevel=1"  # the JVMs that only carry a training job start on the C1 JIT (JDK_JAVA_OPTIONS)


# -- exact command lines ----------------------------------------------------------------------

def test_cpu_job_in_client_mode() -> None:
    p = plan(job(num_workers=3, executor_cores=2, executor_memory="6g", driver_memory="2g"))
    assert p.argv == [
        SPARK_SUBMIT, "--master", "yarn", "--deploy-mode", "client", "--name", "hvdtrain-reviews",
        "--driver-memory", "2g", "--executor-memory", "6g", "--executor-cores", "2",
        "--archives", f"{ENV}#env", "--py-files", ZIP,  # client mode: the driver reads the YAML here
        *confs(*YARN_CORE, "spark.executor.instances=3", "spark.task.cpus=2",
               "spark.scheduler.minRegisteredResourcesRatio=1.0",
               "spark.scheduler.maxRegisteredResourcesWaitingTime=600s",
               "spark.pyspark.python=./env/bin/python", f"spark.pyspark.driver.python={PYTHON}",
               # Spark's overhead for a 6 GB heap (614 MB) + yarn.rank_memory's 4 GB for the rank's process
               "spark.executor.memoryOverhead=4710m",
               f"spark.yarn.appMasterEnv.JDK_JAVA_OPTIONS={C1}", f"spark.executorEnv.JDK_JAVA_OPTIONS={C1}",
               *REDACTION),
        *driver_args(YAML, 3),  # client mode: the driver runs here and reads the local file
    ]
    assert p.env == {"PYTHONUNBUFFERED": "1", "JDK_JAVA_OPTIONS": C1}  # spark-submit's JVMs
    assert p.deploy_mode == "client" and p.cwd == "/tmp/stage"


def test_gpu_kerberos_queue_job_in_cluster_mode() -> None:
    cfg = job(num_workers=4, gpus_per_worker=2, executor_cores=8, executor_memory="30g", queue="ml.gpu",
              deploy_mode="cluster", principal="ml@EXAMPLE.COM", keytab="/home/ml/ml.keytab", start_timeout=900,
              env={"NCCL_DEBUG": "INFO", "HOROVOD_FUSION_THRESHOLD": "0", "JDK_JAVA_OPTIONS": "-Dx=1"},
              spark_conf={"spark.executor.memoryOverhead": "4g", "spark.executor.extraJavaOptions": "-Dy=2",
                          "spark.yarn.appMasterEnv.JDK_JAVA_OPTIONS": "-Dz=3"})
    p = plan(cfg, build=GPU_BUILD)
    assert p.argv == [
        SPARK_SUBMIT, "--master", "yarn", "--deploy-mode", "cluster", "--name", "hvdtrain-reviews",
        "--queue", "ml.gpu", "--principal", "ml@EXAMPLE.COM", "--keytab", "/home/ml/ml.keytab",
        "--driver-memory", "4g", "--executor-memory", "30g", "--executor-cores", "8",
        "--archives", f"{ENV}#env", "--py-files", ZIP, "--files", f"{YAML},{GPU_SCRIPT}",
        *confs(*YARN_CORE, "spark.executor.instances=4", "spark.task.cpus=8",
               "spark.scheduler.minRegisteredResourcesRatio=1.0",
               "spark.scheduler.maxRegisteredResourcesWaitingTime=900s",
               "spark.pyspark.python=./env/bin/python", "spark.pyspark.driver.python=./env/bin/python",
               "spark.yarn.appMasterEnv.PYSPARK_PYTHON=./env/bin/python",
               "spark.executor.resource.gpu.amount=2", "spark.task.resource.gpu.amount=2",
               "spark.executor.resource.gpu.discoveryScript=./gpu_discovery.sh",
               # the carrier JVMs' option, the user's own after it; a cluster's extraJavaOptions left as they are
               f"spark.yarn.appMasterEnv.JDK_JAVA_OPTIONS={C1} -Dz=3",
               "spark.executorEnv.HOROVOD_FUSION_THRESHOLD=0", f"spark.executorEnv.JDK_JAVA_OPTIONS={C1} -Dx=1",
               "spark.executorEnv.NCCL_DEBUG=INFO", *REDACTION,
               "spark.executor.memoryOverhead=4g", "spark.executor.extraJavaOptions=-Dy=2"),
        # cluster mode: the driver runs in the application master, beside the shipped --files
        *driver_args("hvdtrain-job.yaml", 4, timeout=900),
    ]
    assert os.path.basename(GPU_SCRIPT) == "gpu_discovery.sh" and os.access(GPU_SCRIPT, os.X_OK)


def test_local_master_runs_the_same_driver_with_this_interpreter() -> None:
    p = plan(job(num_workers=2, queue="ignored-locally", executor_cores=8, deploy_mode="cluster"), master="local[2]")
    assert p.argv == [
        SPARK_SUBMIT, "--master", "local[2]", "--deploy-mode", "client", "--name", "hvdtrain-reviews",
        "--driver-memory", "4g", "--py-files", ZIP,
        *confs("spark.task.maxFailures=1", "spark.task.cpus=1", "spark.log.level=WARN",
               f"spark.pyspark.python={PYTHON}", f"spark.pyspark.driver.python={PYTHON}", *REDACTION),
        *driver_args(YAML, 2, executable=PYTHON),
    ]
    # ranks import the shipped zip; the executors are threads of the driver's JVM
    assert p.env == {"PYTHONUNBUFFERED": "1", "PYTHONPATH": ZIP, "JDK_JAVA_OPTIONS": C1}
    assert p.is_local and any("client mode" in n for n in p.notes)


def test_standalone_master_ships_the_env_and_asks_for_one_core_per_rank() -> None:
    p = plan(job(num_workers=2, queue="yarn-only", executor_cores=1, deploy_mode="cluster"),
             master="spark://127.0.0.1:7077")
    assert p.argv == [
        SPARK_SUBMIT, "--master", "spark://127.0.0.1:7077", "--deploy-mode", "client", "--name", "hvdtrain-reviews",
        "--driver-memory", "4g", "--executor-memory", "8g", "--executor-cores", "1",
        "--archives", f"{ENV}#env", "--py-files", ZIP,
        *confs("spark.task.maxFailures=1", "spark.dynamicAllocation.enabled=false", "spark.cores.max=2",
               "spark.task.cpus=1", "spark.scheduler.minRegisteredResourcesRatio=1.0",
               "spark.scheduler.maxRegisteredResourcesWaitingTime=600s", "spark.pyspark.python=./env/bin/python",
               f"spark.pyspark.driver.python={PYTHON}", "spark.executorEnv.PYTHONPATH=hvdtrain-code.zip",
               f"spark.executorEnv.JDK_JAVA_OPTIONS={C1}", *REDACTION),  # no YARN application master
        *driver_args(YAML, 2),
    ]
    assert not p.is_local and "PYTHONPATH" not in p.env  # ranks import the zip Spark ships
    assert any("client mode" in n for n in p.notes)  # standalone runs Python drivers in client mode only
    assert submit.is_standalone_master("spark://a:7077,b:7077") and not submit.is_standalone_master("spark://a")


def test_an_elastic_job_keeps_an_executor_per_max_rank_and_lets_a_lost_ranks_task_retry() -> None:
    def elastic(workers: int, **el: Any) -> config.JobConfig:
        return config.from_dict({**job(num_workers=workers, executor_cores=1).to_dict(),
                                 "train": {"output": "hdfs://nn:8020/runs/reviews", "elastic": el}})

    p = plan(elastic(2, min_ranks=1, max_ranks=3))
    assert "spark.task.maxFailures=1" not in p.argv and "spark.task.maxFailures=4" in p.argv and "spark.executor.instances=3" in p.argv
    assert driver_args(YAML, 2, timeout=600)[:6] == p.argv[p.argv.index(DRIVER_SCRIPT):][:6]  # 2 ranks to start
    standalone = plan(elastic(2, min_ranks=1, max_ranks=3), master="spark://127.0.0.1:7077")
    assert "spark.cores.max=3" in standalone.argv
    with pytest.raises(ConfigError, match=r"^--num-workers must be within train.elastic.min_ranks 2 and max_ranks 3"):
        plan(elastic(1, min_ranks=2, max_ranks=3))
    with pytest.raises(ConfigError, match=r"^--master gives each task one attempt.*local\[N,F\]"):
        plan(elastic(2, max_ranks=2), master="local[2]")
    assert "--num-proc" in plan(elastic(2, max_ranks=2), master="local[2,4]").argv
    with pytest.raises(ConfigError, match=r"^--master runs 2 task\(s\) at a time, but an elastic job keeps a task "
                                          r"for each of train.elastic.max_ranks 3; use --master local\[3,4\]"):
        plan(elastic(2, max_ranks=3), master="local[2,4]")
    assert [submit.local_attempts(m) for m in ("local", "local[2]", "local[*,3]", "local[2,4]")] == [1, 1, 3, 4]


def test_a_shared_interpreter_ships_no_env() -> None:
    cfg = job(python="/opt/conda/envs/ml/bin/python", executor_cores=1)
    p = submit.build_plan(cfg, "spark://127.0.0.1:7077",
                          submit.Inputs(SPARK_SUBMIT, PYTHON, ZIP, YAML, None, CPU_BUILD, cfg.yarn.python),
                          is_file=lambda p: True)
    assert "--archives" not in p.argv and "spark.pyspark.python=/opt/conda/envs/ml/bin/python" in p.argv
    assert p.argv[p.argv.index("--executable") + 1] == "/opt/conda/envs/ml/bin/python"
    assert any(n.startswith("yarn.python /opt/conda/envs/ml/bin/python: nothing is shipped") for n in p.notes)
    with pytest.raises(ConfigError, match="yarn.python must be an absolute path"):
        job(python="env/bin/python")


def test_the_submitting_hosts_hdfs_umask_reaches_the_containers_unless_yarn_env_sets_one() -> None:
    """#54: what the ranks and executors write to HDFS withholds the submitter's HVDTRAIN_HDFS_UMASK."""
    private = submit.Inputs(SPARK_SUBMIT, PYTHON, ZIP, YAML, ENV, CPU_BUILD, umask="077")
    for mode in ("client", "cluster"):
        conf = dict(submit.spark_conf(job(), "yarn", mode, private))
        assert conf[f"spark.executorEnv.{fs.UMASK_ENV}"] == "077"
        assert conf.get(f"spark.yarn.appMasterEnv.{fs.UMASK_ENV}") == ("077" if mode == "cluster" else None)
    assert dict(submit.spark_conf(job(env={fs.UMASK_ENV: "007"}), "yarn", "client", private))[
        f"spark.executorEnv.{fs.UMASK_ENV}"] == "007"  # yarn.env wins
    assert not any(fs.UMASK_ENV in k for k, _ in submit.spark_conf(job(), "yarn", "client", inputs()))  # the default


def test_yarn_env_reaches_executors_and_rank_processes() -> None:
    cfg = job(env={"GLOO_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "1"})
    assert ("--conf", "spark.executorEnv.GLOO_SOCKET_IFNAME=eth0") in zip(plan(cfg).argv, plan(cfg).argv[1:])
    assert driver.horovod_env(cfg.yarn) == {"PYTHONUNBUFFERED": "1", "MALLOC_TOP_PAD_": str(64 << 20),
                                       "GLOO_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "1"}
    # a secret in yarn.env: on a cluster the executors' daemon puts it back, so the driver does not send it
    secret = job(env={"GLOO_SOCKET_IFNAME": "eth0", "PGPASSWORD": "pw-1234"}).yarn
    assert driver.horovod_env(secret)["PGPASSWORD"] == "pw-1234"  # a local master: the driver's threads
    assert "PGPASSWORD" not in driver.horovod_env(secret, executors_sealed=True)
    assert driver.horovod_env(secret, executors_sealed=True)["GLOO_SOCKET_IFNAME"] == "eth0"


def test_etl_and_scoring_executors_get_mallocs_top_pad_unless_the_job_sets_one() -> None:
    pad = ("spark.executorEnv.MALLOC_TOP_PAD_", str(64 << 20))
    assert pad in submit.worker_env_conf(job().yarn)
    assert submit.worker_env_conf(job(env={"MALLOC_TOP_PAD_": "0"}).yarn) == [("spark.executorEnv.MALLOC_TOP_PAD_", "0")]
    assert submit.worker_env_conf(job(env={"GLIBC_TUNABLES": "glibc.malloc.top_pad=1"}).yarn) == [
        ("spark.executorEnv.GLIBC_TUNABLES", "glibc.malloc.top_pad=1")]
    # set cluster-wide in spark_conf: that entry (added after these) is the only one
    assert submit.worker_env_conf(job(spark_conf={"spark.executorEnv.MALLOC_TOP_PAD_": "4096"}).yarn) == []


def test_rank_processes_get_mallocs_top_pad_unless_the_job_sets_one() -> None:
    assert driver.horovod_env(job(env={"MALLOC_TOP_PAD_": "0"}).yarn)["MALLOC_TOP_PAD_"] == "0"
    tunables = {"GLIBC_TUNABLES": "glibc.malloc.top_pad=1048576"}
    assert "MALLOC_TOP_PAD_" not in driver.horovod_env(job(env=tunables).yarn)
    cluster_wide = job(spark_conf={"spark.executorEnv.MALLOC_TOP_PAD_": "4096"})
    assert "MALLOC_TOP_PAD_" not in driver.horovod_env(cluster_wide.yarn)  # the executors' own value reaches the ranks


def test_local_outputs_and_a_local_env_cache_are_flagged_for_cluster_runs() -> None:
    cfg = config.from_dict({"name": "demo", "workdir": "/home/ml/work", "source": {"table": "db.t"}})
    notes = submit.build_plan(cfg, "yarn", inputs(), is_file=lambda p: True).notes
    assert any(n.startswith("etl.output /home/ml/work/data is a local path") for n in notes)
    assert any("yarn.env_cache=hdfs://" in n for n in notes)
    assert any(n.startswith("tracking.uri is unset") for n in notes)
    assert plan(job(env_cache="hdfs://nn:8020/envs")).notes == []


def test_dry_run_output_is_the_exact_command_and_environment() -> None:
    p = plan(job(principal="ml@EXAMPLE.COM", keytab="/home/ml/my keytab", queue="q"))
    text = submit.format_plan(p)
    lines = text.splitlines()
    assert "cd /tmp/stage" in lines and "export PYTHONUNBUFFERED=1" in lines
    command = text[text.index(SPARK_SUBMIT):].replace("\\\n", " ")
    assert shlex.split(command) == p.argv  # copy-pasteable, quoting included


# -- one-line errors ----------------------------------------------------------------------------

@pytest.mark.parametrize("cfg, master, build, is_file, message", [
    (job(gpus_per_worker=1), "yarn", CPU_BUILD, None,
     "yarn.gpus_per_worker needs Horovod built with NCCL, but this host's build, which the job would ship, has none"),
    (job(gpus_per_worker=1), "local[2]", GPU_BUILD, None, "yarn.gpus_per_worker needs --master yarn"),
    (job(principal="ml@EXAMPLE.COM", keytab="/nope/ml.keytab"), "yarn", CPU_BUILD, lambda p: False,
     "yarn.keytab does not exist or is not a file"),
    (job(num_workers=3), "local[2]", CPU_BUILD, None,
     "--master runs 2 task(s) at a time, but 3 ranks must run together; use --master local[3]"),
    (job(), "mesos://host:5050", CPU_BUILD, None, "--master must be yarn (the cluster), spark://HOST:PORT"),
    (job(), "spark://host", CPU_BUILD, None, "--master must be yarn (the cluster), spark://HOST:PORT"),
    (job(), "local[two]", CPU_BUILD, None, "--master must be yarn, local, local[N] or local[*]"),
    (job(spark_conf={"spark.dynamicAllocation.enabled": "true"}), "yarn", CPU_BUILD, None,
     "yarn.spark_conf.spark.dynamicAllocation.enabled is set by the launcher"),
    (job(spark_conf={"spark.executor.instances": "9"}), "yarn", CPU_BUILD, None, "use --num-workers"),
])
def test_invalid_submissions_fail_with_one_clear_line(cfg, master, build, is_file, message) -> None:
    with pytest.raises(ConfigError) as info:
        submit.build_plan(cfg, master, inputs(build), is_file=is_file or (lambda p: True))
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("build, message", [
    (HorovodBuild(error="ModuleNotFoundError: No module named 'horovod'"), "Horovod does not import"),
    (HorovodBuild(version="0.28.1", error="ImportError: libtensorflow_framework.so.2"), "built without TensorFlow"),
    (HorovodBuild(version="0.28.1", tensorflow=True), "built without Gloo"),
])
def test_a_horovod_build_that_cannot_run_the_job_is_refused(build, message) -> None:
    with pytest.raises(EnvironmentProblem, match=message):
        submit.build_plan(job(), "yarn", inputs(build))


def test_principal_without_keytab_and_bad_worker_counts(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(job().to_yaml())
    with pytest.raises(ConfigError, match=r"^yarn.principal and yarn.keytab must be set together"):
        config.load(path, ["yarn.principal=ml@EXAMPLE.COM"])
    with pytest.raises(ConfigError, match="pass --principal user@REALM --keytab"):  # the config names the flags
        job(principal="ml@EXAMPLE.COM")
    with pytest.raises(ConfigError, match=r"^--num-workers must be >= 1 \(got 0\)$"):
        submit.check_flags(submit.parse_args([str(path), "--num-workers", "0"]))
    with pytest.raises(ConfigError, match=r"^yarn.num_workers must be >= 1 \(pass --num-workers N\) \(got 0\)$"):
        job(num_workers=0)


def test_spark_submit_not_found_names_where_it_looked() -> None:
    from hvdtrain.hadoop import envcheck

    with pytest.raises(EnvironmentProblem, match=r"spark-submit not found \(looked in /opt/spark/bin/spark-submit"):
        envcheck.find_spark_submit({"SPARK_HOME": "/opt/spark"}, lambda name: None, PYTHON, lambda p: False)
    found = envcheck.find_spark_submit({"SPARK_HOME": "/opt/spark"}, lambda name: None, PYTHON,
                                       lambda p: p == "/opt/spark/bin/spark-submit")
    assert found == "/opt/spark/bin/spark-submit"


# -- main(): flags, dry run, failures -----------------------------------------------------------

class Refuse:
    """A collaborator that must not be called."""

    def __init__(self, what: str):
        self.what = what

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"{self.what} was called")


def deps(out: io.StringIO, **kw: Any) -> submit.Collaborators:
    base = dict(probe_build=lambda: CPU_BUILD, find_spark_submit=lambda: SPARK_SUBMIT,
                identity=lambda build: ["pkg==1"], ensure_archive=Refuse("packing"),
                submission=Refuse("spark-submit"), env={"HADOOP_CONF_DIR": "/etc/hadoop/conf"}, out=out)
    base.update(kw)
    return submit.Collaborators(**base)


@pytest.fixture
def job_file(tmp_path: Path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(job(env_cache=str(tmp_path / "envs")).to_yaml())
    return path


def test_dry_run_prints_the_plan_and_runs_nothing(job_file: Path, tmp_path: Path) -> None:
    (tmp_path / "me.keytab").write_text("x")
    out = io.StringIO()
    code = submit.main([str(job_file), "train.epochs=1", "--num-workers", "5", "--queue", "prod",
                        "--principal", "ml@EXAMPLE.COM", "--keytab", str(tmp_path / "me.keytab"), "--dry-run"],
                       deps(out))
    assert code == 0
    text = out.getvalue()
    digest = packaging.env_hash(["pkg==1"])
    for expected in ("--queue prod", "--principal ml@EXAMPLE.COM", f"--keytab {tmp_path / 'me.keytab'}",
                     "--conf spark.executor.instances=5", "--num-proc 5",
                     "--archives " + shlex.quote(f"{tmp_path / 'envs' / digest}.tar.gz#env")):
        assert expected in text, expected
    assert not (tmp_path / "envs").exists()  # nothing packed, nothing uploaded
    assert not os.path.exists(os.path.join(tempfile.gettempdir(), "hvdtrain-submit-reviews"))  # nothing staged


def test_flags_override_the_config(job_file: Path) -> None:
    args = submit.parse_args([str(job_file), "a.b=1", "--num-workers", "6", "--gpus-per-worker", "1",
                              "--queue", "root.ml", "--principal", "svc/host@R", "--keytab", "k.keytab"])
    assert args.overrides == ["a.b=1"]  # overrides may follow flags
    assert submit.flag_overrides(args, "/work") == [
        "yarn.num_workers=6", "yarn.gpus_per_worker=1", 'yarn.queue="root.ml"', 'yarn.principal="svc/host@R"',
        'yarn.keytab="/work/k.keytab"']
    cfg = config.load(job_file, submit.flag_overrides(args, "/work"))
    assert (cfg.yarn.num_workers, cfg.yarn.queue, cfg.yarn.keytab) == (6, "root.ml", "/work/k.keytab")


def test_errors_are_one_line_and_exit_by_kind(job_file: Path, capsys) -> None:
    code = submit.main([str(job_file), "--gpus-per-worker", "1", "--dry-run"], deps(io.StringIO()))
    assert code == 2  # a config error
    err = capsys.readouterr().err
    assert err.startswith("hvdtrain: error: yarn.gpus_per_worker needs Horovod built with NCCL")
    assert err.count("\n") == 1

    def missing() -> str:
        raise EnvironmentProblem("spark-submit not found (looked in /x)")

    assert submit.main([str(job_file)], deps(io.StringIO(), find_spark_submit=missing)) == 4  # environment
    assert "spark-submit not found" in capsys.readouterr().err
    out = io.StringIO()  # a dry run still shows the command, with a bare spark-submit
    assert submit.main([str(job_file), "--dry-run"], deps(out, find_spark_submit=missing)) == 0
    assert "\nspark-submit \\\n  --master yarn" in out.getvalue()
    assert submit.main([str(job_file)], deps(io.StringIO(), env={})) == 4
    assert "export HADOOP_CONF_DIR=/etc/hadoop/conf" in capsys.readouterr().err


class FakeSubmission:
    """Records the plan; exits with a given code."""

    def __init__(self, code: int, app_id: str | None = None, state: str | None = None,
                 memory_kill: str | None = None):
        self.code, self.app_id, self.state, self.plans = code, app_id, state, []
        self.memory_kill = memory_kill  # what Submission parsed from the driver's lines

    def __call__(self, plan: SubmitPlan) -> "FakeSubmission":
        self.plans.append(plan)
        return self

    def __enter__(self) -> "FakeSubmission":
        return self

    def __exit__(self, *exc: Any) -> bool:
        return False

    def wait(self) -> int:
        return self.code

    state_unknown = "the `yarn` command is not on PATH; put your Hadoop client's bin folder on PATH"

    def final_state(self, attempts: int = 5) -> str | None:
        self.asked_attempts = attempts
        return self.state


def test_a_real_submission_ships_code_and_config_and_cleans_up(job_file: Path, tmp_path: Path, capsys) -> None:
    seen: dict[str, Any] = {}

    class Inspect(FakeSubmission):
        def wait(self) -> int:
            p = self.plans[-1]
            seen["zip"] = zipfile.ZipFile(p.argv[p.argv.index("--py-files") + 1]).namelist()
            assert "--files" not in p.argv  # client mode: the driver reads the YAML on this host
            seen["yaml"] = config.load(p.argv[p.argv.index("--config") + 1])
            seen["cwd"] = p.cwd
            return 1

    archives = []
    fake = Inspect(1, "application_1_7")
    code = submit.main([str(job_file), "--num-workers", "2"], deps(
        io.StringIO(), submission=fake, ensure_archive=lambda y, ident: archives.append(ident) or
        packaging.EnvArchive(ENV, "0123abcd", False)))
    assert code == 5 and archives == [["pkg==1"]]  # a step (spark-submit) failed
    assert "spark-submit failed (exit code 1); see the messages above; logs: yarn logs -applicationId " \
           "application_1_7" in capsys.readouterr().err
    assert {"hvdtrain/training/train.py", "etl/job.py", "yarn/driver.py", "yarn/executor.py",
            "yarn/gpu_discovery.sh"} <= set(seen["zip"])
    assert not any("__pycache__" in name for name in seen["zip"])
    assert seen["yaml"].yarn.num_workers == 2 and seen["yaml"].etl.output == "hdfs://nn:8020/data/reviews"
    assert not os.path.exists(seen["cwd"])  # the staging folder is gone


# -- releasing the application -----------------------------------------------------------------

def test_release_decisions() -> None:
    cluster = plan(job(deploy_mode="cluster"))
    client = plan(job())
    local = plan(job(), master="local[2]")
    assert submit.release_actions(cluster, "application_17_3", running=True) == ["kill-app", "terminate"]
    assert submit.release_actions(cluster, "application_17_3", running=False) == ["kill-app"]
    assert submit.release_actions(cluster, None, running=True) == ["terminate"]  # not submitted yet
    assert submit.release_actions(client, "application_17_3", running=True) == ["terminate"]
    assert submit.release_actions(local, None, running=False) == []
    assert submit.parse_app_id("INFO Client: Submitted application application_1700000000000_0042\n") == \
        "application_1700000000000_0042"
    assert submit.kill_command("application_1_2") == ["yarn", "application", "-kill", "application_1_2"]


FAKE_SPARK_SUBMIT = """
import sys, time
print("INFO Client: Submitted application application_1700000000000_0042", file=sys.stderr, flush=True)
print("driver output", flush=True)
time.sleep(float(sys.argv[1]))
sys.exit(int(sys.argv[2]))
"""


def fake_plan(deploy_mode: str, sleep: float, code: int, tmp_path: Path) -> SubmitPlan:
    return SubmitPlan([sys.executable, "-c", FAKE_SPARK_SUBMIT, str(sleep), str(code)], {}, "yarn", deploy_mode,
                      "unused", str(tmp_path))


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_ctrl_c_in_cluster_mode_kills_the_yarn_application(tmp_path: Path) -> None:
    calls: list[list[str]] = []
    out, err = io.StringIO(), io.StringIO()
    sub = submit.Submission(fake_plan("cluster", 60, 0, tmp_path),
                            run=lambda cmd: calls.append(list(cmd)) or CommandResult(0, ""), out=out, err=err)
    with pytest.raises(KeyboardInterrupt):
        with sub:
            wait_for(lambda: sub.app_id is not None)
            raise KeyboardInterrupt
    assert calls == [["yarn", "application", "-kill", "application_1700000000000_0042"]]
    assert sub.proc.poll() is not None  # spark-submit is gone too
    assert "application_1700000000000_0042 killed" in err.getvalue()
    assert "driver output" in out.getvalue()


@pytest.mark.skipif(shutil.which("java") is None, reason="needs a java launcher (the hadoop tier's too)")
def test_spark_submits_jvms_start_on_c1_unless_the_users_own_options_say_otherwise(tmp_path: Path,
                                                                                  monkeypatch) -> None:
    """A real java launcher under the plan's environment: C1 alone (TieredStopAtLevel 1); a JDK_JAVA_OPTIONS of
    the user's own comes after, so its level wins; the launcher's notice of the variable is not shown."""
    plan = SubmitPlan(["java", "-XX:+PrintFlagsFinal", "-version"], {"JDK_JAVA_OPTIONS": C1}, "yarn", "client",
                      "unused", str(tmp_path))
    levels = []
    for own in ("", "-XX:TieredStopAtLevel=3"):
        monkeypatch.setenv("JDK_JAVA_OPTIONS", own)
        out, err = io.StringIO(), io.StringIO()
        with submit.Submission(plan, run=lambda cmd: CommandResult(0, ""), out=out, err=err) as sub:
            assert sub.wait() == 0, err.getvalue()
        levels.append(re.search(r"\bTieredStopAtLevel\s+=\s+(\d)", out.getvalue()).group(1))
        assert "Picked up" not in err.getvalue() and "version" in err.getvalue()
    assert levels == ["1", "3"]


def test_a_submission_without_the_jvm_option_passes_every_line_through(tmp_path: Path) -> None:
    """ETL and scoring plans set no JDK_JAVA_OPTIONS: nothing of their output is left out, blank lines included."""
    plan = SubmitPlan([sys.executable, "-c", "print('a'); print(); print('b')"], {}, "yarn", "client", "unused",
                      str(tmp_path))
    out = io.StringIO()
    with submit.Submission(plan, run=lambda cmd: CommandResult(0, ""), out=out, err=io.StringIO()) as sub:
        assert sub.wait() == 0
    assert out.getvalue() == "a\n\nb\n"


def test_client_mode_terminates_spark_submit_and_a_finished_failure_needs_nothing(tmp_path: Path) -> None:
    calls: list[list[str]] = []
    sub = submit.Submission(fake_plan("client", 60, 0, tmp_path), run=lambda cmd: calls.append(cmd),
                            out=io.StringIO(), err=io.StringIO())
    with pytest.raises(RuntimeError):
        with sub:
            wait_for(lambda: sub.app_id is not None)
            raise RuntimeError("boom")
    assert calls == [] and sub.proc.returncode is not None
    sub = submit.Submission(fake_plan("client", 0, 3, tmp_path), run=Refuse("yarn kill"),
                            out=io.StringIO(), err=io.StringIO())
    with sub:
        assert sub.wait() == 3


# What Hadoop 3.4's `yarn application -status` prints (the minicluster's, trimmed).
STATUS_REPORT = """Application Report :
\tApplication-Id : application_1700000000000_0042
\tApplication-Name : hvdtrain-train
\tApplication-Type : SPARK
\tProgress : 100%
\tState : {state}
\tFinal-State : {final}
\tTracking-URL : http://127.0.0.1:8088/proxy/application_1700000000000_0042/
"""


def test_the_final_state_is_asked_until_the_application_has_ended(tmp_path: Path) -> None:
    assert submit.parse_final_state(STATUS_REPORT.format(state="FINISHED", final="SUCCEEDED")) == "FINISHED/SUCCEEDED"
    assert submit.parse_final_state(STATUS_REPORT.format(state="KILLED", final="KILLED")) == "KILLED/KILLED"
    assert submit.parse_final_state(STATUS_REPORT.format(state="RUNNING", final="UNDEFINED")) is None  # not yet
    assert submit.parse_final_state("Application with id 'application_1_2' doesn't exist in RM.") is None
    answers = [CommandResult(0, STATUS_REPORT.format(state="RUNNING", final="UNDEFINED")),
               CommandResult(0, STATUS_REPORT.format(state="FINISHED", final="FAILED"))]
    calls: list[list[str]] = []
    sub = submit.Submission(fake_plan("client", 0, 0, tmp_path), out=io.StringIO(), err=io.StringIO(),
                            run=lambda cmd: calls.append(list(cmd)) or answers.pop(0))
    sub.app_id = "application_1700000000000_0042"
    assert sub.final_state(pause=0) == "FINISHED/FAILED"
    assert calls == [["yarn", "application", "-status", "application_1700000000000_0042"]] * 2
    for answer, why in ((CommandResult(127, "No such file or directory: 'yarn'"), "`yarn` command is not on PATH"),
                        (CommandResult(124, "yarn did not answer within 120s"), "yarn did not answer within 120s"),
                        (CommandResult(255, "Application with id 'application_1700000000000_0042' doesn't exist in "
                                            "RM."), "(exit code 255): Application with id"),
                        (CommandResult(0, "yarn 1.22.22 (the JavaScript one): unknown command"),
                         "(exit code 0): yarn 1.22.22 (the JavaScript one)")):
        calls.clear()  # asked once, no state, no pause
        sub._run = lambda cmd, answer=answer: calls.append(list(cmd)) or answer
        assert sub.final_state(pause=60) is None and len(calls) == 1, answer
        assert why in sub.state_unknown, sub.state_unknown  # said in the closing line
    sub._run = lambda cmd: CommandResult(0, STATUS_REPORT.format(state="RUNNING", final="UNDEFINED"))
    assert sub.final_state(attempts=2, pause=0) is None
    assert sub.state_unknown == "the ResourceManager still reported it running after 2 tries"
    local = submit.Submission(dataclasses.replace(fake_plan("client", 0, 0, tmp_path), master="local[2]"),
                              run=Refuse("yarn status"))
    local.app_id = "local-1700000000000"
    assert local.final_state() is None  # a local run has no ResourceManager to ask


def test_a_finished_submission_prints_its_id_final_state_and_logs(job_file: Path, capsys) -> None:
    out = io.StringIO()
    fake = FakeSubmission(0, "application_1_8", "FINISHED/SUCCEEDED")
    assert submit.main([str(job_file), "--num-workers", "2"], deps(
        out, submission=fake, ensure_archive=lambda y, ident: packaging.EnvArchive(ENV, "0123abcd", False))) == 0
    assert "hvdtrain: application_1_8 ended FINISHED/SUCCEEDED; logs: yarn logs -applicationId application_1_8" \
        in out.getvalue()
    failed = FakeSubmission(1, "application_1_9", "FINISHED/FAILED")
    assert submit.main([str(job_file), "--num-workers", "2"], deps(
        io.StringIO(), submission=failed, ensure_archive=lambda y, ident: packaging.EnvArchive(ENV, "0123abcd",
                                                                                                False))) == 5
    assert "failed (exit code 1); application_1_9 ended FINISHED/FAILED; see the messages above; logs: yarn logs " \
           "-applicationId application_1_9" in capsys.readouterr().err
    assert fake.asked_attempts == 5 and failed.asked_attempts == 1  # a failure is released without waiting
    unknown = FakeSubmission(0, "application_1_10", None)
    out = io.StringIO()
    assert submit.main([str(job_file), "--num-workers", "2"], deps(
        out, submission=unknown, ensure_archive=lambda y, ident: packaging.EnvArchive(ENV, "0123abcd", False))) == 0
    assert "application_1_10 ended (state unknown: the `yarn` command is not on PATH; put your Hadoop client's bin " \
           "folder on PATH); logs: yarn logs -applicationId application_1_10" in out.getvalue()


# Spark's driver line (YarnSchedulerBackend / TaskSetManager, from the NodeManager's diagnostics via YarnAllocator)
SPARK_MEMORY_KILL = ("26/11/29 19:40:02 ERROR YarnScheduler: Lost executor 1 on 127.0.0.1: Container killed by YARN "
                     "for exceeding physical memory limits. 2.6 GB of 1.9 GB physical memory used. Consider boosting "
                     "spark.executor.memoryOverhead.")


def test_a_container_yarn_killed_for_its_memory_is_one_line_naming_what_it_held_and_what_to_raise(
        job_file: Path, capsys) -> None:
    """#56 item 6: the reason is read from the driver's own lines, and the job's one line names the container's
    sizes, YARN's figures and the setting to raise; any other failure keeps its line."""
    assert submit.parse_memory_kill(SPARK_MEMORY_KILL) == \
        "exceeding its physical memory limit: 2.6 GB of 1.9 GB physical memory used"
    assert submit.parse_memory_kill("Container killed by YARN for exceeding virtual memory limits. ") == \
        "exceeding its virtual memory limit"
    assert submit.parse_memory_kill("ERROR YarnScheduler: Lost executor 1: Container killed on request.") is None
    killed = FakeSubmission(1, "application_1_11", "FINISHED/FAILED",
                            memory_kill=submit.parse_memory_kill(SPARK_MEMORY_KILL))
    assert submit.main([str(job_file), "--num-workers", "2", "yarn.executor_memory=1g", "yarn.rank_memory=512m"],
                       deps(io.StringIO(), submission=killed,
                            ensure_archive=lambda y, ident: packaging.EnvArchive(ENV, "0123abcd", False))) == 5
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("hvdtrain: error:")]
    assert ("YARN killed a rank's container for exceeding its physical memory limit: 2.6 GB of 1.9 GB physical "
            "memory used; each executor container held yarn.executor_memory=1g (the JVM's heap) + "
            "spark.executor.memoryOverhead=896m; raise yarn.rank_memory (now 512m)") in line
    explicit = config.YarnConfig(spark_conf={"spark.executor.memoryOverhead": "3g"})
    assert "spark.executor.memoryOverhead=3g; raise yarn.spark_conf.spark.executor.memoryOverhead" in \
        submit.memory_kill_message(explicit, "x")


def test_only_yarn_executors_get_the_rank_s_memory_in_their_overhead() -> None:
    """Local executors are the driver's threads and a standalone worker enforces no container size; an explicit
    spark.executor.memoryOverhead is the user's (test_gpu_kerberos_queue_job_in_cluster_mode)."""
    def overheads(p: SubmitPlan) -> list[str]:
        return [a for a in p.argv if a.startswith("spark.executor.memoryOverhead=")]

    assert overheads(plan(job(executor_memory="1g", rank_memory="1536m"))) == ["spark.executor.memoryOverhead=1920m"]
    assert overheads(plan(job(rank_memory="1536m"), master="local[2]")) == []
    assert overheads(plan(job(rank_memory="1536m"), master="spark://127.0.0.1:7077")) == []


def test_cluster_mode_failure_still_kills_the_application(tmp_path: Path) -> None:
    calls: list[list[str]] = []
    sub = submit.Submission(fake_plan("cluster", 0, 1, tmp_path),
                            run=lambda cmd: calls.append(list(cmd)) or CommandResult(1, "already finished"),
                            out=io.StringIO(), err=io.StringIO())
    with sub:
        assert sub.wait() == 1
    assert calls == [["yarn", "application", "-kill", "application_1700000000000_0042"]]


# -- the packed environment ----------------------------------------------------------------------

def test_env_hash_covers_versions_python_and_horovod_build_but_not_this_project() -> None:
    dists = [packaging.Distribution("tensorflow-cpu", "2.21.0"), packaging.Distribution("horovod", "0.28.1"),
             packaging.Distribution("hvdtrain", "0.1.0", editable=True)]
    base = packaging.env_identity(dists, "3.11.7", "linux-x86_64", CPU_BUILD)
    assert base == ["horovod-build==tensorflow:1,gloo:1,nccl:0,mpi:0,cuda:0", "horovod==0.28.1",
                    "packed-without==" + ",".join(packaging.PACK_EXCLUDES), "platform==linux-x86_64",
                    "python==3.11.7", "tensorflow-cpu==2.21.0"]
    same = packaging.env_identity(list(reversed(dists)) + [packaging.Distribution("hvdtrain", "0.2.0", True)],
                                  "3.11.7", "linux-x86_64", CPU_BUILD)
    assert packaging.env_hash(same) == packaging.env_hash(base)
    changed = [packaging.env_identity(dists[:1] + [packaging.Distribution("horovod", "0.28.2")], "3.11.7",
                                      "linux-x86_64", CPU_BUILD),
               packaging.env_identity(dists, "3.11.8", "linux-x86_64", CPU_BUILD),
               packaging.env_identity(dists, "3.11.7", "linux-x86_64", GPU_BUILD)]
    assert len({packaging.env_hash(i) for i in changed} | {packaging.env_hash(base)}) == 4


def test_this_environment_identity_is_real_and_excludes_the_editable_project() -> None:
    identity = packaging.current_identity(CPU_BUILD)
    assert any(line.startswith("pyspark==") for line in identity)
    assert not any(line.startswith("hvdtrain==") for line in identity)
    assert packaging.env_hash(identity) == packaging.env_hash(packaging.current_identity(CPU_BUILD))


def fake_pack(calls: list[str]):
    def pack(prefix: str, output: str) -> None:
        calls.append(prefix)
        with tarfile.open(output, "w:gz") as tar:
            data = b"#!/bin/sh\n"
            info = tarfile.TarInfo("bin/python")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return pack


def test_env_archive_is_uploaded_once_per_hash(tmp_path: Path) -> None:
    cache = tmp_path / "envs"
    yarn_cfg = job(env_cache=str(cache)).yarn
    calls: list[str] = []
    logs: list[str] = []
    first = packaging.ensure_env_archive(yarn_cfg, ["a==1", "python==3.11.7"], prefix="/venv",
                                         pack=fake_pack(calls), log=logs.append)
    digest = packaging.env_hash(["a==1", "python==3.11.7"])
    assert first == packaging.EnvArchive(str(cache / f"{digest}.tar.gz"), digest, True) and calls == ["/venv"]
    assert (cache / f"{digest}.tar.gz.txt").read_text() == "a==1\npython==3.11.7\n"
    assert tarfile.open(first.uri).getnames() == ["bin/python"]
    again = packaging.ensure_env_archive(yarn_cfg, ["a==1", "python==3.11.7"], prefix="/venv",
                                         pack=fake_pack(calls), log=logs.append)
    assert again.uri == first.uri and not again.uploaded and calls == ["/venv"]  # reused, not re-packed
    assert any("reusing" in line for line in logs)
    other = packaging.ensure_env_archive(yarn_cfg, ["a==2", "python==3.11.7"], prefix="/venv",
                                         pack=fake_pack(calls), log=logs.append)
    assert other.uploaded and other.uri != first.uri and len(calls) == 2
    assert sorted(os.listdir(cache)) == sorted(f"{d}.tar.gz{s}" for d in (first.digest, other.digest)
                                               for s in ("", ".txt", packaging.SHA_SUFFIX))


def test_a_failed_pack_leaves_nothing_in_the_cache(tmp_path: Path) -> None:
    def broken(prefix: str, output: str) -> None:
        raise EnvironmentProblem("venv-pack could not pack /venv: disk full")

    with pytest.raises(EnvironmentProblem, match="disk full"):
        packaging.ensure_env_archive(job(env_cache=str(tmp_path / "envs")).yarn, ["a==1"], prefix="/venv",
                                     pack=broken, log=lambda s: None)
    assert not (tmp_path / "envs").exists()  # the pack failed before anything was created


def test_a_given_env_archive_is_used_as_is(tmp_path: Path) -> None:
    archive = tmp_path / "team-env.tar.gz"
    archive.write_bytes(b"x")
    got = packaging.ensure_env_archive(job(env_archive=str(archive)).yarn, ["a==1"], pack=Refuse("packing"))
    assert got == packaging.EnvArchive(str(archive), None, False)
    with pytest.raises(ConfigError, match=r"^yarn.env_archive does not exist"):
        packaging.ensure_env_archive(job(env_archive=str(tmp_path / "missing.tar.gz")).yarn, ["a==1"])


def test_spark_s_python_libraries_are_copied_to_the_cluster_once_and_named_to_spark_submit(tmp_path: Path) -> None:
    """Spark's YARN client uploads pyspark.zip and py4j's zip with every Python application unless
    PYSPARK_ARCHIVES_PATH names copies on the cluster: hvdtrain keeps them in yarn.env_cache by content hash."""
    import pyspark

    spark_submit = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit")
    libs = packaging.spark_python_libs(spark_submit)
    assert [os.path.basename(p) for p in libs][0] == "pyspark.zip"
    assert re.fullmatch(r"py4j-.+-src\.zip", os.path.basename(libs[1]))
    assert packaging.spark_python_libs(str(tmp_path / "bin" / "spark-submit")) == []  # no such SPARK_HOME
    cache = str(tmp_path / "envs")
    uris = packaging.ensure_spark_python_libs(cache, libs)
    for local, uri in zip(libs, uris):
        assert open(uri, "rb").read() == open(local, "rb").read()
        assert uri == os.path.join(cache, "spark-python", packaging.file_sha256(local)[:32], os.path.basename(local))
    landed = [os.stat(u).st_mtime_ns for u in uris]
    time.sleep(0.01)
    assert packaging.ensure_spark_python_libs(cache, libs) == uris
    assert [os.stat(u).st_mtime_ns for u in uris] == landed  # reused, not copied again
    size = os.path.getsize(uris[1])
    with open(uris[1], "wb") as fh:  # not the bytes its name says, even at the same size: replaced
        fh.write(b"x" * size)
    packaging.ensure_spark_python_libs(cache, libs)
    assert open(uris[1], "rb").read() == open(libs[1], "rb").read()
    # spark-submit is told on YARN only (a standalone master and local Spark do not read the variable)
    cluster = dataclasses.replace(inputs(), python_libs=tuple(uris))
    yarn_plan = submit.build_plan(job(num_workers=2), "yarn", cluster, is_file=lambda p: True)
    assert yarn_plan.env[packaging.PYSPARK_ARCHIVES_ENV] == ",".join(uris)
    for master in ("spark://127.0.0.1:7077", "local[2]"):
        other = submit.build_plan(job(num_workers=2), master, cluster, is_file=lambda p: True)
        assert packaging.PYSPARK_ARCHIVES_ENV not in other.env, master


def test_the_spark_libraries_cache_is_only_a_saving(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Used on YARN with the env archive hvdtrain packs, never written for a given yarn.python or
    yarn.env_archive, and a cache that fails is a note: Spark then uploads its own copies."""
    import pyspark

    spark_submit = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit")
    cache = "hdfs://nn:8020/user/ml/envs"
    y = job(env_cache=cache).yarn
    copied: list[tuple[str, list[str]]] = []  # the copying itself: the test above, on real files
    monkeypatch.setattr(packaging, "ensure_spark_python_libs",
                        lambda folder, libs: copied.append((folder, libs)) or [f"{folder}/{i}.zip" for i in (1, 2)])
    assert submit.cached_python_libs(y, "yarn", spark_submit, {}) == (f"{cache}/1.zip", f"{cache}/2.zip")
    assert copied == [(cache, packaging.spark_python_libs(spark_submit))]
    for other in (job(env_cache=cache, python="/opt/py/bin/python").yarn,
                  job(env_cache=cache, env_archive="hdfs://nn/team-env.tar.gz").yarn):
        assert submit.cached_python_libs(other, "yarn", spark_submit, {}) == ()
    assert submit.cached_python_libs(y, "spark://h:7077", spark_submit, {}) == ()
    assert submit.cached_python_libs(y, "yarn", spark_submit, {packaging.PYSPARK_ARCHIVES_ENV: "x.zip"}) == ()
    assert submit.cached_python_libs(job(env_cache=str(tmp_path)).yarn, "yarn", spark_submit, {}) == ()  # local
    assert len(copied) == 1

    def refused(*a: Any) -> list[str]:
        raise OSError("Permission denied: user=ml, access=WRITE, inode=/envs")

    monkeypatch.setattr(packaging, "ensure_spark_python_libs", refused)
    assert submit.cached_python_libs(y, "yarn", spark_submit, {}) == ()
    assert "hvdtrain: note: Spark's Python libraries are uploaded with this application; keeping them in " \
           f"{cache} failed: Permission denied" in capsys.readouterr().err


def test_an_upload_that_loses_the_race_keeps_the_other_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """HDFS will not rename over a file: when another submission's copy of the same content lands between the
    check and the rename, that one stays and ours goes."""
    local, uri = tmp_path / "pyspark.zip", str(tmp_path / "cache" / "pyspark.zip")
    local.write_bytes(b"ours")
    real_move = fs.move

    def hdfs_like_move(src: str, dst: str) -> None:
        fs.write_bytes_atomic(dst, b"theirs")  # the other upload lands first
        if os.path.exists(dst):
            raise OSError(f"rename {src} -> {dst}: destination exists")
        real_move(src, dst)

    monkeypatch.setattr(fs, "move", hdfs_like_move)
    assert packaging.upload_once(str(local), uri) is False
    assert open(uri, "rb").read() == b"theirs" and os.listdir(os.path.dirname(uri)) == ["pyspark.zip"]


def test_real_venv_pack_of_a_tiny_venv_leaves_out_the_editable_install_jars_and_headers(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python3*/site-packages"))
    (site / "__editable__.hvdtrain-0.1.0.pth").write_text("import __editable___hvdtrain_0_1_0_finder\n")
    (site / "__editable___hvdtrain_0_1_0_finder.py").write_text("MAPPING = {'hvdtrain': '/home/me/src'}\n")
    (site / "dep.py").write_text("VALUE = 1\n")
    for unread in ("pyspark/jars/spark-core.jar", "tensorflow/include/tensor.h", "pyspark/__init__.py"):
        (site / unread).parent.mkdir(parents=True, exist_ok=True)
        (site / unread).write_text("x\n")
    got = packaging.ensure_env_archive(job(env_cache=str(tmp_path / "envs")).yarn, ["dep==1"], prefix=str(venv),
                                       log=lambda s: None)
    names = tarfile.open(got.uri).getnames()
    assert "bin/python" in names and any(n.endswith("site-packages/dep.py") for n in names)
    assert not any("__editable__" in n for n in names)
    assert any(n.endswith("site-packages/pyspark/__init__.py") for n in names)  # pyspark's modules stay
    assert not any("/jars/" in n or "/include/" in n for n in names), names  # Spark's jars, TF's headers: not


# -- the executor and driver's pure parts -----------------------------------------------------------

def test_rank_sees_only_its_assigned_gpus() -> None:
    assert executor.gpu_env(["2", "3"]) == {"CUDA_VISIBLE_DEVICES": "2,3", "HVDTRAIN_ASSIGNED_GPUS": "2,3"}
    assert executor.gpu_env([]) == {}
    assert executor.assigned_gpus() == []  # outside a Spark task and without forwarded resources


def test_rank_gets_a_libhdfs_classpath_when_the_container_lacks_one() -> None:
    env = {"HADOOP_HOME": "/opt/hadoop", "CLASSPATH": "/c/__spark_libs__/*"}
    files = {"/opt/hadoop/bin/hadoop", "/opt/hadoop/lib/native/libhdfs.so"}
    asked: list[str] = []
    got = fs.hdfs_client_env(env, lambda hadoop: asked.append(hadoop) or "/opt/h/hadoop-common-3.3.6.jar",
                             files.__contains__)
    assert got == {"CLASSPATH": "/opt/h/hadoop-common-3.3.6.jar:/c/__spark_libs__/*",
                   "ARROW_LIBHDFS_DIR": "/opt/hadoop/lib/native"} and asked == ["/opt/hadoop/bin/hadoop"]
    ready = {"CLASSPATH": "/opt/h/hadoop-common-3.3.6.jar", "ARROW_LIBHDFS_DIR": "/x"}
    assert fs.hdfs_client_env(ready, Refuse("hadoop classpath"), files.__contains__) == {}
    assert executor.uses_hdfs(job().to_dict()) == ["hdfs://nn:8020/data/reviews", "hdfs://nn:8020/runs/reviews"]
    assert not executor.uses_hdfs(config.from_dict({"source": {"table": "a.b"}, "workdir": "/w"}).to_dict())
    assert fs.prepare_hdfs_client("/local/out", "webhdfs://nn:9870/x", None) == {}  # nothing to set up


def test_driver_summary_takes_rank_0s_result_and_collects_errors() -> None:
    ok = [{"rank": 0, "result": {"test_accuracy": 0.9}, "error": None, "host": "a"},
          {"rank": 1, "result": {"test_accuracy": 0.9}, "error": None, "host": "b"}]
    doc = driver.summarize(ok)
    assert doc["ok"] and doc["world_size"] == 2 and doc["result"] == {"test_accuracy": 0.9}
    assert doc["ranks"] == [{"rank": 0, "error": None, "host": "a"}, {"rank": 1, "error": None, "host": "b"}]
    bad = driver.summarize([{"rank": 0, "result": None, "error": "no manifest at hdfs://x"}, ok[1]])
    assert not bad["ok"] and bad["errors"] == ["rank 0: no manifest at hdfs://x"]
    assert json.loads(json.dumps(bad)) == bad


def test_max_restarts_is_a_fault_override_and_a_ranks_error_code_decides_the_restart(job_file: Path) -> None:
    args = submit.parse_args([str(job_file), "--max-restarts", "3"])
    assert submit.flag_overrides(args, "/work") == ["fault.max_restarts=3"]
    assert config.load(job_file, submit.flag_overrides(args, "/work")).fault.max_restarts == 3
    with pytest.raises(ConfigError, match=r"^--max-restarts must be >= 0"):
        submit.check_flags(submit.parse_args([str(job_file), "--max-restarts", "-1"]))
    ok = [{"rank": 0, "error": None}, {"rank": 1, "error": None}]
    assert driver.records_exit_code(ok) == 0 and driver.records_exit_code([]) == 1
    storage = [{"rank": 0, "error": "read hdfs://x failed after 5 attempts", "exit_code": 74}, ok[1]]
    assert driver.records_exit_code(storage) == 74  # restartable; a data error (3) would not be


def test_launcher_imports_stay_light() -> None:
    code = ("import sys, yarn.submit, yarn.executor, yarn.packaging; "
            "print(sorted(m for m in ('tensorflow', 'pyspark', 'horovod', 'keras') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.stdout.strip() == "[]"


def test_gpu_index_uses_spark_assignment_when_present():
    from hvdtrain.runtime import distributed

    assert distributed.gpu_index(1, {}) == 1
    assert distributed.gpu_index(1, {distributed.ASSIGNED_GPUS_ENV: "3"}) == 0


def test_after_a_failed_rank_the_driver_waits_one_am_heartbeat_for_why_a_container_ended() -> None:
    """A memory kill is named from the line Spark logs when the application master reports it, on its next
    heartbeat (spark.yarn.scheduler.heartbeat.interval-ms, 3 s by default); the driver waits that and a second."""
    assert driver.loss_report_wait(None) == 4.0
    assert driver.loss_report_wait("1500") == 2.5 and driver.loss_report_wait("1500ms") == 2.5
    assert driver.loss_report_wait("60000") == 11.0  # a long heartbeat is not waited out
    assert driver.loss_report_wait("3s") == 4.0  # a form this does not read: the default
