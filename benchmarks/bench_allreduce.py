"""All-reduce between 2 local ranks against its peers, and fusion on vs off.

allreduce_vs_tcp      Horovod Gloo bus bandwidth at 64 MB / loopback TCP with two concurrent streams,
                      one each way, between the same 2 processes (the transport's ceiling).
allreduce_vs_tf_ring  the same Horovod all-reduce / TensorFlow's ring collective all-reduce
                      (MultiWorkerMirroredStrategy, CommunicationImplementation.RING) in the same processes.
allreduce_fusion      200 x 4 KB all-reduces without / with Horovod's tensor fusion.
The three transports are interleaved (Horovod, TF, TCP, Horovod, ...); each ratio is
reported as min/median/max over the pairs.
"""
from __future__ import annotations

import statistics

import numpy as np

from benchmarks.common import Entry, median_time
from benchmarks.launch import free_ports, horovodrun

SIZE_64MB = 64 << 20
NO_FUSION = {"HOROVOD_FUSION_THRESHOLD": "0"}  # large tensors skip the fusion buffer's extra copy (DESIGN.md)


def memcpy_gbps(nbytes: int = SIZE_64MB) -> float:
    """Host memory copy bandwidth (benchmarks.bench_scale's copy term; no longer an all-reduce baseline)."""
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    return nbytes / median_time(lambda: np.copyto(dst, src)) / 1e9


def run(quick: bool, extra: dict) -> list[Entry]:
    args = ["--quick"] if quick else []
    ports = ",".join(map(str, free_ports(3)))
    peers = horovodrun(2, "benchmarks.allreduce_worker", ["sweep", ports, *args], env=NO_FUSION)
    bw, sweep = peers["busbw_gbps"], peers["sweep"]
    extra["allreduce_sweep"] = sweep
    extra["tcp_gbps"] = statistics.median(bw["tcp"])
    fused = horovodrun(2, "benchmarks.allreduce_worker", ["fusion", *args])["fusion_seconds"]
    unfused = horovodrun(2, "benchmarks.allreduce_worker", ["fusion", *args], env=NO_FUSION)["fusion_seconds"]
    notes = {"bytes": peers["bytes"], "ranks": 2, "reps": len(bw["horovod"]), **NO_FUSION}
    mb = peers["bytes"] >> 20
    return [
        Entry.paired("allreduce_vs_tcp", bw["horovod"], "GB/s", f"loopback TCP, 2 streams one each way, {mb} MB",
                     bw["tcp"], 0.5, notes=notes),
        Entry.paired("allreduce_vs_tf_ring", bw["horovod"], "GB/s", f"TF ring collective all-reduce (MWMS), {mb} MB",
                     bw["tf_ring"], 1.0, notes=notes),
        # value = time without fusion, baseline = time with it: the ratio is off/on.
        Entry("allreduce_fusion", unfused, "s", "200 x 4 KB with fusion (default threshold)", fused, 1.5,
              notes={"tensors": 200, "tensor_bytes": 4096}),
    ]
