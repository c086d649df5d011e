"""Training throughput worker; rank 0 prints 'BENCH {json}'.

    [horovodrun -np N ... ] python -m benchmarks.train_worker DATASET MODE STEPS [--threads 1]

--threads T limits TensorFlow's intra-op and inter-op pools and the input
pipeline's private pool to T threads. --pin pins the process (every thread it
starts: TensorFlow's, tf.data's, Horovod's background thread, Gloo's) to one
core, core (local rank mod cores), so a 1-rank run cannot borrow an idle core.

MODE hvd:   hvdtrain's own step (GradientTape + Horovod grouped all-reduce),
            under horovodrun or as a plain process (single-process fallback).
MODE keras: a plain Keras ``model.fit`` on the same model and data, no Horovod.
Reports steady-state samples/s (after a warm-up that includes tracing) and
the wall-clock time at which the first step completed.
"""
from __future__ import annotations

import argparse
import json
import os
import time

WARMUP = 5
BATCH = 64


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("dataset")
    p.add_argument("mode", choices=["hvd", "keras"])
    p.add_argument("steps", type=int)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--pin", action="store_true")
    args = p.parse_args()
    if args.pin:  # before TensorFlow starts any thread: threads inherit the mask
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[int(os.environ.get("HOROVOD_LOCAL_RANK", "0")) % len(cores)]})

    import tensorflow as tf

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    import keras

    from hvdtrain import config, data, distributed, manifest
    from hvdtrain.data import contract
    from hvdtrain.training import state
    from hvdtrain.training import steps as steps_lib

    rank = distributed.init() if args.mode == "hvd" else distributed.RankInfo(0, 1, 0, 1, "localhost", "single")
    m = manifest.read(args.dataset)
    cfg = config.from_dict({"name": "bench", "source": {"table": "bench.rows"}, "etl": {"output": args.dataset},
                            "model": {"embed_dim": 64, "num_heads": 2, "ff_dim": 128, "num_layers": 1},
                            "train": {"batch_size": BATCH, "learning_rate": 1e-3}})
    shape = data.check_manifest(m, cfg.model)
    model, optimizer = state.build_state(cfg, shape, rank.size)
    ds = data.train_dataset(m, data.TrainStream(rank=rank.rank, size=rank.size, batch_size=BATCH, shuffle_buffer=1024,
                                                seed=1), features=[*contract.MODEL_INPUTS["transformer"], "label"])
    if args.threads:  # the input pipeline gets the same budget as the model: no idle core to borrow
        options = tf.data.Options()
        options.threading.private_threadpool_size = args.threads
        options.threading.max_intra_op_parallelism = 1
        ds = ds.with_options(options)
    if args.mode == "hvd":
        distributed.broadcast_state(model, optimizer)
        step = steps_lib.make_train_step(model, optimizer, "label")
        batches = iter(ds)

        def run(n: int) -> None:
            out = None
            for _ in range(n):
                out = step(next(batches))
            float(out[0])  # wait for the last step
        run(1)
        first_step_at = time.time()
        run(WARMUP)
        start = time.perf_counter()
        run(args.steps)
        seconds = time.perf_counter() - start
    else:
        # Keras takes a dataset, not an iterator: epoch 1 is the warm-up (tracing), epoch 2 is timed.
        model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        marks: dict[str, float] = {}

        class Clock(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                marks.setdefault("first", time.time())

            def on_epoch_begin(self, epoch, logs=None):
                marks[f"begin{epoch}"] = time.perf_counter()

            def on_epoch_end(self, epoch, logs=None):
                marks[f"end{epoch}"] = time.perf_counter()

        xy = ds.map(lambda b: ({k: b[k] for k in contract.MODEL_INPUTS["transformer"]}, b["label"]))
        model.fit(xy, steps_per_epoch=args.steps, epochs=2, verbose=0, callbacks=[Clock()])
        first_step_at, seconds = marks["first"], marks["end1"] - marks["begin1"]
    if rank.rank == 0:
        print("BENCH " + json.dumps({"samples_per_sec": args.steps * BATCH * rank.size / seconds,
                                     "first_step_at": first_step_at, "size": rank.size}), flush=True)


if __name__ == "__main__":
    main()
