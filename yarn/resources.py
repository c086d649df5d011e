"""What a Spark-on-YARN submission asks YARN for, by Spark's own sizing rules, and whether it can fit.

Spark asks YARN for each executor's container: ``spark.executor.memory`` plus its overhead
(``spark.executor.memoryOverhead``, or ``spark.executor.memoryOverheadFactor`` (0.10) of the heap with at
least ``spark.executor.minMemoryOverhead`` (384 MiB)), plus ``spark.executor.pyspark.memory`` and off-heap
memory when set, with ``spark.executor.cores`` vcores; and for the application master: in client mode
``spark.yarn.am.memory`` (512 MiB) plus ``spark.yarn.am.memoryOverhead`` (the same 10 %/384 MiB rule) and
``spark.yarn.am.cores`` (1), in cluster mode the driver's memory, overhead and ``spark.driver.cores``.

A training job's executor container also holds its rank: horovod.spark starts each rank as a Python process
beside the executor's JVM (TensorFlow, the input pipeline's buffers, the model), which Spark's overhead rule does
not size. YARN counts that process against the container, and a NodeManager that enforces memory (its monitor's
physical memory check, or cgroups) kills the container when the sum passes it. So a training submission
(:func:`executor_overhead`) sets ``spark.executor.memoryOverhead`` to Spark's own rule plus ``yarn.rank_memory``;
an explicit ``spark.executor.memoryOverhead`` in ``yarn.spark_conf`` is used as it is.

:func:`requests` computes these from the ``yarn:`` block (pure); :func:`misfits` compares them with the queue's
limits (:mod:`hvdtrain.hadoop.resourcemanager`), and :func:`check` raises one line naming the setting, the
request, the limit and the fix, before anything is packed or submitted.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from hvdtrain.core.config import YarnConfig
from hvdtrain.core.errors import ConfigError
from hvdtrain.hadoop.resourcemanager import Limits

OVERHEAD_FACTOR = 0.10
MIN_OVERHEAD_MB = 384
MIN_TRAINING_HEAP_MB = 1024  # a training executor's JVM runs one task (the rank's service): 1 GB is ample
AM_MEMORY = "512m"
_UNITS = {"": 1 / 1024 ** 2, "b": 1 / 1024 ** 2, "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 ** 2, "p": 1024 ** 3}


def memory_mb(text: str, key: str) -> int:
    """A JVM memory string (``8g``, ``1536m``, ``512``: MiB without a unit, as Spark reads these) in MiB (pure)."""
    match = re.fullmatch(r"\s*(\d+)\s*([kmgtp]?)b?\s*", str(text).lower())
    if not match:
        raise ConfigError(key, text, "must be a memory size such as 4g or 1536m")
    number, unit = match.groups()
    return int(int(number) * _UNITS[unit or "m"])


@dataclass(frozen=True)
class Request:
    """One kind of container the job asks for."""

    role: str  # "executor" or "application master"
    count: int
    heap_mb: int
    overhead_mb: int  # everything beyond the heap YARN counts: overhead, PySpark and off-heap memory
    vcores: int
    memory_key: str  # the hvdtrain setting that sizes the heap
    cores_key: str
    fixed_overhead: bool  # the overhead is set explicitly (it does not follow the heap)
    rank_mb: int = 0  # of the overhead, yarn.rank_memory: the rank's own process (training executors only)

    @property
    def memory_mb(self) -> int:
        return self.heap_mb + self.overhead_mb


def _overhead(conf: Mapping[str, str], role: str, heap_mb: int) -> tuple[int, bool]:
    explicit = conf.get(f"spark.{role}.memoryOverhead")
    if explicit is not None:
        return memory_mb(explicit, f"yarn.spark_conf.spark.{role}.memoryOverhead"), True
    factor = float(conf.get(f"spark.{role}.memoryOverheadFactor", OVERHEAD_FACTOR))
    floor = memory_mb(conf.get(f"spark.{role}.minMemoryOverhead", f"{MIN_OVERHEAD_MB}m"),
                      f"yarn.spark_conf.spark.{role}.minMemoryOverhead")
    return max(int(factor * heap_mb), floor), False


def executor_overhead(y: YarnConfig) -> Optional[str]:
    """``spark.executor.memoryOverhead`` for a training job's executors (pure): Spark's rule for the heap plus
    ``yarn.rank_memory``, or None when ``yarn.spark_conf`` sets it (used as it is)."""
    if "spark.executor.memoryOverhead" in y.spark_conf:
        return None
    heap = memory_mb(y.spark_conf.get("spark.executor.memory", y.executor_memory), "yarn.executor_memory")
    return f"{_overhead(y.spark_conf, 'executor', heap)[0] + memory_mb(y.rank_memory, 'yarn.rank_memory')}m"


def requests(y: YarnConfig, deploy_mode: str, executors: int, ranks: bool = False) -> list[Request]:
    """The executors' and the application master's containers of a submission (pure); ``ranks``: a training job,
    whose executors each hold a rank's process (:func:`executor_overhead`)."""
    conf = y.spark_conf
    heap = memory_mb(conf.get("spark.executor.memory", y.executor_memory), "yarn.executor_memory")
    overhead, fixed = _overhead(conf, "executor", heap)
    rank = memory_mb(y.rank_memory, "yarn.rank_memory") if ranks and not fixed else 0
    overhead += rank
    if "spark.executor.pyspark.memory" in conf:
        overhead += memory_mb(conf["spark.executor.pyspark.memory"], "yarn.spark_conf.spark.executor.pyspark.memory")
    if conf.get("spark.memory.offHeap.enabled", "false").lower() == "true":
        overhead += memory_mb(conf.get("spark.memory.offHeap.size", "0"), "yarn.spark_conf.spark.memory.offHeap.size")
    cores = int(conf.get("spark.executor.cores", y.executor_cores))
    out = [Request("executor", executors, heap, overhead, cores, "yarn.executor_memory", "yarn.executor_cores",
                   fixed, rank)]
    if deploy_mode == "cluster":  # the driver runs in the application master's container
        am_heap = memory_mb(conf.get("spark.driver.memory", y.driver_memory), "yarn.driver_memory")
        am_overhead, am_fixed = _overhead(conf, "driver", am_heap)
        am_cores = int(conf.get("spark.driver.cores", 1))
        keys = ("yarn.driver_memory", "yarn.spark_conf.spark.driver.cores")
    else:
        am_heap = memory_mb(conf.get("spark.yarn.am.memory", AM_MEMORY), "yarn.spark_conf.spark.yarn.am.memory")
        am_overhead, am_fixed = _overhead({"spark.am.memoryOverhead": conf["spark.yarn.am.memoryOverhead"]}
                                          if "spark.yarn.am.memoryOverhead" in conf else {}, "am", am_heap)
        am_cores = int(conf.get("spark.yarn.am.cores", 1))
        keys = ("yarn.spark_conf.spark.yarn.am.memory", "yarn.spark_conf.spark.yarn.am.cores")
    out.append(Request("application master", 1, am_heap, am_overhead, am_cores, *keys, am_fixed))
    return out


