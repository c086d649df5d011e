"""Submit Horovod training to YARN through spark-submit: one command.

    python -m yarn.submit CONFIG [key=value ...] --num-workers N [--gpus-per-worker G]
        [--queue Q] [--principal P --keytab K] [--master yarn|spark://HOST:PORT|local[N]] [--dry-run]

(also ``hvdtrain yarn submit ...``). Flags override the config's ``yarn:`` block.
The driver (:mod:`yarn.driver`) calls ``horovod.spark.run`` with
:func:`yarn.executor.run_rank` on N Spark tasks, one per executor, and each
task's process runs :func:`hvdtrain.training.train.run`.

Plan, then act:

- :func:`validate` and :func:`build_plan` are pure: config, master, Horovod
  build facts, and the paths of what is shipped in; a :class:`SubmitPlan`
  (the exact spark-submit argv and the environment it runs with) out. Unit
  tests check argv lists exactly.
- :func:`main` gathers the facts, ships code and environment
  (:mod:`yarn.packaging`), and runs the plan inside :class:`Submission`, a
  context manager that releases the application when the block is left by an
  error or Ctrl-C: ``yarn application -kill <id>`` in cluster mode (the app
  outlives spark-submit there), terminating spark-submit in client mode (its
  shutdown hook stops the app).

``--master spark://HOST:PORT`` runs the same job on a Spark standalone
cluster: the env archive, code zip and config are shipped as on YARN, the
driver runs in client mode (standalone has no cluster mode for Python), and
``spark.cores.max`` caps the application at one executor per rank
(``scripts/standalone_cluster.sh`` starts such a cluster on one machine).

``--master local[N]`` runs the same driver and executor function in local
Spark with this interpreter (no archive): a rehearsal of the cluster job.
"""
from __future__ import annotations

import argparse
import contextlib
import enum
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Any, Callable, Iterator, Literal, Mapping, Optional, Sequence

from hvdtrain.core import config as config_mod
from hvdtrain.core import redaction, secrets
from hvdtrain.core.config import JobConfig, YarnConfig
from hvdtrain.core.errors import ANY_ERROR, EXIT_INTERRUPTED, ConfigError, EnvironmentProblem, HvdtrainError, StepFailed
from hvdtrain.hadoop import envcheck, fs, hadoop_conf, hadoop_tokens, resourcemanager
from hvdtrain.hadoop.envcheck import HorovodBuild
from hvdtrain.observe import console
from hvdtrain.runtime import startup
from hvdtrain.runtime.launch import LAUNCHER_RECORD, spark_malloc_env
from yarn import packaging, resources

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER_SCRIPT = os.path.join(HERE, "driver.py")
GPU_SCRIPT = os.path.join(HERE, "gpu_discovery.sh")
ENV_ALIAS = "env"  # --archives <uri>#env: unpacked as ./env in every container
SHIPPED_PYTHON = f"./{ENV_ALIAS}/bin/python"
CODE_ZIP = "hvdtrain-code.zip"
JOB_YAML = "hvdtrain-job.yaml"
SECRET_PROPERTIES = "hvdtrain-secret.properties"  # 0600, beside the code zip in the staging folder
# On a cluster, the executors' secret environment variables (yarn.env's tokens and passwords) travel in this 0600
# file, shipped with --files, never as spark.executorEnv: YARN writes a container's environment into its
# launch_container.sh, which the NodeManagers copy into the container's logs (yarn.nodemanager.log-container-
# debug-info.enabled, on by default) and log aggregation keeps on HDFS for `yarn logs`. The file reaches only the
# application's private staging folder and its containers' private folders; the executors' Python daemon
# (DAEMON_MODULE) puts the variables back before it forks a worker, so ETL and scoring tasks and every rank
# get them.
SEALED_ENV_FILE = "hvdtrain-sealed-env.json"
DAEMON_MODULE = "yarn.spark_daemon"
EXECUTOR_ENV = "spark.executorEnv."
RESULT_NAME = LAUNCHER_RECORD
APP_ID = re.compile(r"application_\d+_\d+")
# The client's line for each application it submits: a driver that had to start again submitted a second one.
APP_SUBMITTED = re.compile(r"Submitted application (application_\d+_\d+)")
TERMINAL_STATES = ("FINISHED", "FAILED", "KILLED")  # YARN's application states that are final
APP_REPORT = "Application Report"  # the header of `yarn application -status` when the ResourceManager answers
# spark://host:port, or a comma-separated list of masters (standalone high availability)
STANDALONE = re.compile(r"spark://[^\s/,:]+:\d+(?:,[^\s/,:]+:\d+)*")
MASTER_HELP = "yarn (default), spark://HOST:PORT for a Spark standalone cluster, or local[N] for a local rehearsal"
MASTERS = "yarn (the cluster), spark://HOST:PORT (a Spark standalone cluster) or local[N] (a local rehearsal)"
RM_CONNECT_TIMEOUT = 10.0  # seconds to reach the ResourceManager before submitting
# Tries of each rank's Spark task in an elastic job (spark.task.maxFailures): a lost rank's task is retried and
# joins as a new host, up to 3 times per task; Spark's own default.
ELASTIC_TASK_ATTEMPTS = 4

# Spark settings the launcher owns, and the config field or flag that controls each.
OWNED_CONF = {
    "spark.master": "--master",
    "spark.submit.deployMode": "yarn.deploy_mode",
    "spark.dynamicAllocation.enabled": "(always false: Horovod needs a fixed set of ranks)",
    "spark.executor.instances": "--num-workers / yarn.num_workers",
    "spark.cores.max": "--num-workers x yarn.executor_cores (standalone)",
    "spark.executor.cores": "yarn.executor_cores",
    "spark.task.cpus": "yarn.executor_cores (one rank per executor)",
    "spark.executor.memory": "yarn.executor_memory",
    "spark.driver.memory": "yarn.driver_memory",
    "spark.yarn.queue": "--queue / yarn.queue",
    "spark.executor.resource.gpu.amount": "--gpus-per-worker / yarn.gpus_per_worker",
    "spark.task.resource.gpu.amount": "--gpus-per-worker / yarn.gpus_per_worker",
    "spark.pyspark.python": "yarn.env_archive (the shipped env's ./env/bin/python)",
}

# The JVMs of a training job only carry it: each executor's task starts a Python worker that runs a Horovod
# rank, and the driver and the application master wait. Their start is what they cost, so they run on the
# C1 JIT alone, which starts a Spark JVM about a third faster (benchmarks/README.md, yarn_submit_overhead);
# the ETL and scoring jobs, whose JVMs do the work, keep the default. The option goes through the variable
# every `java` launcher reads (JDK 9+), not spark.*.extraJavaOptions, which would replace what a cluster's
# spark-defaults.conf sets there; a JDK_JAVA_OPTIONS of the user's own comes after it, so a later
# -XX:TieredStopAtLevel there wins.
CARRIER_JVM_OPTIONS = "-XX:TieredStopAtLevel=1"
JVM_OPTIONS_ENV = "JDK_JAVA_OPTIONS"
AM_JVM_OPTIONS = f"spark.yarn.appMasterEnv.{JVM_OPTIONS_ENV}"


