"""Runs under horovodrun: times hvd.allreduce; rank 0 prints one JSON line.

    horovodrun -np 2 -H localhost:2 --gloo python -m benchmarks.allreduce_worker sweep|fusion [--quick]
"""
from __future__ import annotations

import json
import sys

import numpy as np

from benchmarks.common import median_time


def main() -> None:
    import horovod.tensorflow as hvd
    import tensorflow as tf

    mode, quick = sys.argv[1], "--quick" in sys.argv
    hvd.init()
    reps = 5
    out: dict = {"size": hvd.size()}
    if mode == "sweep":
        points = []
        top = 22 if quick else 28  # 4 MB or 256 MB
        for log2 in range(12, top + 1, 2):
            n = (1 << log2) // 4
            x = tf.constant(np.ones(n, dtype=np.float32))
            sec = median_time(lambda: hvd.allreduce(x, op=hvd.Sum, name=f"ar{log2}").numpy(), reps)
            algbw = n * 4 / sec / 1e9
            # NCCL-tests bus bandwidth: algbw * 2(n-1)/n (equal to algbw for 2 ranks).
            points.append({"bytes": n * 4, "seconds": sec, "algbw_gbps": algbw,
                           "busbw_gbps": algbw * 2 * (hvd.size() - 1) / hvd.size()})
        out["sweep"] = points
    else:
        xs = [tf.constant(np.full(1024, float(i), dtype=np.float32)) for i in range(200)]  # 200 x 4 KB

        @tf.function
        def many() -> list:
            return [hvd.allreduce(x, op=hvd.Sum, name=f"small{i}") for i, x in enumerate(xs)]

        out["fusion_seconds"] = median_time(lambda: [t.numpy() for t in many()], reps)
    if hvd.rank() == 0:
        print("BENCH " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
