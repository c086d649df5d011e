"""hvd_overhead, scaling_np2: training throughput under horovodrun (launch_overhead: bench_launch).

hvd_overhead (and hvd_overhead_large, a model of about 10x the parameters): hvdtrain's loop with its
per-step hooks under ``horovodrun -np 1`` at the default ``train.steps_per_call``, against plain Keras
``model.fit``, launched in interleaved pairs (fit, hvdtrain, fit, ...); the ratio is the median of the
pairs' ratios with their min and max, beside the load average before each pair. The same loop at one
step per call runs in each pair too (``notes.one_step_per_call``), so what steps_per_call buys is seen.
"""
from __future__ import annotations

import os
import shutil
import statistics
import tempfile

from benchmarks.common import Entry
from benchmarks.launch import horovodrun, plain, plain_many
from hvdtrain.core.config import TrainConfig
from hvdtrain.runtime.launch import malloc_env

MODEL_SIZES = {"hvd_overhead": "demo", "hvd_overhead_large": "large"}


def median_of(fn, reps: int) -> dict:
    runs = sorted((fn() for _ in range(reps)), key=lambda r: r["samples_per_sec"])
    return runs[len(runs) // 2]


def run(quick: bool, extra: dict) -> list[Entry]:
    from hvdtrain.data.synthetic import Layout, TextSpec, make_text_dataset

    steps = "24" if quick else "96"  # a multiple of train.steps_per_call
    reps = 1 if quick else 5
    root = tempfile.mkdtemp(prefix="bench-train-")
    try:
        make_text_dataset(root, TextSpec(layout=Layout(n_per_split={"train": 8192, "validation": 64, "test": 64},
                                                       shards_per_split=4), num_classes=4, max_length=64, vocab_size=2000, seed=3))
        sizes = {k: v for k, v in MODEL_SIZES.items() if not quick or v == "demo"}  # --quick: the demo size only
        overhead = [overhead_entry(name, model, root, steps, reps) for name, model in sizes.items()]
        one_thread = median_of(lambda: horovodrun(1, "benchmarks.train_worker", [root, "hvd", steps,
                                                                                  "--threads", "1"]), reps)
        two = median_of(lambda: horovodrun(2, "benchmarks.train_worker", [root, "hvd", steps, "--threads", "1"]),
                        reps)
        # The host's own ceiling for scaling_np2: 2 plain 1-thread processes at once, no Horovod (they share
        # the 2 cores' caches and memory bandwidth, and neither has a spare core for tf.data), with the malloc
        # setting the ranks of both sides have.
        at_once = median_of(lambda: {"samples_per_sec": sum(r["samples_per_sec"] for r in plain_many(
            2, "benchmarks.train_worker", [root, "hvd", steps, "--threads", "1"],
            env=malloc_env(os.environ)))}, reps)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return [
        *overhead,
        Entry("scaling_np2", two["samples_per_sec"], "samples/s", "2 x (-np 1), 1 intra/inter-op/tf.data thread each",
              2 * one_thread["samples_per_sec"], 0.85,
              notes={"np1_samples_per_sec": one_thread["samples_per_sec"],
                     "two_plain_at_once_samples_per_sec": at_once["samples_per_sec"],
                     "host_ceiling": round(at_once["samples_per_sec"] / (2 * one_thread["samples_per_sec"]), 3),
                     "vs_two_plain_at_once": round(two["samples_per_sec"] / at_once["samples_per_sec"], 3)}),
    ]


def overhead_entry(name: str, model: str, root: str, steps: str, reps: int) -> Entry:
    """hvdtrain's loop at 1 rank against model.fit, in ``reps`` interleaved pairs (see the module docstring)."""
    per_call = TrainConfig().steps_per_call
    fit, hvd, one, loads = [], [], [], []

    def loop(k: int) -> float:
        return horovodrun(1, "benchmarks.train_worker", [root, "hvd", steps, "--loop", "--model", model,
                                                          "--steps-per-call", str(k)])["samples_per_sec"]

    for _ in range(reps):
        loads.append(round(os.getloadavg()[0], 1))
        fit.append(plain("benchmarks.train_worker", [root, "keras", steps, "--model", model])["samples_per_sec"])
        hvd.append(loop(per_call))
        one.append(loop(1) if per_call > 1 else hvd[-1])
    ones = [o / f for o, f in zip(one, fit)]
    return Entry.paired(name, hvd, "samples/s", "plain Keras model.fit, 1 process", fit, 0.97,
                        notes={"steps": int(steps), "batch_size": 64, "model": model, "steps_per_call": per_call,
                               "load_average_before_each_pair": loads,
                               "one_step_per_call": {"median": round(statistics.median(ones), 3),
                                                     "min": round(min(ones), 3), "max": round(max(ones), 3)}})