def worker_env_conf(y: YarnConfig) -> list[tuple[str, str]]:
    """``spark.executorEnv.*`` of a job whose executors' Python workers do the work (ETL, scoring): yarn.env, and
    glibc's malloc top pad (:func:`hvdtrain.runtime.launch.malloc_env`) unless yarn.env or yarn.spark_conf sets one (pure).
    A training job's ranks get theirs from the driver (``yarn/driver.py:horovod_env``)."""
    return [(f"spark.executorEnv.{k}", v) for k, v in sorted(spark_malloc_env(y.env, y.spark_conf).items())]


def carrier_jvm_options(own: Optional[str]) -> str:
    """The carrier JVMs' options, with ``own`` (the user's JDK_JAVA_OPTIONS for that JVM) after them (pure)."""
    return f"{CARRIER_JVM_OPTIONS} {own}" if own else CARRIER_JVM_OPTIONS


# -- plan -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Inputs:
    """Facts the plan depends on, gathered by the caller."""

    spark_submit: str
    python: str  # this interpreter: runs the driver in client mode and every rank locally
    code_zip: str  # local path of the --py-files zip
    job_yaml: str  # local path of the resolved job config
    archive_uri: Optional[str]  # the packed env (None for local masters and yarn.python)
    build: HorovodBuild
    cluster_python: str = SHIPPED_PYTHON  # what executors run on a cluster: the shipped env's, or yarn.python
    umask: str = fs.DEFAULT_UMASK  # HVDTRAIN_HDFS_UMASK on this host: the containers' HDFS writes withhold it too
    python_libs: tuple[str, ...] = ()  # on YARN: Spark's pyspark and py4j zips, cached on the cluster (packaging)


@dataclass(frozen=True)
class ScriptJob:
    """A user's script as the job (``hvdtrain yarn run``): its folder zipped and shipped with ``--files``."""

    zip_path: str  # local path of the zipped folder
    script: str  # the script's path inside the zip
    args: tuple[str, ...]  # the script's own arguments
    output: str  # where every rank's log and the job record go (local or hdfs://)

    @property
    def logs(self) -> str:
        return fs.join(self.output, "logs")


@dataclass(frozen=True)
class SubmitPlan:
    argv: list[str]
    env: dict[str, str]  # set (over the current environment) for spark-submit
    master: str
    deploy_mode: str
    result_uri: str
    cwd: Optional[str] = None
    notes: list[str] = field(default_factory=list)
    # Secret settings (a token in yarn.env...): written to a 0600 --properties-file at submit time, never argv
    secret_conf: dict[str, str] = field(default_factory=dict, repr=False)
    properties_file: Optional[str] = None
    # The executors' secret environment (a cluster job's): written to the 0600 sealed_env_file, shipped with --files
    sealed_env: dict[str, str] = field(default_factory=dict, repr=False)
    sealed_env_file: Optional[str] = None

    @property
    def is_local(self) -> bool:
        return is_local_master(self.master)


def is_local_master(master: str) -> bool:
    return master == "local" or master.startswith("local[")


def is_standalone_master(master: str) -> bool:
    return STANDALONE.fullmatch(master) is not None


def check_master(master: str) -> None:
    """Refuse a master none of the launchers support, naming the ones they do."""
    if master != "yarn" and not is_standalone_master(master) and not is_local_master(master):
        raise ConfigError("--master", master, f"must be {MASTERS}")


def deploy_mode_for(y: YarnConfig, master: str) -> str:
    """client for local and standalone masters (standalone cannot run a Python driver in the cluster), else the
    config's (pure)."""
    return y.deploy_mode if master == "yarn" else "client"


def deploy_notes(y: YarnConfig, master: str) -> list[str]:
    if y.deploy_mode == "cluster" and master != "yarn":
        return [f"yarn.deploy_mode cluster does not apply to --master {master}: running in client mode"]
    return []


def local_slots(master: str) -> Optional[int]:
    """Concurrent tasks of a local master: local -> 1, local[3] -> 3, local[3,2] -> 3, local[*] -> None."""
    if master == "local":
        return 1
    match = re.fullmatch(r"local\[(\d+|\*)(?:,\d+)?\]", master)
    if not match:
        raise ConfigError("--master", master, "must be yarn, local, local[N] or local[*]")
    return None if match.group(1) == "*" else int(match.group(1))


def local_attempts(master: str) -> int:
    """Tries per task of a local master (pure): local[3,2] -> 2, else 1 (Spark ignores spark.task.maxFailures
    in local mode)."""
    match = re.fullmatch(r"local\[(?:\d+|\*),(\d+)\]", master)
    return int(match.group(1)) if match else 1


def validate(cfg: JobConfig, master: str, build: HorovodBuild, is_file: Callable[[str], bool] = os.path.isfile,
             archive_nccl: Callable[[str], tuple[Optional[bool], str]] = packaging.archive_nccl) -> None:
    """Refuse a submission that cannot work, with one line naming the value and the fix.

    Only what the config cannot know is checked here (the master, the Horovod
    build, files on this host); :class:`~hvdtrain.core.config.YarnConfig` checks its
    own values when it is built.

    Reads cfg.yarn and cfg.train (what an elastic job needs of the cluster).
    """
    y = cfg.yarn
    check_master(master)
    if build.version is None:
        raise EnvironmentProblem(f"Horovod does not import in this environment ({build.error}); the driver "
                                 "runs horovod.spark.run: build it with `make env`, check with `make check-build`")
    if not build.tensorflow:
        raise EnvironmentProblem(f"Horovod {build.version} was built without TensorFlow ({build.error}); "
                                 "rebuild with HOROVOD_WITH_TENSORFLOW=1 (make env)")
    if not build.gloo:
        raise EnvironmentProblem(f"Horovod {build.version} was built without Gloo, which YARN jobs use to "
                                 "connect ranks; rebuild with HOROVOD_WITH_GLOO=1 (make env, needs CMake)")
    if y.gpus_per_worker > 0 and not is_local_master(master):  # local masters are refused GPUs below
        check_shipped_nccl(y, build, archive_nccl)
    if y.keytab is not None and not is_file(y.keytab):
        raise ConfigError("yarn.keytab", y.keytab, "does not exist or is not a file; pass the path of the "
                          "keytab for --principal on this host (e.g. --keytab ~/user.keytab)")
    el = cfg.train.elastic
    if el is not None and not el.min_ranks <= y.num_workers <= el.max_ranks:
        raise ConfigError("--num-workers", y.num_workers, f"must be within train.elastic.min_ranks {el.min_ranks} "
                          f"and max_ranks {el.max_ranks}: the ranks to start with")
    if el is not None and is_local_master(master) and local_attempts(master) < 2:
        raise ConfigError("--master", master, "gives each task one attempt, and an elastic job's lost rank comes "
                          "back as a retried task: use local[N,F] with F >= 2 tries (e.g. local[2,4])")
    if is_local_master(master):
        if y.gpus_per_worker > 0:
            raise ConfigError("yarn.gpus_per_worker", y.gpus_per_worker,
                              f"needs --master yarn: local Spark ({master}) assigns no GPUs; pass --gpus-per-worker 0")
        slots = local_slots(master)
        if el is not None and slots is not None and slots < el.max_ranks:  # run_elastic starts max_ranks tasks
            raise ConfigError("--master", master, f"runs {slots} task(s) at a time, but an elastic job keeps a task "
                              f"for each of train.elastic.max_ranks {el.max_ranks}; use --master "
                              f"local[{el.max_ranks},4]")
        if slots is not None and slots < y.num_workers:
            raise ConfigError("--master", master, f"runs {slots} task(s) at a time, but {y.num_workers} ranks "
                              f"must run together; use --master local[{y.num_workers}]")
    for key, value in y.spark_conf.items():
        if key in OWNED_CONF:
            raise ConfigError(f"yarn.spark_conf.{key}", value, f"is set by the launcher; use {OWNED_CONF[key]}")


