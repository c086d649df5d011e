"""Step time of a deep MLP with grouped and overlapped all-reduce; rank 0 prints 'BENCH {json}'.

    horovodrun -np 2 ... python -m benchmarks.overlap_worker STEPS [--reps R] [--trace DIR] [--width W]

Both modes run in the same processes, in interleaved blocks (grouped, overlap,
grouped, overlap, ... R blocks each of STEPS steps after a warm-up), so load
from elsewhere hits both alike. ``grouped``: one grouped all-reduce after the
whole backward pass; ``overlap``: one all-reduce per gradient, each issued as
soon as its gradient exists. The model is ``LAYERS`` Dense layers of ``WIDTH``
units (the deep model the overlap is shown on). With --trace DIR, Horovod's
timeline of each mode's first timed block goes to DIR/<mode>.json, and what
each all-reduce of the compiled step waits for to DIR/<mode>.graph.json
(:func:`allreduce_dependencies`). (Not ``--timeline``: horovodrun would take
it as its own option.)
"""
from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

LAYERS, WIDTH, BATCH, FEATURES, WARMUP = 16, 1024, 128, 64, 2
MODES = ("grouped", "overlap")


def build(layers: int, width: int):
    import keras

    inputs = keras.Input((FEATURES,), name="numeric")
    x = inputs
    for i in range(layers):
        x = keras.layers.Dense(width, activation="relu", name=f"dense{i}")(x)
    return keras.Model({"numeric": inputs}, keras.layers.Dense(4, name="logits")(x))


def allreduce_dependencies(graph: Any) -> dict[str, Any]:
    """What each Horovod all-reduce in a compiled step's graph waits for, from the graph's edges (data and
    control), not from any run: independent of how the executor happens to schedule it.

    The gradients are the all-reduces' inputs; the *last gradient* is the one with the most ancestors (the
    first layer's kernel: backprop reaches it through every layer above). An all-reduce that does not have
    it among its ancestors can begin before it exists. Returns the all-reduce count, how many of them are
    independent of the last gradient, and that gradient's op name.
    """
    reduces = [op for op in graph.get_operations() if op.type.startswith("Horovod") and "Allreduce" in op.type]
    memo: dict[str, frozenset[str]] = {}

    def ancestors(op: Any) -> frozenset[str]:
        """Names of every op ``op`` waits for (an iterative post-order walk: graphs are deeper than Python's
        recursion limit)."""
        stack = [(op, False)]
        while stack:
            node, parents_done = stack.pop()
            if node.name in memo:
                continue
            parents = list(node.control_inputs) + [t.op for t in node.inputs]
            if parents_done:
                memo[node.name] = frozenset(p.name for p in parents).union(*(memo[p.name] for p in parents))
            else:
                stack.append((node, True))
                stack.extend((p, False) for p in parents if p.name not in memo)
        return memo[op.name]

    gradients = {t.op.name: t.op for op in reduces for t in op.inputs}
    last = max(gradients, key=lambda name: len(ancestors(gradients[name])))
    independent = [op.name for op in reduces if last not in ancestors(op)]
    return {"allreduces": len(reduces), "independent_of_last_gradient": len(independent), "last_gradient": last}


def make_steps(width: int, layers: int) -> tuple[dict, dict, int]:
    """One compiled step per mode (own model and optimizer, same initial weights), and a fixed batch per rank."""
    import keras
    import tensorflow as tf

    from hvdtrain.runtime import distributed
    from hvdtrain.training import steps as steps_lib

    rank = distributed.info()
    out = {}
    for mode in MODES:
        keras.utils.set_random_seed(1)
        model = build(layers, width)
        optimizer = keras.optimizers.SGD(0.01)
        optimizer.build(model.trainable_variables)
        distributed.broadcast_state(model, optimizer)
        out[mode] = steps_lib.make_train_step(model, optimizer, "label", ("numeric",),
                                              allreduce=steps_lib.Reduction(mode=mode))
    rng = tf.random.Generator.from_seed(rank.rank)
    batch = {"numeric": rng.normal((BATCH, FEATURES)), "label": rng.uniform((BATCH,), 0, 4, dtype=tf.int64)}
    return out, batch, model.count_params()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("steps", type=int)
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--trace", default="")
    p.add_argument("--layers", type=int, default=LAYERS)
    p.add_argument("--width", type=int, default=WIDTH)
    p.add_argument("--threads", type=int, default=0, help="TensorFlow intra- and inter-op threads (0: default)")
    args = p.parse_args()
    if args.threads:
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    os.environ["HOROVOD_TIMELINE"] = "DYNAMIC"  # before Horovod starts: lets --trace record on demand
    from hvdtrain.runtime import distributed

    rank = distributed.init()
    steps, batch, params = make_steps(args.width, args.layers)

    def run(mode: str, n: int) -> float:
        start = time.perf_counter()
        out = None
        for _ in range(n):
            out = steps[mode](batch)
        float(out[0])  # wait for the last step
        return (time.perf_counter() - start) / n

    for mode in MODES:
        run(mode, WARMUP)
        if args.trace and rank.rank == 0:
            with open(os.path.join(args.trace, f"{mode}.graph.json"), "w") as fh:
                json.dump(allreduce_dependencies(steps[mode].get_concrete_function(batch).graph), fh)
    times: dict[str, list[float]] = {m: [] for m in MODES}
    for rep in range(args.reps):
        for mode in MODES:
            if args.trace and rep == 0:
                distributed.start_timeline(os.path.join(args.trace, f"{mode}.json"))
            times[mode].append(run(mode, args.steps))
            if args.trace and rep == 0:
                distributed.stop_timeline()
    if rank.rank == 0:
        print("BENCH " + json.dumps({"step_seconds": times, "size": rank.size, "layers": args.layers + 1,
                                     "params": params, "gradient_bytes": 4 * params, "batch": BATCH}),
              flush=True)


if __name__ == "__main__":
    main()
