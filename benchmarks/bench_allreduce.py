"""allreduce_busbw: Gloo all-reduce between 2 local ranks vs memcpy; fusion on vs off."""
from __future__ import annotations

import numpy as np

from benchmarks.common import Entry, median_time
from benchmarks.launch import horovodrun

SIZE_64MB = 64 << 20


def memcpy_gbps(nbytes: int = SIZE_64MB) -> float:
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    return nbytes / median_time(lambda: np.copyto(dst, src)) / 1e9


def run(quick: bool, extra: dict) -> list[Entry]:
    args = ["--quick"] if quick else []
    # Large tensors skip the fusion buffer (its extra copy halves bandwidth here, see DESIGN.md).
    sweep = horovodrun(2, "benchmarks.allreduce_worker", ["sweep", *args],
                       env={"HOROVOD_FUSION_THRESHOLD": "0"})["sweep"]
    memcpy = memcpy_gbps()
    extra["allreduce_sweep"] = sweep
    extra["memcpy_gbps"] = memcpy
    at = next((p for p in sweep if p["bytes"] == SIZE_64MB), sweep[-1])
    fused = horovodrun(2, "benchmarks.allreduce_worker", ["fusion", *args])["fusion_seconds"]
    unfused = horovodrun(2, "benchmarks.allreduce_worker", ["fusion", *args],
                         env={"HOROVOD_FUSION_THRESHOLD": "0"})["fusion_seconds"]
    return [
        Entry("allreduce_busbw", at["busbw_gbps"], "GB/s", f"memcpy of {at['bytes'] >> 20} MB", memcpy, 0.15,
              notes={"bytes": at["bytes"], "ranks": 2, "HOROVOD_FUSION_THRESHOLD": "0"}),
        # value = time without fusion, baseline = time with it: the ratio is off/on.
        Entry("allreduce_fusion", unfused, "s", "200 x 4 KB with fusion (default threshold)", fused, 1.5,
              notes={"tensors": 200, "tensor_bytes": 4096}),
    ]