def check_shipped_nccl(y: YarnConfig, build: HorovodBuild,
                       archive_nccl: Callable[[str], tuple[Optional[bool], str]]) -> None:
    """A GPU job needs NCCL in the Horovod its ranks run: this host's when hvdtrain packs this environment, the
    archive's when ``yarn.env_archive`` names one (a gateway without GPUs submits with a CUDA host's archive).
    The archive's build is read from its record, else from its Horovod library (:func:`yarn.packaging.archive_nccl`)."""
    if y.env_archive is None:
        if not build.nccl:
            raise ConfigError("yarn.gpus_per_worker", y.gpus_per_worker,
                              f"needs Horovod built with NCCL, but this host's build, which the job would ship, has "
                              f"none ({build.describe()}); rebuild on a CUDA host with HOROVOD_GPU_OPERATIONS=NCCL "
                              "make env, or ship such a host's environment (there: hvdtrain yarn pack ARCHIVE; "
                              "here: yarn.env_archive=ARCHIVE), or pass --gpus-per-worker 0")
        return
    if not fs.exists(y.env_archive):
        raise ConfigError("yarn.env_archive", y.env_archive, "does not exist; point it at an archive made with "
                          "hvdtrain yarn pack (or venv-pack/conda-pack), or unset it to pack this environment")
    nccl, how = archive_nccl(y.env_archive)
    if nccl is None:
        raise ConfigError("yarn.env_archive", y.env_archive,
                          f"does not say whether its Horovod has NCCL, which --gpus-per-worker needs ({how}): "
                          "pack it with hvdtrain yarn pack, which writes the record, or pass --gpus-per-worker 0")
    if not nccl:
        raise ConfigError("yarn.env_archive", y.env_archive,
                          f"ships Horovod without NCCL ({how}), which --gpus-per-worker needs: rebuild that "
                          "environment on a CUDA host with HOROVOD_GPU_OPERATIONS=NCCL make env and pack it again "
                          "(hvdtrain yarn pack), or pass --gpus-per-worker 0")


def spark_conf(cfg: JobConfig, master: str, deploy_mode: str, inputs: Inputs) -> list[tuple[str, str]]:
    """Every --conf of the submission, in order (pure).

    Reads cfg.yarn, cfg.train (an elastic job's tasks) and cfg.spark (the event log).
    """
    y = cfg.yarn
    el = cfg.train.elastic
    # A retried rank cannot rejoin a fixed ring; an elastic job's retried task is how a lost rank comes back.
    conf: list[tuple[str, str]] = [("spark.task.maxFailures", str(ELASTIC_TASK_ATTEMPTS) if el else "1")]
    executors = el.max_ranks if el else y.num_workers  # an elastic job keeps a task (and executor) per max rank
    if is_local_master(master):
        conf += [("spark.task.cpus", "1"),
                 ("spark.log.level", "WARN"),  # a rehearsal: keep the ranks' output readable
                 ("spark.pyspark.python", inputs.python),
                 ("spark.pyspark.driver.python", inputs.python)]
    else:
        driver_python = inputs.cluster_python if deploy_mode == "cluster" else inputs.python
        # A YARN app asks for executors; a standalone app for cores (spark.cores.max): one executor per rank either way.
        standalone = is_standalone_master(master)
        conf += ([] if standalone else [("spark.yarn.maxAppAttempts", "1")])  # a 2nd attempt would start over
        conf += [("spark.dynamicAllocation.enabled", "false"),
                 ("spark.cores.max", str(executors * y.executor_cores)) if standalone
                 else ("spark.executor.instances", str(executors)),
                 ("spark.task.cpus", str(y.executor_cores)),  # one task, so one rank, per executor
                 ("spark.scheduler.minRegisteredResourcesRatio", "1.0"),
                 ("spark.scheduler.maxRegisteredResourcesWaitingTime", f"{y.start_timeout}s"),
                 ("spark.pyspark.python", inputs.cluster_python),
                 ("spark.pyspark.driver.python", driver_python)]
        if deploy_mode == "cluster":
            conf.append(("spark.yarn.appMasterEnv.PYSPARK_PYTHON", inputs.cluster_python))
        overhead = None if standalone else resources.executor_overhead(y)  # the rank's process in the container
        if overhead is not None:
            conf.append(("spark.executor.memoryOverhead", overhead))
        if y.gpus_per_worker > 0:
            conf += [("spark.executor.resource.gpu.amount", str(y.gpus_per_worker)),
                     ("spark.task.resource.gpu.amount", str(y.gpus_per_worker)),
                     ("spark.executor.resource.gpu.discoveryScript", f"./{os.path.basename(GPU_SCRIPT)}")]
    if is_standalone_master(master) and "PYTHONPATH" not in y.env:
        # YARN puts --py-files on the containers' PYTHONPATH; a standalone worker does not, and the rank
        # processes Horovod starts import the code from it (relative: the executor's folder holds the zip).
        conf.append(("spark.executorEnv.PYTHONPATH", CODE_ZIP))
    env, own = dict(y.env), dict(y.spark_conf)
    if inputs.umask != fs.DEFAULT_UMASK and not is_local_master(master):  # the containers write as this host does
        env.setdefault(fs.UMASK_ENV, inputs.umask)
        if deploy_mode == "cluster":
            conf.append((f"spark.yarn.appMasterEnv.{fs.UMASK_ENV}", env[fs.UMASK_ENV]))
    if not is_local_master(master):  # local executors are threads of the driver's JVM (the plan's env)
        env[JVM_OPTIONS_ENV] = carrier_jvm_options(y.env.get(JVM_OPTIONS_ENV))
        if not is_standalone_master(master):  # the application master (the driver too, in cluster mode)
            conf.append((AM_JVM_OPTIONS, carrier_jvm_options(own.pop(AM_JVM_OPTIONS, None))))
    conf += [(f"spark.executorEnv.{k}", v) for k, v in sorted(env.items())]
    conf += list(config_mod.event_log_conf(cfg.spark).items())  # the history server shows the job
    conf += list(secrets.spark_redaction_conf(own).items())  # ... with secrets hidden, as the UI does
    conf += list(own.items())
    return conf


@dataclass(frozen=True)
class ConfArgs:
    """How a submission's settings reach spark-submit: ``argv`` (plain settings), the secret settings for the 0600
    ``--properties-file``, and on a cluster the executors' secret environment for the 0600 sealed file that
    ``files`` ships."""
    argv: list[str]
    secret_conf: dict[str, str]
    properties_file: Optional[str]
    sealed_env: dict[str, str]
    sealed_env_file: Optional[str]

    @property
    def files(self) -> list[str]:
        return [self.sealed_env_file] if self.sealed_env_file else []


