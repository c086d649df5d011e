"""Benchmarks on the one-machine Hadoop of ``hvdtrain cluster`` (started here, always stopped).

hdfs_input_throughput    the training input pipeline's records/s for one pass over the shards when they come
                         from the real NameNode and DataNode (``hdfs://``, staged to local disk through WebHDFS)
                         vs the same shards on local disk; interleaved pairs, target >= 0.5.
cluster_start            seconds from ``hvdtrain cluster up`` to NodeManagers registered and safe mode off,
                         against the 300 s ``up`` waits by default (information).
cluster_jvm_peak_memory  the cluster JVM's peak resident memory (VmHWM) at the end, against the 3 GB bound.

yarn_submit_overhead     seconds from ``hvdtrain yarn submit --master yarn --num-workers 2`` to the first training step
                         with the env archive already on HDFS (warm), against ``hvdtrain train --np 2`` of the same
                         job on this host, in interleaved pairs (target <= 3x); the cold submission (the archive
                         uploaded to the fresh cluster's env cache and localized) in its notes. Both read the
                         ranks' start-up breakdown (:mod:`hvdtrain.runtime.startup`; on YARN its clock starts at the
                         command, so spark-submit, the application master and the containers are its launcher).
"""
from __future__ import annotations

import os
import shutil
import tempfile

from benchmarks.bench_input import make_dataset
from benchmarks.bench_launch import hvdtrain_startup, median_phases, tiny_job
from benchmarks.common import Entry, interleaved
from hvdtrain.hadoop import envcheck, fs
from hvdtrain.hadoop.minicluster import cluster
from yarn import packaging
from yarn.packaging import PACK_CACHE_ENV

JVM_BOUND_MB = 3072.0


def run(quick: bool, extra: dict) -> list[Entry]:
    home = tempfile.mkdtemp(prefix="bench-hadoop-")
    spec = cluster.ClusterSpec(home=home, start_timeout=600, owner_pid=os.getpid())
    saved = os.environ.get("HADOOP_CONF_DIR")
    try:
        details = cluster.up(spec)
        os.environ["HADOOP_CONF_DIR"] = spec.conf_dir
        entries = [_input_throughput(details["fs_default"], quick), _submit_overhead(details["fs_default"], quick)]
        peak = _peak_rss_mb(details["pid"])
    finally:
        cluster.down(spec, quiet=True)
        if saved is None:
            os.environ.pop("HADOOP_CONF_DIR", None)
        else:
            os.environ["HADOOP_CONF_DIR"] = saved
        shutil.rmtree(home, ignore_errors=True)
    return entries + [
        Entry("cluster_start", details["start_seconds"], "s", "hvdtrain cluster up's default timeout", 300.0, None,
              lower_is_better=True, notes={"nodemanagers": spec.nodemanagers}),
        Entry("cluster_jvm_peak_memory", peak, "MB", "the 3 GB bound", JVM_BOUND_MB, 1.0, lower_is_better=True,
              notes={"heap_cap_mb": spec.heap_mb}),
    ]


def _input_throughput(fs_default: str, quick: bool) -> Entry:
    import dataclasses

    from hvdtrain import data

    local_root = tempfile.mkdtemp(prefix="bench-hdfs-local-")
    try:
        m = make_dataset(local_root, 4000 if quick else 20000)
        remote_root = f"{fs_default}/bench/ds"
        for folder, _, files in os.walk(local_root):
            for name in files:
                path = os.path.join(folder, name)
                fs.copy_from_local(path, fs.join(remote_root, os.path.relpath(path, local_root)))
        remote = dataclasses.replace(m, location=fs.join(remote_root, "manifest.json"))
        records = m.split("train").records
        batch = 64

        def one_pass(manifest) -> None:
            stage = tempfile.mkdtemp(prefix="bench-hdfs-stage-")  # fresh: every pass reads from the DataNode
            try:
                ds = data.train_dataset(manifest, data.TrainStream(rank=0, size=1, batch_size=batch,
                                                                   shuffle_buffer=1024, seed=2), stage_dir=stage)
                for _ in zip(range(records // batch), ds):
                    pass
            finally:
                shutil.rmtree(stage, ignore_errors=True)

        times = interleaved({"hdfs": lambda: one_pass(remote), "local": lambda: one_pass(m)},
                            reps=2 if quick else 5)
    finally:
        shutil.rmtree(local_root, ignore_errors=True)
    n = records // batch * batch
    return Entry.paired("hdfs_input_throughput", [n / t for t in times["hdfs"]], "records/s",
                        "the same shards on local disk", [n / t for t in times["local"]], 0.5,
                        notes={"records": n, "batch_size": batch, "shards": len(m.split("train").shards),
                               "path": "hdfs:// -> WebHDFS (no libhdfs), staged to local disk"})


def _submit_overhead(fs_default: str, quick: bool) -> Entry:
    root = tempfile.mkdtemp(prefix="bench-yarn-")
    try:
        yarn = cluster.yarn_settings(f"{fs_default}/bench/envs", cluster.pyspark_jars_dir())
        job, _ = tiny_job(root, yarn=yarn)  # a local dataset: the executors share this host's disk
        out = os.path.join(root, "work", "runs", "launch")
        packed_before = _pack_cached()
        cold = _yarn_startup(job, f"{out}-yarn", 0)
        warm, local, loads = [], [], []
        for i in range(2 if quick else 3):
            loads.append(round(os.getloadavg()[0], 1))
            warm.append(_yarn_startup(job, f"{out}-yarn", i + 1))
            local.append(hvdtrain_startup(job, out, i))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return Entry.paired("yarn_submit_overhead", [w["total"] for w in warm], "s",
                        "hvdtrain train --np 2 to the first step", [b["total"] for b in local], 3.0,
                        lower_is_better=True,
                        notes={"cold_s": cold["total"], "cold_phases_s": cold, "cold_packed": not packed_before,
                               "warm_phases_median_s": median_phases(warm),
                               "local_phases_median_s": median_phases(local), "load_before": loads,
                               "workers": 2, "cluster": "hvdtrain cluster (one host, two NodeManagers)"})


def _pack_cached() -> bool:
    """Whether $HVDTRAIN_PACK_CACHE holds this environment's packed archive (the cold submission then only
    uploads it)."""
    folder = os.environ.get(PACK_CACHE_ENV)
    if not folder:
        return False
    digest = packaging.env_hash(packaging.current_identity(envcheck.probe_horovod_build()))
    return os.path.exists(os.path.join(folder, f"{digest}.tar.gz"))


def _yarn_startup(job: str, output: str, attempt: int) -> dict[str, float]:
    """``hvdtrain yarn submit JOB --master yarn --num-workers 2`` (client mode); its ranks' start-up breakdown."""
    return hvdtrain_startup(job, output, attempt, (("yarn", "submit"), ("--master", "yarn", "--num-workers", "2")),
                            {"SPARK_LOCAL_IP": "127.0.0.1"})


def _peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")