def base_overhead(request: Request, heap_mb: int) -> int:
    """The request's overhead for ``heap_mb`` of heap, without the rank's share (pure)."""
    if request.fixed_overhead:
        return request.overhead_mb - request.rank_mb
    spark_rule = max(int(OVERHEAD_FACTOR * request.heap_mb), MIN_OVERHEAD_MB)
    return max(int(OVERHEAD_FACTOR * heap_mb), MIN_OVERHEAD_MB) + request.overhead_mb - request.rank_mb - spark_rule


def largest_heap(limit_mb: int, request: Request) -> int:
    """The largest heap whose container fits ``limit_mb`` under the same overhead rule (pure)."""
    if request.fixed_overhead:
        return max(limit_mb - request.overhead_mb, 0)
    extra = request.overhead_mb - max(int(OVERHEAD_FACTOR * request.heap_mb), MIN_OVERHEAD_MB)  # PySpark, off-heap
    room = limit_mb - extra
    return max(min(room - MIN_OVERHEAD_MB, math.floor(room / (1 + OVERHEAD_FACTOR))), 0)


def _setting(y: YarnConfig, key: str) -> str:
    name = key.split(".", 1)[1]
    if name.startswith("spark_conf."):
        return y.spark_conf.get(name[len("spark_conf."):], "its default")
    return str(getattr(y, name))