def conf_args(conf: Sequence[tuple[str, str]], staging: str, master: str) -> ConfArgs:
    """The settings ``conf`` as spark-submit receives them (pure): plain settings as ``--conf K=V``; secret ones (a
    secret key or a URL password, :mod:`hvdtrain.core.secrets`) go to a properties file in ``staging``, named on
    argv instead; on a cluster, secret ``spark.executorEnv.*`` variables go to the sealed file (SEALED_ENV_FILE),
    which the executors' Python daemon reads back (a local master's executors are threads of the driver)."""
    settings = dict(conf)
    sealed: dict[str, str] = {}
    if not is_local_master(master):
        sealed = {key[len(EXECUTOR_ENV):]: value for key, value in settings.items()
                  if key.startswith(EXECUTOR_ENV) and secrets.has_secret(value, key)}
        if sealed:
            settings = {key: value for key, value in settings.items()
                        if not (key.startswith(EXECUTOR_ENV) and key[len(EXECUTOR_ENV):] in sealed)}
            settings.update({f"{EXECUTOR_ENV}{secrets.SEALED_ENV}": SEALED_ENV_FILE,
                             "spark.python.daemon.module": DAEMON_MODULE})
    plain, secret = secrets.split_secret_items(settings)
    argv = [arg for key, value in plain.items() for arg in ("--conf", f"{key}={value}")]
    properties = os.path.join(staging, SECRET_PROPERTIES) if secret else None
    if properties:  # Spark 4 reads spark-defaults.conf beside a --properties-file only when asked to
        argv += ["--properties-file", properties, "--load-spark-defaults"]
    return ConfArgs(argv, secret, properties, sealed, os.path.join(staging, SEALED_ENV_FILE) if sealed else None)


def write_properties(plan: SubmitPlan) -> None:
    """The plan's secret settings and its executors' secret environment, in files only this user can read (before
    spark-submit starts)."""
    if plan.secret_conf and plan.properties_file:
        secrets.write_properties(plan.properties_file, plan.secret_conf)
    if plan.sealed_env and plan.sealed_env_file:
        secrets.write_private(plan.sealed_env_file, json.dumps(plan.sealed_env).encode("utf-8"))


def build_plan(cfg: JobConfig, master: str, inputs: Inputs,
               is_file: Callable[[str], bool] = os.path.isfile, script: Optional[ScriptJob] = None) -> SubmitPlan:
    """The spark-submit command and environment for a job (pure, given ``is_file`` for the keytab): hvdtrain's
    training, or with ``script`` a user's Horovod script run by every rank.

    Raises ConfigError / EnvironmentProblem for a submission that cannot work (:func:`validate`).
    """
    validate(cfg, master, inputs.build, is_file)
    y = cfg.yarn
    local = is_local_master(master)
    deploy_mode = deploy_mode_for(cfg.yarn, master)
    notes = deploy_notes(cfg.yarn, master)
    argv = [inputs.spark_submit, "--master", master, "--deploy-mode", deploy_mode, "--name", f"hvdtrain-{cfg.name}"]
    argv += cluster_args(cfg.yarn, master, inputs)
    settings = conf_args(spark_conf(cfg, master, deploy_mode, inputs), os.path.dirname(inputs.code_zip), master)
    files = (([script.zip_path] if script else [])
             + ([GPU_SCRIPT] if y.gpus_per_worker > 0 and not local else []) + settings.files)
    argv += shipped_args(inputs, deploy_mode, files)
    argv += settings.argv
    result_uri = fs.join(script.output if script else cfg.train.output, RESULT_NAME)
    argv += [DRIVER_SCRIPT, "--config", driver_config(inputs, deploy_mode), "--num-proc", str(y.num_workers),
             "--start-timeout", str(y.start_timeout),
             "--executable", inputs.python if local else inputs.cluster_python, "--result", result_uri]
    if script:  # ranks on a cluster find the --files in their container's working folder
        argv += ["--script-zip", script.zip_path if local else os.path.basename(script.zip_path),
                 "--script", script.script, "--script-args", json.dumps(list(script.args)), "--logs", script.logs]
    env = {**submit_env(inputs, master), JVM_OPTIONS_ENV: CARRIER_JVM_OPTIONS}  # spark-submit's own JVMs
    if not local:
        notes += _cluster_notes(cfg, script)
    return SubmitPlan(argv, env, master, deploy_mode, result_uri, os.path.dirname(inputs.code_zip), notes,
                      settings.secret_conf, settings.properties_file, settings.sealed_env, settings.sealed_env_file)


def shipped_args(inputs: Inputs, deploy_mode: str, files: Sequence[str]) -> list[str]:
    """``--py-files`` and ``--files`` of a submission (pure; shared with yarn.etl_submit and yarn.score).

    The job's YAML is shipped in cluster mode only, where the driver runs in the application master's container:
    in client mode the driver reads it on this host and hands the ranks and tasks what they need, so uploading
    it too would only cost the submission an HDFS write."""
    shipped = ([inputs.job_yaml] if deploy_mode == "cluster" else []) + list(files)
    return ["--py-files", inputs.code_zip, *(["--files", ",".join(shipped)] if shipped else [])]


def driver_config(inputs: Inputs, deploy_mode: str) -> str:
    """The job YAML's path as the driver sees it (pure): in cluster mode the driver runs in the application
    master's container, beside the --files (:func:`shipped_args`); in client mode it reads the file here."""
    return os.path.basename(inputs.job_yaml) if deploy_mode == "cluster" else inputs.job_yaml


def submit_env(inputs: Inputs, master: str) -> dict[str, str]:
    """spark-submit's environment (pure; shared with yarn.etl_submit and yarn.score). Locally, the driver and
    the ranks import the shipped zip as containers do (the YARN client puts --py-files on the executors'
    PYTHONPATH; local Spark does not, for child processes); on YARN, Spark's Python libraries come from the
    cluster's copies when hvdtrain has them there (packaging.ensure_spark_python_libs)."""
    env = {"PYTHONUNBUFFERED": "1"}
    if is_local_master(master):
        env["PYTHONPATH"] = inputs.code_zip
    elif master == "yarn" and inputs.python_libs:
        env[packaging.PYSPARK_ARCHIVES_ENV] = ",".join(inputs.python_libs)
    return env


def cluster_args(y: YarnConfig, master: str, inputs: Inputs) -> list[str]:
    """spark-submit's queue, Kerberos login, memory, cores and shipped environment (pure; shared with yarn.score)."""
    local = is_local_master(master)
    argv = ["--queue", y.queue] if y.queue and master == "yarn" else []
    if y.principal and y.keytab:  # set together (YarnConfig checks)
        argv += ["--principal", y.principal, "--keytab", y.keytab]
    argv += ["--driver-memory", y.driver_memory]
    if not local:
        if inputs.archive_uri is None and y.python is None:
            raise ValueError("a cluster plan needs the env archive's URI (yarn.packaging.ensure_env_archive)")
        argv += ["--executor-memory", y.executor_memory, "--executor-cores", str(y.executor_cores)]
        if y.python is None:
            argv += ["--archives", f"{inputs.archive_uri}#{ENV_ALIAS}"]
    return argv


