"""How many CPUs this process may use: the figure TensorFlow's thread pools are sized from.

``os.cpu_count()`` is the host's count. In a YARN container, a Docker or
Kubernetes pod, or under ``taskset``, a process may use far fewer, and thread
pools sized from the host oversubscribe the quota: every step then waits on
CPU throttling. The budget is the smallest of what applies:

* ``spark.task.cpus`` when Spark launched the rank (``HVDTRAIN_TASK_CPUS``,
  set by the YARN executor);
* the cgroup CPU quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` /
  ``cpu.cfs_period_us``) of this process's own cgroup (``/proc/self/cgroup``)
  and each of its parents, the tightest one, rounded up;
* the CPU affinity mask (``taskset``, ``numactl``, a cpuset).

A quota or a task's CPUs belong to this process alone; affinity and the host
count are shared by every rank on the host, so they are divided among the
host's ranks (:func:`per_rank`). Pure functions decide; :func:`detect` reads
the system.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable, Mapping, Optional

TASK_CPUS_ENV = "HVDTRAIN_TASK_CPUS"


@dataclass(frozen=True)
class CpuBudget:
    """CPUs this process may use, and what limits it."""

    cpus: int
    source: str  # "spark.task.cpus", "cgroup quota", "affinity" or "host"
    shared: bool  # True when every rank on the host draws on the same CPUs (affinity, host)


def cgroup_v2_quota(text: str) -> Optional[float]:
    """CPUs from a cgroup v2 ``cpu.max`` line (``"200000 100000"``; ``"max 100000"`` is no limit)."""
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    return int(parts[0]) / int(parts[1])


def cgroup_v1_quota(quota: str, period: str) -> Optional[float]:
    """CPUs from cgroup v1 ``cpu.cfs_quota_us`` and ``cpu.cfs_period_us`` (a quota of -1 is no limit)."""
    q, p = int(quota.strip()), int(period.strip())
    return None if q <= 0 or p <= 0 else q / p


def budget(host: int, affinity: Optional[int], quota: Optional[float], task_cpus: Optional[int]) -> CpuBudget:
    """The smallest limit that applies (pure)."""
    options = [CpuBudget(host, "host", True)]
    if affinity:
        options.append(CpuBudget(affinity, "affinity", True))
    if quota:
        options.append(CpuBudget(max(1, math.ceil(quota - 1e-9)), "cgroup quota", False))
    if task_cpus:
        options.append(CpuBudget(task_cpus, "spark.task.cpus", False))
    return min(options, key=lambda b: (b.cpus, b.shared))


def per_rank(b: CpuBudget, local_size: int) -> int:
    """This rank's share: a shared budget is split among the host's ranks (pure)."""
    return max(1, b.cpus // max(1, local_size)) if b.shared else b.cpus


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None


def cgroup_paths(proc_cgroup: str) -> tuple[Optional[str], Optional[str]]:
    """(v2 path, v1 ``cpu`` controller path) of this process from ``/proc/self/cgroup`` (pure)."""
    v2 = v1 = None
    for line in proc_cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v2, v1


def ancestors(path: str) -> list[str]:
    """``/a/b`` -> ``["/a/b", "/a", ""]``: a cgroup and every parent up to the mount root (pure)."""
    parts = [p for p in path.split("/") if p]
    return ["/" + "/".join(parts[:i]) if i else "" for i in range(len(parts), -1, -1)]


def _quota(read: Callable[[str], Optional[str]], proc_cgroup: Optional[str] = None) -> Optional[float]:
    """The tightest CPU quota on this process's own cgroup and its ancestors (nested limits all apply)."""
    v2, v1 = cgroup_paths(proc_cgroup if proc_cgroup is not None else read("/proc/self/cgroup") or "")
    limits: list[float] = []
    unified = any(read(f"/sys/fs/cgroup/{name}") is not None for name in ("cgroup.controllers", "cpu.max"))
    if unified:  # cgroup v2 mounted at /sys/fs/cgroup
        for folder in ancestors(v2 or ""):
            text = read(f"/sys/fs/cgroup{folder}/cpu.max")
            limit = cgroup_v2_quota(text) if text is not None else None
            limits += [limit] if limit else []
    else:
        for folder in ancestors(v1 or ""):
            q, p = (read(f"/sys/fs/cgroup/cpu{folder}/cpu.cfs_quota_us"),
                    read(f"/sys/fs/cgroup/cpu{folder}/cpu.cfs_period_us"))
            limit = cgroup_v1_quota(q, p) if q is not None and p is not None else None
            limits += [limit] if limit else []
    return min(limits) if limits else None


def detect(env: Mapping[str, str] = os.environ, read: Callable[[str], Optional[str]] = _read) -> CpuBudget:
    """This process's CPU budget, read from the environment, the cgroup and the affinity mask."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    task = env.get(TASK_CPUS_ENV, "")
    return budget(os.cpu_count() or 1, affinity, _quota(read), int(task) if task.isdigit() and int(task) > 0 else None)
