"""What every rank runs: the function ``horovod.spark.run`` ships to the executors.

:func:`run_rank` runs in the process Horovod starts for each Spark task (not
in the task's Python worker itself). Before TensorFlow is imported it:

1. makes only the GPUs Spark assigned to this task visible
   (``CUDA_VISIBLE_DEVICES``): Spark's TaskContext when called inside a task,
   otherwise the resources Horovod's task service forwarded from it;
2. points libhdfs at the Hadoop client of the container (``CLASSPATH`` from
   ``hadoop classpath --glob``, ``ARROW_LIBHDFS_DIR``) when the job reads or
   writes ``hdfs://`` and the container's environment lacks them
   (:func:`hvdtrain.hadoop.fs.prepare_hdfs_client`, which the ETL's write tasks run too);

then rebuilds the job config from a plain dict and calls
:func:`hvdtrain.training.train.run` (:func:`hvdtrain.training.elastic.run` with
``train.elastic``). It returns a small record: rank, host, GPUs, where
the code was imported from, and the training result (or the user-facing error,
so the driver can print one line instead of N tracebacks).

Nothing here imports TensorFlow or Horovod's TensorFlow ops at module level:
the driver imports this module to pickle :func:`run_rank` by reference.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import zipfile
from typing import IO, Any, Mapping, Optional, Sequence

import hvdtrain
from hvdtrain.core import config  # no TensorFlow import either
from hvdtrain.core.errors import ANY_ERROR, HvdtrainError
from hvdtrain.hadoop import fs
from hvdtrain.runtime import cpus, distributed, startup
from hvdtrain.runtime.distributed import ASSIGNED_GPUS_ENV  # no TensorFlow import: safe before GPU pinning


def gpu_env(addresses: Sequence[str]) -> dict[str, str]:
    """Environment that exposes exactly the assigned GPUs (pure); nothing when none were assigned.

    ``HVDTRAIN_ASSIGNED_GPUS`` tells :func:`hvdtrain.runtime.distributed.pin_gpu` that the visible GPUs
    are already this rank's own, so it must not index them by local rank: two executors on one
    host each see one GPU, yet have local ranks 0 and 1.
    """
    if not addresses:
        return {}
    visible = ",".join(str(a) for a in addresses)
    return {"CUDA_VISIBLE_DEVICES": visible, ASSIGNED_GPUS_ENV: visible}


def assigned_gpus() -> list[str]:
    """GPU addresses Spark assigned to this task."""
    try:
        from pyspark import TaskContext

        ctx = TaskContext.get()
    except ImportError:
        ctx = None
    if ctx is not None:
        gpu = ctx.resources().get("gpu")
        return list(gpu.addresses) if gpu is not None else []
    try:  # in the rank process: Horovod's task service forwarded the task's resources
        from horovod.spark.task import task_info
    except ImportError:
        return []
    return [str(a) for a in task_info.get_available_devices()]


def container_log_dir(environ: Mapping[str, str]) -> Optional[str]:
    """The folder YARN collects this container's logs from (pure): the first of ``LOG_DIRS``, which a NodeManager
    sets for every container (Spark's ``spark.yarn.app.container.log.dir``); None off YARN. A file written there
    as output arrives is in ``yarn logs`` even when the container is killed, since the NodeManager uploads the
    folder of every container, ended or not, when the application ends."""
    dirs = [d for d in environ.get("LOG_DIRS", "").split(",") if d]
    return dirs[0] if dirs else None


def rank_banner(environ: Mapping[str, str]) -> str:
    """A rank's first line, on its stderr (pure): which rank it is and where. Horovod forwards it to the
    executor's stderr, so ``yarn logs`` (a section per container) tells the ranks apart. Elastic ranks learn their
    rank only at ``hvd.init()``."""
    rank, size = environ.get("HOROVOD_RANK", "?"), environ.get("HOROVOD_SIZE", "?")
    return f"hvdtrain: rank {rank} of {size} starts in {environ.get('CONTAINER_ID') or socket.gethostname()}"


def uses_hdfs(cfg_dict: Mapping[str, Any]) -> list[str]:
    """The job's ``hdfs://`` / ``viewfs://`` locations (an empty list: no libhdfs needed)."""
    paths = [cfg_dict["etl"]["output"], cfg_dict["train"]["output"], cfg_dict.get("tracking", {}).get("uri") or ""]
    return [str(p) for p in paths if str(p).startswith(fs.LIBHDFS_SCHEMES)]


def rank_record(rank: int, gpus: Sequence[str], result: Optional[dict[str, Any]], error: Optional[str],
                tf_preloaded: bool, code_from: str) -> dict[str, Any]:
    """What a rank returns to the driver (pure)."""
    return {"rank": rank, "host": socket.gethostname(), "pid": os.getpid(), "gpus": list(gpus),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "tensorflow_preloaded": tf_preloaded,
            "code_from": code_from, "result": result, "error": error,
            # set by a NodeManager for its containers: which node and container ran the rank (None off YARN)
            "container": os.environ.get("CONTAINER_ID"),
            "nodemanager": f"{os.environ['NM_HOST']}:{os.environ['NM_PORT']}" if "NM_PORT" in os.environ else None}


def run_rank(cfg_dict: dict[str, Any]) -> dict[str, Any]:
    """Train one rank of the job described by ``cfg_dict`` (``JobConfig.to_dict()``)."""
    tf_preloaded = "tensorflow" in sys.modules
    print(rank_banner(os.environ), file=sys.stderr, flush=True)
    gpus = assigned_gpus()
    os.environ.update(gpu_env(gpus))  # before TensorFlow initializes CUDA
    # On YARN each rank is one task of spark.task.cpus = yarn.executor_cores CPUs (yarn/submit.py): TensorFlow's
    # pools are sized from that, not from the host (hvdtrain.runtime.cpus takes the smallest limit that applies).
    os.environ.setdefault(cpus.TASK_CPUS_ENV, str(cfg_dict.get("yarn", {}).get("executor_cores", "")))
    fs.prepare_hdfs_client(*uses_hdfs(cfg_dict))  # the same set-up as the ETL's shard-writing tasks

    if cfg_dict["train"].get("elastic"):  # deferred: TensorFlow, after GPU pinning
        from hvdtrain.training.elastic import run  # hvdtrain's loop under Horovod elastic (horovod.spark.run_elastic)
    else:
        from hvdtrain.training.train import run

    startup.mark("interpreter and imports")  # this Python worker's start, the task's arrival, TensorFlow's import
    result, error, code = None, None, 0
    try:
        result = run(config.from_dict(cfg_dict))
    except HvdtrainError as exc:
        error, code = str(exc), exc.exit_code
    rank = distributed.info().rank if _initialized(distributed) else int(os.environ.get("HOROVOD_RANK", "-1"))
    if error:  # also here: if the others then fail in a collective, the driver gets no records
        print(f"hvdtrain: error: rank {rank}: {error}", file=sys.stderr, flush=True)
    return {**rank_record(rank, gpus, result, error, tf_preloaded, os.path.dirname(hvdtrain.__file__)),
            "exit_code": code}


def _initialized(distributed: Any) -> bool:
    try:
        distributed.info()
    except RuntimeError:
        return False
    return True


def run_script(spec: dict[str, Any]) -> dict[str, Any]:
    """Run a user's Horovod script as this rank (``hvdtrain yarn run``), its output teed to this rank's log.

    ``spec``: ``zip`` (the script's folder, zipped; a relative path is in the container's working
    folder), ``script`` (its path inside), ``args``, ``logs`` and ``executor_cores``. The script runs in
    a child process from the unpacked folder and inherits the rank environment Horovod set
    (``HOROVOD_RANK``, ``HOROVOD_SIZE``, ``HOROVOD_LOCAL_RANK``, ``HOROVOD_HOSTNAME``, Gloo's rendezvous),
    so its ``hvd.init()`` joins the job. Never raises: the record carries the exit code.

    The log is written as the output arrives: on YARN to ``rank<N>.log`` in the container's log folder
    (:func:`container_log_dir`; appended to when a relaunch runs in the same container), where YARN's log
    aggregation finds it even if the container is killed; then copied to ``<logs>/rank<N>.log`` when the
    script ends. The output also goes to this process's stdout (the executor's stderr on YARN).
    """
    print(rank_banner(os.environ), file=sys.stderr, flush=True)
    gpus = assigned_gpus()
    rank = int(os.environ.get("HOROVOD_RANK", "-1"))
    env = {**os.environ, **gpu_env(gpus), "PYTHONUNBUFFERED": "1"}
    env.setdefault(cpus.TASK_CPUS_ENV, str(spec.get("executor_cores", "")))
    fs.prepare_hdfs_client(*[p for p in (spec["logs"],) if str(p).startswith(fs.LIBHDFS_SCHEMES)])
    folder = tempfile.mkdtemp(prefix=f"hvdtrain-rank{rank}-")
    log_uri = fs.join(spec["logs"], f"rank{rank}.log")
    log_dir = container_log_dir(os.environ)
    log_path = os.path.join(log_dir, f"rank{rank}.log") if log_dir else os.path.join(folder, ".hvdtrain-rank.log")
    try:
        with zipfile.ZipFile(os.path.abspath(spec["zip"])) as zf:
            zf.extractall(folder)
        cmd = [sys.executable, os.path.join(folder, spec["script"]), *spec["args"]]
        with open(log_path, "ab", buffering=0) as log:  # unbuffered: every chunk is in the file at once
            start = log.tell()
            code = tee(subprocess.Popen(cmd, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        bufsize=0), log, sys.stdout.buffer)
        with open(log_path, "rb") as log:  # this run's part: an earlier run in this container wrote the start
            log.seek(start)
            fs.write_bytes_atomic(log_uri, log.read())
        error = None if code == 0 else f"{spec['script']} exited with code {code}; its log: {log_uri}"
    except ANY_ERROR as exc:  # the driver reports it as this rank's failure
        code, error = 1, f"could not run {spec['script']}: {exc}"
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if error:
        print(f"hvdtrain: error: rank {rank}: {error}", file=sys.stderr, flush=True)
    return {**rank_record(rank, gpus, None, error, False, spec["zip"]), "exit_code": code, "log": log_uri,
            "container_log": os.path.basename(log_path) if log_dir else None,
            "local_rank": os.environ.get("HOROVOD_LOCAL_RANK")}


def tee(proc: "subprocess.Popen[bytes]", log: IO[bytes], out: IO[bytes]) -> int:
    """Copy a child's output to ``log`` and ``out`` as it arrives (a line without its end too: a progress bar);
    its exit code. ``proc`` is started with ``bufsize=0``, so a read returns what is there, not a full buffer."""
    stream = proc.stdout
    assert stream is not None  # started with stdout=PIPE
    while chunk := stream.read(65536):
        log.write(chunk)
        out.write(chunk)
        out.flush()
    return proc.wait()
