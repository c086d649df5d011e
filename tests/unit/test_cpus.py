"""The CPU budget TensorFlow's pools are sized from: cgroup quotas, affinity, spark.task.cpus."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hvdtrain.runtime import cpus

REPO = Path(__file__).resolve().parents[2]


def test_cgroup_quota_files_parse() -> None:
    assert cpus.cgroup_v2_quota("250000 100000\n") == 2.5
    assert cpus.cgroup_v2_quota("max 100000\n") is None
    assert cpus.cgroup_v1_quota("-1\n", "100000\n") is None
    assert cpus.cgroup_v1_quota("50000", "100000") == 0.5


@pytest.mark.parametrize("host, affinity, quota, task, expect", [
    (64, None, None, None, (64, "host", True)),
    (64, 8, None, None, (8, "affinity", True)),
    (64, 64, 2.5, None, (3, "cgroup quota", False)),  # a fraction of a CPU still needs a thread
    (64, 64, 0.5, None, (1, "cgroup quota", False)),
    (64, 16, 8.0, 4, (4, "spark.task.cpus", False)),
    (4, 4, 16.0, 8, (4, "host", True)),  # the host is the tightest
])
def test_the_smallest_limit_wins(host, affinity, quota, task, expect) -> None:
    b = cpus.budget(host, affinity, quota, task)
    assert (b.cpus, b.source, b.shared) == expect


def test_a_shared_budget_is_split_among_the_hosts_ranks_and_a_quota_is_not() -> None:
    assert cpus.per_rank(cpus.CpuBudget(8, "affinity", True), 4) == 2
    assert cpus.per_rank(cpus.CpuBudget(2, "host", True), 4) == 1
    assert cpus.per_rank(cpus.CpuBudget(3, "cgroup quota", False), 4) == 3  # each container has its own


def test_detect_reads_the_cgroup_and_the_task_cpus(monkeypatch) -> None:
    files = {"/sys/fs/cgroup/cpu.max": "100000 100000"}
    assert cpus.detect({}, files.get).cpus == 1
    v1 = {"/sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1", "/sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000"}
    assert cpus.detect({cpus.TASK_CPUS_ENV: "1"}, v1.get).source == "spark.task.cpus"


PROBE = """
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
logging.getLogger("hvdtrain").setLevel(logging.INFO)
import tensorflow as tf
from hvdtrain.runtime import distributed
from hvdtrain.training import runtime
from hvdtrain.core.config import TrainConfig
threads = runtime.configure_tf(distributed.init(use_horovod=False), TrainConfig())
print("POOLS", threads, tf.config.threading.get_intra_op_parallelism_threads(),
      tf.config.threading.get_inter_op_parallelism_threads())
"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("taskset") is None, reason="taskset (util-linux) is not installed")
def test_training_sizes_tensorflows_pools_from_the_affinity_mask() -> None:
    """Under `taskset -c 0` a rank sees one CPU, whatever os.cpu_count() says."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop(cpus.TASK_CPUS_ENV, None)
    out = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", PROBE], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert "POOLS 1 1 1" in out, out
    assert "CPU budget 1 for this rank (affinity: 1)" in out