def _cluster_notes(cfg: JobConfig, script: Optional[ScriptJob] = None) -> list[str]:
    """What the submitter is told before training (or ``script``) runs on the cluster.

    Reads cfg.yarn, cfg.etl and cfg.train (local outputs) and cfg.tracking (a store no container reaches).
    """
    notes = []
    if cfg.yarn.gpus_per_worker > 1:
        notes.append(f"yarn.gpus_per_worker={cfg.yarn.gpus_per_worker}: each rank trains on one GPU (Horovod runs "
                     "one process per GPU), so the others idle; prefer --gpus-per-worker 1 with more workers")
    outputs = ((("--output", script.output),) if script else
               (("etl.output", cfg.etl.output), ("train.output", cfg.train.output)))
    for name, value in outputs:
        if fs.is_local(value):
            notes.append(f"{name} {value} is a local path: every YARN container must see it (shared mount), "
                         f"or set {name}=hdfs://namenode:8020/...")
    if not script and cfg.tracking.enabled and not cfg.tracking.uri and "MLFLOW_TRACKING_URI" not in cfg.yarn.env:
        notes.append("tracking.uri is unset: rank 0 would log to a SQLite file on whichever host it runs; "
                     "set tracking.uri=http://mlflow-server:5000 (or yarn.env.MLFLOW_TRACKING_URI)")
    return notes + archive_notes(cfg.yarn)


def archive_notes(y: YarnConfig) -> list[str]:
    """What every cluster submission (train, ETL, score) is told about where its env archive comes from."""
    if y.python is not None:
        return [f"yarn.python {y.python}: nothing is shipped; that interpreter must exist with this "
                "project's dependencies on every host"]
    if fs.is_local(y.env_archive or y.env_cache):
        return ["the env archive is local, so spark-submit uploads it on every submission; "
                "set yarn.env_cache=hdfs://namenode:8020/user/$USER/hvdtrain-envs to upload it once"]
    return []


def flag_overrides(args: argparse.Namespace, cwd: str) -> list[str]:
    """The config overrides the command-line flags stand for (pure)."""
    out = []
    for flag, key in (("num_workers", "yarn.num_workers"), ("gpus_per_worker", "yarn.gpus_per_worker"),
                      ("max_restarts", "fault.max_restarts")):
        value = getattr(args, flag, None)
        if value is not None:
            out.append(f"{key}={int(value)}")
    for flag in ("queue", "principal"):
        value = getattr(args, flag)
        if value is not None:
            out.append(f"yarn.{flag}={json.dumps(value)}")
    if args.keytab is not None:  # relative to where the command runs, not to the YAML's folder
        out.append(f"yarn.keytab={json.dumps(os.path.join(cwd, os.path.expanduser(args.keytab)))}")
    return out


def check_flags(args: argparse.Namespace) -> None:
    """Flag values that are wrong on their face, named by flag (the config names the rest)."""
    for flag, minimum in (("num_workers", 1), ("gpus_per_worker", 0), ("max_restarts", 0)):
        value = getattr(args, flag, None)
        if value is not None and value < minimum:
            raise ConfigError(f"--{flag.replace('_', '-')}", value, f"must be >= {minimum}")


def format_plan(plan: SubmitPlan) -> str:
    """The command and environment, copy-pasteable (``--dry-run``)."""
    lines = [f"# {note}" for note in plan.notes]
    if plan.secret_conf:
        lines.append(f"# {', '.join(sorted(plan.secret_conf))}: secret, written to a 0600 --properties-file at "
                     "submit time (never on the command line)")
    if plan.sealed_env:
        lines.append(f"# the executors' {', '.join(sorted(plan.sealed_env))}: secret, written to a 0600 "
                     f"{SEALED_ENV_FILE} shipped with --files at submit time (never in a container's environment, "
                     "which YARN copies into its logs)")
    if plan.cwd:
        lines.append(f"cd {shlex.quote(plan.cwd)}")
    lines += [f"export {k}={shlex.quote(v)}" for k, v in plan.env.items()]
    parts, i, argv = [shlex.quote(plan.argv[0])], 1, plan.argv
    while i < len(argv):
        if argv[i].startswith("--") and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            parts.append(f"{argv[i]} {shlex.quote(argv[i + 1])}")
            i += 2
        else:
            parts.append(shlex.quote(argv[i]))
            i += 1
    lines.append(" \\\n  ".join(parts))
    return "\n".join(lines)


# -- act: the running submission -----------------------------------------------------------------

def parse_app_id(line: str, current: Optional[str] = None) -> Optional[str]:
    """The application a submission's output line names, given the one known so far (pure): the first id seen,
    replaced by each later "Submitted application" (spark_start's retry of a client-mode driver submits anew)."""
    submitted = APP_SUBMITTED.search(line)
    if submitted:
        return submitted.group(1)
    if current is not None:
        return current
    match = APP_ID.search(line)
    return match.group(0) if match else None


# What the Spark driver logs when a NodeManager killed an executor's container for its memory (Spark's
# YarnAllocator, from the NodeManager's diagnostics): "Container killed by YARN for exceeding physical memory
# limits. 2.1 GB of 1.9 GB physical memory used. Consider boosting spark.executor.memoryOverhead."
MEMORY_KILL = re.compile(r"Container killed by YARN for exceeding (physical|virtual) memory limits\.\s*"
                         r"([\d.]+ \w?B of [\d.]+ \w?B \w+ memory used)?")


def parse_memory_kill(line: str) -> Optional[str]:
    """YARN's reason from a driver line reporting a container killed for its memory, else None (pure)."""
    match = MEMORY_KILL.search(line)
    if not match:
        return None
    return f"exceeding its {match.group(1)} memory limit" + (f": {match.group(2)}" if match.group(2) else "")


def memory_kill_message(y: YarnConfig, reason: str) -> str:
    """The one line for a job whose container YARN killed for its memory (pure): what the container held
    and what to raise."""
    explicit = y.spark_conf.get("spark.executor.memoryOverhead")
    overhead = explicit or resources.executor_overhead(y)
    fix = ("raise yarn.spark_conf.spark.executor.memoryOverhead (set explicitly, it replaces yarn.rank_memory)"
           if explicit else f"raise yarn.rank_memory (now {y.rank_memory}), the memory of each rank's own process")
    return (f"YARN killed a rank's container for {reason}; each executor container held "
            f"yarn.executor_memory={y.executor_memory} (the JVM's heap) + spark.executor.memoryOverhead={overhead}; "
            f"{fix}, within what the queue grants per container")


def kill_command(app_id: str) -> list[str]:
    return ["yarn", "application", "-kill", app_id]


def status_command(app_id: str) -> list[str]:
    return ["yarn", "application", "-status", app_id]


