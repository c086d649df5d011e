"""Training throughput with monitoring on and off, interleaved in one job; rank 0 prints 'BENCH {json}'.

    horovodrun -np N ... python -m benchmarks.monitoring_worker DATASET STEPS REPS OUT_DIR

Every mode runs :func:`hvdtrain.training.loop.fit` on the same model and input stream,
one epoch of STEPS optimizer steps per repetition, in turn off, on,
metrics_only, off, on, ... after one warm-up epoch of each (tracing). *off*: the fused step, no
hooks. *on*: what ``monitoring.enabled`` and ``monitoring.step_breakdown``
add to a training run: the timed step (all-reduce as its own call), the
Prometheus hook with its background writer at the default interval (started
and stopped, with a write each, every repetition), and the step-time
breakdown (an allgather at the epoch end). *metrics_only*: ``monitoring.step_breakdown:
false``: the fused step and the Prometheus hook and writer.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import time

BATCH = 64


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("dataset")
    p.add_argument("steps", type=int)
    p.add_argument("reps", type=int)
    p.add_argument("out_dir")
    args = p.parse_args()

    from hvdtrain import data
    from hvdtrain.core import config
    from hvdtrain.data import contract, manifest
    from hvdtrain.observe import breakdown, monitoring
    from hvdtrain.observe.events import LoopPlan
    from hvdtrain.runtime import distributed
    from hvdtrain.training import state
    from hvdtrain.training import steps as steps_lib
    from hvdtrain.training.loop import fit

    rank = distributed.init()
    m = manifest.read(args.dataset)
    cfg = config.from_dict({"name": "bench", "source": {"table": "bench.rows"}, "etl": {"output": args.dataset},
                            "model": {"embed_dim": 64, "num_heads": 2, "ff_dim": 128, "num_layers": 1},
                            "train": {"batch_size": BATCH, "learning_rate": 1e-3}})
    shape = data.check_manifest(m, cfg.model)
    model, optimizer = state.build_state(cfg, shape, rank.size)
    distributed.broadcast_state(model, optimizer)
    batches = iter(data.train_dataset(m, data.TrainStream(rank.rank, rank.size, BATCH, 1024, 1),
                                      features=[*contract.MODEL_INPUTS["transformer"], "label"]))
    fused = steps_lib.make_optimizer_step(model, optimizer, "label", shape.inputs)
    timed = steps_lib.make_timed_step(model, optimizer, "label", shape.inputs)
    plan = LoopPlan(1, args.steps, 1, BATCH)
    interval = config.MonitoringConfig().interval_seconds
    path = monitoring.textfile_path(args.out_dir, "bench", rank.rank)

    def off() -> float:
        start = time.perf_counter()
        fit(fused, batches, plan, hooks=[])
        return time.perf_counter() - start

    def on(step_fn=timed, breakdown_too: bool = True) -> float:
        start = time.perf_counter()
        metrics = monitoring.Metrics("bench", "bench", rank.rank, socket.gethostname())
        metrics.read_at_collect("hvdtrain_learning_rate", lambda: state.current_learning_rate(optimizer))
        allreduce = lambda: getattr(step_fn, "allreduce_seconds", None)  # noqa: E731
        hooks = [monitoring.MetricsHook(metrics, allreduce, lambda: None, lambda: int(optimizer.iterations.numpy()))]
        if breakdown_too:
            hooks.append(breakdown.StepTimeBreakdown(rank, allreduce, lambda: 0.0, lambda m, s: None))
        with monitoring.Exporter(metrics, path, interval, before_write=hooks[0].refresh):
            fit(step_fn, batches, plan, hooks=hooks)
        return time.perf_counter() - start

    def metrics_only() -> float:  # monitoring.step_breakdown: false
        return on(fused, breakdown_too=False)

    off(), on(), metrics_only()  # warm-up: tracing
    seconds: dict[str, list[float]] = {"off": [], "on": [], "metrics_only": []}
    for _ in range(args.reps):
        seconds["off"].append(off())
        seconds["on"].append(on())
        seconds["metrics_only"].append(metrics_only())
    if rank.rank == 0:
        rate = {mode: [args.steps * BATCH * rank.size / s for s in ss] for mode, ss in seconds.items()}
        print("BENCH " + json.dumps({"samples_per_sec": rate, "size": rank.size, "interval_seconds": interval,
                                     "pid": os.getpid()}), flush=True)


if __name__ == "__main__":
    main()
