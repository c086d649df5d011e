"""Training throughput worker; rank 0 prints 'BENCH {json}'.

    [horovodrun -np N ... ] python -m benchmarks.train_worker DATASET MODE STEPS [--threads 1]
        [--model demo|large] [--steps-per-call K] [--loop] [--allreduce grouped|overlap] [--fp16]

--threads T limits TensorFlow's intra-op and inter-op pools and the input
pipeline's private pool to T threads. --pin pins the process (every thread it
starts: TensorFlow's, tf.data's, Horovod's background thread, Gloo's) to one
core, core (local rank mod cores), so a 1-rank run cannot borrow an idle core.

MODE hvd:   hvdtrain's own step (GradientTape + Horovod grouped all-reduce),
            under horovodrun or as a plain process (single-process fallback).
MODE keras: a plain Keras ``model.fit`` on the same model and data, no Horovod.
Reports steady-state samples/s (after a warm-up that includes tracing) and
the wall-clock time at which the first step completed.

--model: ``demo`` (configs/demo.yaml's transformer) or ``large`` (about 10x its
parameters). --steps-per-call K: hvdtrain's step runs K optimizer steps per
compiled call (``train.steps_per_call``). --loop: the hvd step runs inside
hvdtrain's own loop (:func:`hvdtrain.training.loop.fit` with the per-step hooks a run
has: progress lines, per-step metrics, the stall watchdog's phases), two
epochs of STEPS steps, the second timed, as ``model.fit``'s is. --allreduce and --fp16: how the hvd step
averages gradients (``train.allreduce``, ``train.fp16_allreduce``).
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

WARMUP = 5
BATCH = 64
MODELS = {"demo": {"embed_dim": 64, "num_heads": 2, "ff_dim": 128, "num_layers": 1},
          "large": {"embed_dim": 256, "num_heads": 4, "ff_dim": 512, "num_layers": 2}}


def bench_config(dataset: str, model: str) -> dict:
    """The job config both sides build their model and optimizer from."""
    return {"name": "bench", "source": {"table": "bench.rows"}, "etl": {"output": dataset},
            "model": MODELS[model], "train": {"batch_size": BATCH, "learning_rate": 1e-3}}


def timed_in_loop(step, batches, steps: int, per_call: int, rank) -> tuple[float, float]:
    """hvdtrain's loop with a run's per-step hooks, 2 epochs; (first step's wall time, epoch 2's seconds)."""
    from hvdtrain.observe import progress
    from hvdtrain.observe.events import Hook
    from hvdtrain.runtime import watchdog
    from hvdtrain.training import hooks, loop

    marks: list[float] = []

    class FirstStep(Hook):
        def on_step(self, info) -> None:
            if not marks:
                marks.append(time.time())

    bar = progress.Progress("log" if rank.is_chief else "off", 2, steps, 50, 30.0)
    hook_list = [hooks.ProgressHook(bar, rank.size),
                 hooks.StepMetricsHook(progress.MetricsLogger(lambda metrics, step: None, 0), rank.size), FirstStep()]
    with watchdog.Watchdog(600, rank.rank) as dog:
        history = loop.fit(step, batches, loop.LoopPlan(2, steps, 1, BATCH, per_call), hook_list, phase=dog.phase)
    return marks[0], history[1].seconds


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("dataset")
    p.add_argument("mode", choices=["hvd", "keras"])
    p.add_argument("steps", type=int)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--pin", action="store_true")
    p.add_argument("--model", choices=sorted(MODELS), default="demo")
    p.add_argument("--steps-per-call", type=int, default=1)
    p.add_argument("--loop", action="store_true")
    p.add_argument("--allreduce", choices=["grouped", "overlap"], default="grouped")
    p.add_argument("--fp16", action="store_true", help="float16 all-reduce (train.fp16_allreduce, with its guard)")
    args = p.parse_args()
    if args.steps % args.steps_per_call:
        p.error(f"STEPS ({args.steps}) must be a multiple of --steps-per-call ({args.steps_per_call})")
    if args.pin:  # before TensorFlow starts any thread: threads inherit the mask
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[int(os.environ.get("HOROVOD_LOCAL_RANK", "0")) % len(cores)]})

    import tensorflow as tf

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    import keras

    from hvdtrain import data
    from hvdtrain.core import config
    from hvdtrain.data import contract, manifest
    from hvdtrain.runtime import distributed
    from hvdtrain.training import state
    from hvdtrain.training import steps as steps_lib

    rank = distributed.init() if args.mode == "hvd" else distributed.RankInfo(0, 1, 0, 1, "localhost", "single")
    m = manifest.read(args.dataset)
    cfg = config.from_dict(bench_config(args.dataset, args.model))
    shape = data.check_manifest(m, cfg.model)
    model, optimizer = state.build_state(cfg, shape, rank.size)
    ds = data.train_dataset(m, data.TrainStream(rank=rank.rank, size=rank.size, batch_size=BATCH, shuffle_buffer=1024,
                                                seed=1), features=[*contract.MODEL_INPUTS["transformer"], "label"])
    if args.threads:  # the input pipeline gets the same budget as the model: no idle core to borrow
        options = tf.data.Options()
        options.threading.private_threadpool_size = args.threads
        options.threading.max_intra_op_parallelism = 1
        ds = ds.with_options(options)
    per_call = args.steps_per_call
    if args.mode == "hvd":
        distributed.broadcast_state(model, optimizer)
        make = steps_lib.make_unrolled_step if per_call > 1 else steps_lib.make_optimizer_step
        reduction = steps_lib.Reduction(fp16=args.fp16, mode=args.allreduce)
        step = make(model, optimizer, "label", shape.inputs, reduction=reduction,
                    guard=steps_lib.FiniteGuard() if args.fp16 else None)
        batches = iter(ds)
        if args.loop:
            first_step_at, seconds = timed_in_loop(step, batches, args.steps, per_call, rank)
        else:
            def run(n: int) -> None:
                out = None
                for _ in range(n // per_call):
                    out = step([next(batches) for _ in range(per_call)])
                float(np.asarray(out[0]).ravel()[-1])  # wait for the last step
            run(per_call)
            first_step_at = time.time()
            run(WARMUP * per_call)
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
                                     "first_step_at": first_step_at, "size": rank.size,
                                     "params": model.count_params(), "model": args.model,
                                     "steps_per_call": per_call}), flush=True)


if __name__ == "__main__":
    main()