def jvm_yarn_cli(argv: Sequence[str]) -> envcheck.CommandResult:
    """``yarn application -status|-kill ID`` through Hadoop's YarnClient in a JVM logged in from the keytab, for a
    ``--principal/--keytab`` submission on a host with no ticket cache (the ``yarn`` CLI would find no
    credentials and retry for minutes). The status is printed as the CLI prints it, for :func:`parse_final_state`."""
    from py4j.protocol import Py4JJavaError

    action, app_id = argv[2], argv[3]
    try:
        with hadoop_tokens.logged_in_jvm() as (jvm, conf):
            client = jvm.org.apache.hadoop.yarn.client.api.YarnClient.createYarnClient()
            client.init(jvm.org.apache.hadoop.yarn.conf.YarnConfiguration(conf))
            client.start()
            try:
                app = jvm.org.apache.hadoop.yarn.api.records.ApplicationId.fromString(app_id)
                if action == "-kill":
                    client.killApplication(app)
                    return envcheck.CommandResult(0, f"Killed application {app_id}")
                report = client.getApplicationReport(app)
                return envcheck.CommandResult(0, f"{APP_REPORT} : \n\tState : {report.getYarnApplicationState()}\n"
                                                 f"\tFinal-State : {report.getFinalApplicationStatus()}\n")
            finally:
                client.stop()
    except Py4JJavaError as exc:  # the ResourceManager's answer, as Java states it
        why = str(exc.java_exception.toString()).splitlines()[0]
        return envcheck.CommandResult(1, f"YarnClient (logged in from the keytab): {why[:300]}")
    except ANY_ERROR as exc:  # no JVM, a gateway that would not start or stop: the state stays unknown, not a crash
        return envcheck.CommandResult(1, f"YarnClient (logged in from the keytab): {str(exc).splitlines()[0][:300]}")


def state_unknown_reason(result: envcheck.CommandResult) -> str:
    """Why ``yarn application -status`` gave no state, for the closing line (pure)."""
    first = next((line.strip() for line in result.output.splitlines() if line.strip()), "no output")
    if result.returncode == 127:
        return ("the `yarn` command is not on PATH; put your Hadoop client's bin folder on PATH, or read the "
                "state in the ResourceManager's web UI")
    if result.returncode == 124:
        return first  # "yarn did not answer within 120s"
    return f"`yarn application -status` answered without a report (exit code {result.returncode}): {first[:200]}"


def parse_final_state(report: str) -> Optional[str]:
    """``FINISHED/SUCCEEDED`` from ``yarn application -status`` output (State and Final-State), or None (pure)."""
    state = re.search(r"^\s*State\s*:\s*(\w+)", report, re.M)
    final = re.search(r"^\s*Final-State\s*:\s*(\w+)", report, re.M)
    if not (state and final) or state.group(1) not in TERMINAL_STATES:
        return None
    return f"{state.group(1)}/{final.group(1)}"


def logs_hint(app_id: str) -> str:
    return f"logs: yarn logs -applicationId {app_id}"


class ReleaseAction(str, enum.Enum):
    """What leaving a submission early does."""

    KILL_APP = "kill-app"  # yarn application -kill: the app outlives spark-submit in cluster mode
    TERMINATE = "terminate"  # stop spark-submit; in client mode its shutdown hook stops the app


def release_actions(plan: SubmitPlan, app_id: Optional[str], running: bool) -> list[ReleaseAction]:
    """What leaving a submission early must do (pure)."""
    actions = []
    if not plan.is_local and plan.deploy_mode == "cluster" and app_id:
        actions.append(ReleaseAction.KILL_APP)
    if running:
        actions.append(ReleaseAction.TERMINATE)
    return actions


class Submission:
    """spark-submit running a plan; leaving the block by an error or Ctrl-C releases the application.

    Usage::

        with Submission(plan) as sub:
            code = sub.wait()
    """

    def __init__(self, plan: SubmitPlan, popen: Callable[..., Any] = subprocess.Popen,
                 run: Optional[envcheck.Runner] = None, out: IO[str] = sys.stdout,
                 err: IO[str] = sys.stderr, grace: float = 60.0):
        self.plan = plan
        run = run or (jvm_yarn_cli if hadoop_tokens.keytab_without_ticket() else envcheck.run_command)
        self._popen, self._run, self._out, self._err, self._grace = popen, run, out, err, grace
        self.proc: Any = None
        self.app_id: Optional[str] = None
        self.returncode: Optional[int] = None
        self._readers: list[threading.Thread] = []
        self._picked_up: Optional[str] = None  # the java launchers' notice of JDK_JAVA_OPTIONS, when set
        self.state_unknown = "not asked"  # why final_state() found none
        self.memory_kill: Optional[str] = None  # YARN's words when it killed a container for its memory

    def __enter__(self) -> "Submission":
        # A session of its own: the terminal's Ctrl-C reaches only us, and we release in order.
        # The ranks time their start-up from this command's start: the env archive's check or upload counts too.
        env = {**os.environ, **self.plan.env, startup.LAUNCHED_AT_ENV: f"{startup.CLOCK.start:.3f}"}
        if JVM_OPTIONS_ENV in self.plan.env:
            env[JVM_OPTIONS_ENV] = carrier_jvm_options(os.environ.get(JVM_OPTIONS_ENV))
            self._picked_up = f"NOTE: Picked up {JVM_OPTIONS_ENV}: {env[JVM_OPTIONS_ENV]}"
        self.proc = self._popen(self.plan.argv, env=env, cwd=self.plan.cwd,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
                                start_new_session=True)
        for stream, sink in ((self.proc.stdout, self._out), (self.proc.stderr, self._err)):
            reader = threading.Thread(target=self._pump, args=(stream, sink), daemon=True)
            reader.start()
            self._readers.append(reader)
        return self

    def _pump(self, stream: IO[str], sink: IO[str]) -> None:
        for line in stream:
            known = self.app_id
            named = parse_app_id(line, known)
            if named != known:  # written only for a line that names an id: the stdout and stderr pumps share it
                self.app_id = named
            if self.memory_kill is None:
                self.memory_kill = parse_memory_kill(line)
            if self._picked_up is not None and line.rstrip("\n") == self._picked_up:  # set in __enter__
                continue
            sink.write(line)
            sink.flush()

    def wait(self) -> int:
        self.returncode = self.proc.wait()
        for reader in self._readers:
            reader.join(timeout=5)
        return self.returncode

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Literal[False]:
        still_running = self.proc is not None and self.proc.poll() is None
        if exc_type is not None or self.returncode not in (0, None) or still_running:
            self.release()
        return False

    def final_state(self, attempts: int = 5, pause: float = 2.0) -> Optional[str]:
        """The ResourceManager's ``State/Final-State`` of the application once spark-submit has exited, or None
        (a local run, an unknown id, no answer). It asks again, up to ``attempts`` times, only while the
        ResourceManager reports the application not yet final (a client-mode one takes a moment to unregister);
        a CLI that is missing, fails or times out (envcheck.run_command's limit) is asked once."""
        if self.plan.is_local or not self.app_id:
            return None
        for attempt in range(attempts):
            result = self._run(status_command(self.app_id))
            if result.returncode != 0 or APP_REPORT not in result.output:
                self.state_unknown = state_unknown_reason(result)
                return None
            state = parse_final_state(result.output)
            if state is not None:
                return state
            if attempt + 1 < attempts:
                time.sleep(pause)
        self.state_unknown = f"the ResourceManager still reported it running after {attempts} tries"
        return None

    def release(self) -> None:
        actions = release_actions(self.plan, self.app_id, self.proc is not None and self.proc.poll() is None)
        if ReleaseAction.KILL_APP in actions and self.app_id:  # KILL_APP means an application id is known
            cmd = kill_command(self.app_id)
            result = self._run(cmd)
            status = "killed" if result.returncode == 0 else f"could not be killed ({result.output.strip()[:200]})"
            self._err.write(f"hvdtrain: {self.app_id} {status}; to retry: {shlex.join(cmd)}\n")
        if ReleaseAction.TERMINATE in actions:
            self._terminate()

    def _terminate(self) -> None:
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=self._grace)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.proc.wait()

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)  # spark-submit, the Python driver and local ranks
        except (ProcessLookupError, PermissionError):
            pass