def misfits(y: YarnConfig, reqs: Sequence[Request], limits: Limits, gang: bool) -> list[ConfigError]:
    """Every way the requests cannot fit the queue (pure): a container above the queue's largest, and for a
    ``gang`` job (every rank must run at once) all its containers above what the queue can ever hold."""
    where = f"queue {limits.queue} of the ResourceManager at {limits.source}"
    out = []
    for r in reqs:
        if r.memory_mb > limits.max_memory_mb:
            fit = largest_heap(limits.max_memory_mb, r)
            rank = f" (of it yarn.rank_memory {r.rank_mb:,} MB, for the rank's process)" if r.rank_mb else ""
            key, fix = r.memory_key, f"set {r.memory_key}={fit}m or less"
            if r.rank_mb and fit < MIN_TRAINING_HEAP_MB:  # the rank's share leaves the JVM too little
                room = limits.max_memory_mb - MIN_TRAINING_HEAP_MB - base_overhead(r, MIN_TRAINING_HEAP_MB)
                key = "yarn.rank_memory"
                fix = (f"set yarn.rank_memory={room}m or less with {r.memory_key}={MIN_TRAINING_HEAP_MB}m"
                       if room > 0 else "use a queue with larger containers (--queue)")
            out.append(ConfigError(key, _setting(y, key),
                                   f"does not fit: each {r.role} container asks YARN for {r.heap_mb:,} MB + "
                                   f"{r.overhead_mb:,} MB overhead{rank} = {r.memory_mb:,} MB, and {where} grants at "
                                   f"most {limits.max_memory_mb:,} MB per container; {fix}"))
        if r.vcores > limits.max_vcores:
            out.append(ConfigError(r.cores_key, r.vcores,
                                   f"does not fit: each {r.role} container asks YARN for {r.vcores} vcores, and "
                                   f"{where} grants at most {limits.max_vcores} per container; set "
                                   f"{r.cores_key}={limits.max_vcores} or fewer"))
    step = max(limits.min_memory_mb, 1)  # YARN rounds each container up to a multiple of its minimum
    if gang and not out and limits.nodes:
        packed = nodes_hold(reqs, limits.nodes, step)
        if packed is not None:
            executor = reqs[0]
            nodes = ", ".join(f"{m:,} MB and {c} vcores" for m, c in limits.nodes)
            out.append(ConfigError("yarn.num_workers", executor.count,
                                   f"can never run at once: {executor.count} executors (one rank each, all "
                                   f"started together) need {_rounded(executor, step):,} MB and {executor.vcores} "
                                   f"vcores each, beside the application master's {_rounded(reqs[1], step):,} MB and "
                                   f"{reqs[1].vcores} vcores, and the NodeManagers of the ResourceManager at "
                                   f"{limits.source} ({nodes}) hold at most {packed} of them at once; use fewer or "
                                   "smaller workers (--num-workers, yarn.executor_memory, yarn.rank_memory, "
                                   "yarn.executor_cores)"))
    if gang and not out and limits.queue_memory_mb is not None and limits.queue_vcores is not None:
        memory = sum(r.count * step * math.ceil(r.memory_mb / step) for r in reqs)
        vcores = sum(r.count * r.vcores for r in reqs)
        if memory > limits.queue_memory_mb or vcores > limits.queue_vcores:
            ranks = reqs[0].count
            out.append(ConfigError("yarn.num_workers", ranks,
                                   f"can never run at once: {ranks} executors (one rank each, all started together) "
                                   f"and the application master take {memory:,} MB (YARN rounds each container up to "
                                   f"{step:,} MB steps) and {vcores} vcores, and {where} "
                                   f"holds at most {limits.queue_memory_mb:,} MB and {limits.queue_vcores} vcores; "
                                   "use fewer or smaller workers (--num-workers, yarn.executor_memory, "
                                   "yarn.executor_cores) or a larger queue (--queue)"))
    return out


def _rounded(r: Request, step: int) -> int:
    return step * math.ceil(r.memory_mb / step)


def nodes_hold(reqs: Sequence[Request], nodes: Sequence[tuple[int, int]], step: int) -> Optional[int]:
    """None when the executors (``reqs[0]``, identical) and the application master (``reqs[1]``) can be placed on
    ``nodes`` ((memory MB, vcores) each) all at once; else the most executors any placement holds (pure). Exact:
    the master goes on each node in turn, and each node then takes as many executors as its rest holds."""
    executor, master = reqs[0], reqs[1]
    em, am = _rounded(executor, step), _rounded(master, step)
    best = 0
    for i, (memory, vcores) in enumerate(nodes):
        if am > memory or master.vcores > vcores:
            continue
        rest = [(m - am, c - master.vcores) if j == i else (m, c) for j, (m, c) in enumerate(nodes)]
        held = sum(min(m // em, c // executor.vcores) if executor.vcores else m // em for m, c in rest)
        if held >= executor.count:
            return None
        best = max(best, held)
    return best


def check(y: YarnConfig, deploy_mode: str, executors: int, gang: bool, limits: Optional[Limits]) -> None:
    """Raise the first misfit (one line); nothing when ``limits`` is None (not read) or all fit."""
    if limits is None:
        return
    found = misfits(y, requests(y, deploy_mode, executors, ranks=gang), limits, gang)
    if found:
        raise found[0]
