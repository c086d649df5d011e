"""GPU benchmark worker (``make bench-gpu``); rank 0 prints 'BENCH {json}'.

    horovodrun -np N -H localhost:N python -m benchmarks.gpu_worker allreduce [--quick]
    horovodrun -np N -H localhost:N python -m benchmarks.gpu_worker train DATASET PRECISION STEPS

allreduce: bus bandwidth of a 64 MB float32 all-reduce on GPU tensors (NCCL
when Horovod is built with it) and on host tensors (Gloo), interleaved.
train: samples/s of hvdtrain's step on the GPU benchmark model under
``train.mixed_precision`` PRECISION (none, bfloat16, float16).
Each rank is pinned to its own GPU by ``hvdtrain.runtime.distributed.init``.
"""
from __future__ import annotations

import json
import sys
import time

import numpy as np

from benchmarks.common import interleaved

BATCH = 128  # per GPU
MODEL = {"embed_dim": 256, "num_heads": 4, "ff_dim": 1024, "num_layers": 4}
WARMUP = 10


def allreduce(quick: bool) -> dict:
    import tensorflow as tf

    from hvdtrain.runtime import distributed

    rank = distributed.init()
    import horovod.tensorflow as hvd

    n = (8 if quick else 64) << 20
    with tf.device("/GPU:0"):
        on_gpu = tf.ones([n // 4], tf.float32)
    with tf.device("/CPU:0"):
        on_host = tf.ones([n // 4], tf.float32)
    times = interleaved({"gpu": lambda: hvd.allreduce(on_gpu, op=hvd.Sum, name="gpu").numpy(),
                         "host": lambda: hvd.allreduce(on_host, op=hvd.Sum, name="host").numpy()},
                        reps=3 if quick else 7, before=lambda: hvd.allreduce(tf.zeros([1]), name="barrier").numpy())
    factor = 2 * (rank.size - 1) / rank.size  # NCCL-tests bus bandwidth
    return {"rank": rank.rank, "size": rank.size, "bytes": n,
            "busbw_gbps": {k: [n / t / 1e9 * factor for t in v] for k, v in times.items()}}


def train(dataset: str, precision: str, steps: int) -> dict:
    import tensorflow as tf

    from hvdtrain import data
    from hvdtrain.core import config
    from hvdtrain.data import contract, manifest
    from hvdtrain.runtime import distributed
    from hvdtrain.training import state
    from hvdtrain.training import steps as steps_lib

    rank = distributed.init()
    m = manifest.read(dataset)
    cfg = config.from_dict({"name": "bench-gpu", "source": {"table": "bench.rows"}, "etl": {"output": dataset},
                            "model": MODEL, "train": {"batch_size": BATCH, "mixed_precision": precision}})
    model, optimizer = state.build_state(cfg, data.check_manifest(m, cfg.model), rank.size)
    distributed.broadcast_state(model, optimizer)
    ds = data.train_dataset(m, data.TrainStream(rank=rank.rank, size=rank.size, batch_size=BATCH,
                                                shuffle_buffer=1024, seed=1),
                            features=[*contract.MODEL_INPUTS["transformer"], "label"])
    step = steps_lib.make_train_step(model, optimizer, "label")
    batches = iter(ds.prefetch(tf.data.AUTOTUNE))

    def run(k: int) -> None:
        out = None
        for _ in range(k):
            out = step(next(batches))
        float(out[0])

    run(WARMUP)
    start = time.perf_counter()
    run(steps)
    seconds = time.perf_counter() - start
    return {"rank": rank.rank, "size": rank.size, "precision": precision,
            "samples_per_sec_per_gpu": steps * BATCH / seconds}


def main() -> None:
    mode = sys.argv[1]
    if mode == "allreduce":
        out = allreduce("--quick" in sys.argv)
    else:
        out = train(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    if out["rank"] == 0:
        print("BENCH " + json.dumps(out), flush=True)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