# -- main ------------------------------------------------------------------------------------

@dataclass
class Collaborators:
    """What main() uses to look at and act on the world; tests pass fakes."""

    probe_build: Callable[[], HorovodBuild] = envcheck.probe_horovod_build
    find_spark_submit: Callable[[], str] = envcheck.find_spark_submit
    identity: Optional[Callable[[HorovodBuild], list[str]]] = None  # default: packaging.current_identity
    ensure_archive: Optional[Callable[..., Any]] = None  # default: packaging.ensure_env_archive
    submission: Callable[[SubmitPlan], Submission] = Submission
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    out: IO[str] = field(default_factory=lambda: sys.stdout)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hvdtrain yarn submit", description="Train on YARN: spark-submit running "
                                "horovod.spark.run on N executors (flags override the config's yarn: block).")
    p.add_argument("config", help="job YAML, e.g. configs/demo.yaml")
    p.add_argument("overrides", nargs="*", help="config overrides, section.key=value")
    add_submission_flags(p)
    return p.parse_intermixed_args(argv)  # key=value overrides may come after the flags


def add_submission_flags(p: argparse.ArgumentParser) -> None:
    """The flags every Horovod submission takes (``yarn submit``, ``yarn run``)."""
    p.add_argument("--num-workers", type=int, help="Horovod ranks = executors (yarn.num_workers)")
    p.add_argument("--gpus-per-worker", type=int, help="GPUs per executor; needs Horovod with NCCL")
    p.add_argument("--queue", help="YARN queue (yarn.queue)")
    p.add_argument("--principal", help="Kerberos principal, with --keytab")
    p.add_argument("--keytab", help="keytab file for --principal")
    p.add_argument("--master", default="yarn", help=MASTER_HELP)
    p.add_argument("--max-restarts", type=int, metavar="K",
                   help="relaunch the Horovod job inside the same application after a lost rank, a stall or a "
                        "storage failure, up to K times (fault.max_restarts)")
    p.add_argument("--dry-run", action="store_true", help="print the command and environment; run nothing")


def prepare(args: argparse.Namespace, deps: Collaborators,
            load: Optional[Callable[[list[str]], JobConfig]] = None) -> tuple[JobConfig, HorovodBuild]:
    """Config with the flags applied (``load(overrides)``, default: the CONFIG argument's file), and the
    Horovod facts, validated."""
    check_flags(args)
    overrides = list(getattr(args, "overrides", [])) + flag_overrides(args, os.getcwd())
    cfg = load(overrides) if load else config_mod.load(args.config, overrides)
    build = probe_build(args, deps)
    validate(cfg, args.master, build)
    return cfg, build


def probe_build(args: argparse.Namespace, deps: Collaborators) -> HorovodBuild:
    """Horovod's build facts (importing TensorFlow takes a while), after checking that a YARN submission's
    ResourceManager answers, so that an unreachable one fails in seconds."""
    if args.master == "yarn" and not args.dry_run:
        check_resourcemanager(deps.env.get("HADOOP_CONF_DIR") or deps.env.get("YARN_CONF_DIR"))
    return deps.probe_build()


@contextlib.contextmanager
def staged_inputs(cfg: JobConfig, args: argparse.Namespace, deps: Collaborators, build: HorovodBuild,
                  kind: str) -> Iterator[Inputs]:
    """What any hvdtrain spark-submit needs (training, scoring): spark-submit, the cluster's client configs,
    a staging folder (removed afterwards) and, on YARN, the environment archive (packed once per identity)."""
    local = is_local_master(args.master)
    try:
        spark_submit = deps.find_spark_submit()
    except EnvironmentProblem:
        if not args.dry_run:
            raise
        spark_submit = "spark-submit"
    if args.master == "yarn" and not args.dry_run and not (deps.env.get("HADOOP_CONF_DIR") or deps.env.get("YARN_CONF_DIR")):
        raise EnvironmentProblem("--master yarn needs the cluster's client configs: export "
                                 "HADOOP_CONF_DIR=/etc/hadoop/conf (see `hvdtrain env check`)")
    if args.master == "yarn" and not args.dry_run:
        kerberos_login(deps.env.get("HADOOP_CONF_DIR") or deps.env.get("YARN_CONF_DIR"), cfg.yarn)
        check_fits(cfg, args.master, kind, deps.env.get("HADOOP_CONF_DIR") or deps.env.get("YARN_CONF_DIR"))
    staging = (os.path.join(tempfile.gettempdir(), f"hvdtrain-{kind}-{cfg.name}") if args.dry_run
               else tempfile.mkdtemp(prefix=f"hvdtrain-{kind}-{cfg.name}-"))
    try:
        archive = None
        if not local and cfg.yarn.python is None:
            identity = (deps.identity or packaging.current_identity)(build)
            if args.dry_run:
                archive = packaging.planned_archive(cfg.yarn, identity).uri
            else:
                archive = (deps.ensure_archive or packaging.ensure_env_archive)(cfg.yarn, identity).uri
        libs = () if args.dry_run else cached_python_libs(cfg.yarn, args.master, spark_submit, deps.env)
        yield Inputs(spark_submit, sys.executable, os.path.join(staging, CODE_ZIP), os.path.join(staging, JOB_YAML),
                     archive, build, cfg.yarn.python or SHIPPED_PYTHON, f"{fs.hdfs_umask():03o}", libs)
    finally:
        if not args.dry_run:
            shutil.rmtree(staging, ignore_errors=True)


def cached_python_libs(y: YarnConfig, master: str, spark_submit: str, env: Mapping[str, str]) -> tuple[str, ...]:
    """On YARN, with the env archive hvdtrain packs into ``yarn.env_cache``: Spark's pyspark and py4j zips kept
    beside it (:func:`yarn.packaging.ensure_spark_python_libs`), for ``PYSPARK_ARCHIVES_PATH``. Nothing for other
    masters, a given ``yarn.python`` or ``yarn.env_archive`` (their env_cache may not be the cluster's), a local
    env_cache or the user's own variable. Only a saving: when the cache cannot be used, a note, and Spark
    uploads its own copies."""
    if master != "yarn" or packaging.PYSPARK_ARCHIVES_ENV in env or y.python is not None \
            or y.env_archive is not None or fs.is_local(y.env_cache):
        return ()
    try:
        return tuple(packaging.ensure_spark_python_libs(y.env_cache, packaging.spark_python_libs(spark_submit)))
    except ANY_ERROR as exc:
        print(redaction.redact_text(f"hvdtrain: note: Spark's Python libraries are uploaded with this application; "
                                    f"keeping them in {y.env_cache} failed: {exc}"), file=sys.stderr)
        return ()


def kerberos_login(conf_dir: Optional[str], y: Any) -> None:
    """On a Kerberos cluster: this process's HDFS calls (the env cache) log in as ``yarn.principal`` from
    ``yarn.keytab``; without them a missing ticket is one line now, not spark-submit retrying for minutes."""
    if not conf_dir or not hadoop_tokens.kerberos_enabled(hadoop_conf.load(conf_dir)):
        return
    if y.principal and y.keytab:
        hadoop_tokens.use_keytab(y.principal, y.keytab)
        return
    problem = hadoop_tokens.ticket_problem()
    if problem:
        raise hadoop_tokens.no_ticket(problem, f"{conf_dir}/core-site.xml")


# Jobs whose ranks all start together (one Horovod ring): the queue must hold every executor at once.
GANG_JOBS = ("submit", "run")


def check_fits(cfg: JobConfig, master: str, kind: str, conf_dir: Optional[str],
               read: Callable[..., tuple[Optional[resourcemanager.Limits], str]] = resourcemanager.read_limits) -> None:
    """The job's containers against its queue's limits (:mod:`yarn.resources`), before anything is packed or
    submitted: one line naming the setting, the request, the limit and the fix; an unknown queue names the
    queues there are. When the ResourceManager's limits cannot be read, a note, and YARN checks the request.

    Reads cfg.yarn and cfg.train (an elastic job's most ranks).
    """
    if not conf_dir:
        return
    limits, why = read(hadoop_conf.load(conf_dir), cfg.yarn.queue)
    if limits is None:
        print(f"hvdtrain: note: could not read the queue's limits ({redaction.redact_text(why)}); YARN checks the "
              "request itself", file=sys.stderr)
        return
    gang = kind in GANG_JOBS
    el = cfg.train.elastic
    executors = (el.max_ranks if el else cfg.yarn.num_workers) if gang else 1
    resources.check(cfg.yarn, deploy_mode_for(cfg.yarn, master), executors, gang, limits)


def check_resourcemanager(conf_dir: Optional[str],
                          connect: Callable[..., Any] = socket.create_connection) -> None:
    """Fail in seconds, naming the address, when the ResourceManager does not answer (spark-submit's Hadoop
    client would retry for 15 minutes: yarn.resourcemanager.connect.max-wait.ms)."""
    if not conf_dir:
        raise EnvironmentProblem("--master yarn needs the cluster's client configs: export "
                                 "HADOOP_CONF_DIR=/etc/hadoop/conf (see `hvdtrain env check`)")
    address = hadoop_conf.resourcemanager_address(hadoop_conf.load(conf_dir))
    if address is None:
        return
    host, _, port = address.rpartition(":")
    try:
        connect((host, int(port)), timeout=RM_CONNECT_TIMEOUT).close()
    except OSError as exc:
        raise EnvironmentProblem(f"cannot reach the ResourceManager at {address} (yarn.resourcemanager.address in "
                                 f"{conf_dir}/yarn-site.xml): {exc.strerror or exc}; check the cluster is up "
                                 "(`hvdtrain cluster status` for the local one) and HADOOP_CONF_DIR") from None


def launch(cfg: JobConfig, plan: SubmitPlan, inputs: Inputs, args: argparse.Namespace, deps: Collaborators,
           job: str = "") -> bool:
    """Print the plan (``--dry-run``: returns False) or write the config and code zip and run spark-submit,
    releasing the application on the way out; raises :class:`StepFailed` naming ``job`` when it fails."""
    if args.dry_run:
        what = "the code zip and the resolved config are written at submit time"
        if inputs.archive_uri is not None and cfg.yarn.env_archive is None:
            what += "; the env archive is packed and uploaded if it is not cached yet"
        print(f"# dry run: {what}\n{format_plan(plan)}", file=deps.out)
        return False
    with open(inputs.job_yaml, "w") as fh:
        fh.write(cfg.to_yaml())
    fs.makedirs_if_local(cfg.spark.event_log_dir)  # Spark refuses to start without it
    packaging.build_code_zip(inputs.code_zip, user_code=cfg.model.code)
    write_properties(plan)
    for note in plan.notes:
        print(f"hvdtrain: note: {note}", file=sys.stderr)
    print(f"$ {shlex.join(plan.argv)}", file=deps.out, flush=True)
    with deps.submission(plan) as sub:
        code = sub.wait()
        state = sub.final_state(attempts=5 if code == 0 else 1)  # a failure is released (killed) without delay
        ended = f"; {sub.app_id} ended {state}" if state else ""
        if code != 0:
            where = f"; {logs_hint(sub.app_id)}" if sub.app_id else ""
            if sub.memory_kill:
                raise StepFailed(f"spark-submit{job} failed: {memory_kill_message(cfg.yarn, sub.memory_kill)}{where}")
            raise StepFailed(f"spark-submit{job} failed (exit code {code}){ended}; see the messages above{where}")
        if sub.app_id and not plan.is_local:
            print(f"hvdtrain: {sub.app_id} ended {state or f'(state unknown: {sub.state_unknown})'}; "
                  f"{logs_hint(sub.app_id)}", file=deps.out)
    return True


def run(args: argparse.Namespace, deps: Collaborators) -> int:
    cfg, build = prepare(args, deps)
    with staged_inputs(cfg, args, deps, build, "submit") as inputs:
        plan = build_plan(cfg, args.master, inputs)
        if launch(cfg, plan, inputs, args, deps):
            print(result_summary(plan.result_uri), file=deps.out)
    return 0


def result_summary(uri: str) -> str:
    try:
        doc = json.loads(fs.read_bytes(uri))
    except (HvdtrainError, OSError, ValueError) as exc:  # storage, or not JSON: the job succeeded all the same
        return f"hvdtrain: training finished; could not read {uri} ({exc})"
    result = doc.get("result") or {}
    metrics = result.get("test_metrics") or {"accuracy": result.get("test_accuracy", float("nan"))}
    shown = ", ".join(f"{name} {value:.4f}" for name, value in list(metrics.items())[:3])
    return (f"hvdtrain: training finished on {doc.get('world_size')} ranks: test {shown}, ranks agree: "
            f"{result.get('ranks_agree')}; result: {uri}")


def main(argv: Optional[Sequence[str]] = None, deps: Optional[Collaborators] = None) -> int:
    return guarded(run, parse_args(argv), deps or Collaborators())


def guarded(job: Callable[[argparse.Namespace, Collaborators], int], args: argparse.Namespace,
            deps: Collaborators) -> int:
    """Run one submission (``yarn submit``, ``run``, ``etl``, ``score``): an error as its one line and exit code,
    Ctrl-C or a plain ``kill`` of this process releasing the application."""
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_interrupt) if in_main_thread else None
    try:
        return job(args, deps)
    except HvdtrainError as exc:
        return console.print_error(exc, "hvdtrain")
    except KeyboardInterrupt:
        print("hvdtrain: interrupted; the application was released", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
