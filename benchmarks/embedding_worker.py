"""Rank worker of ``embedding_sparse_vs_dense``: optimizer steps of a model with a 1M x 16 embedding, its
gradient sent sparse (allgather of touched rows) or dense (all-reduce of the table), interleaved.

    horovodrun -np 2 -H localhost:2 --gloo python -m benchmarks.embedding_worker [--quick]
"""
from __future__ import annotations

import json
import sys
import time

import keras
import numpy as np
import tensorflow as tf

from hvdtrain.runtime import distributed
from hvdtrain.training import steps

ROWS, DIM, BATCH, IDS = 1_000_000, 16, 256, 8


def _model() -> keras.Model:
    keras.utils.set_random_seed(0)
    ids = keras.Input((IDS,), dtype="int64", name="ids")
    x = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(ROWS, DIM, name="ids_embedding")(ids))
    return keras.Model({"ids": ids}, keras.layers.Dense(2, name="logits")(x))


def _step(min_rows: int):
    model = _model()
    optimizer = keras.optimizers.SGD(0.01)  # a plain optimizer: the step's cost is the gradient's transport
    optimizer.build(model.trainable_variables)
    choice = steps.sparse_choice([tuple(v.shape) for v in model.trainable_variables], min_rows)
    return steps.make_train_step(model, optimizer, "label", ("ids",), steps.Reduction(sparse=choice)), choice


def main(argv: list[str]) -> None:
    quick = "--quick" in argv
    rank = distributed.init()
    reps, steps_per_rep = (3, 5) if quick else (5, 20)
    runs = {"sparse": _step(100_000), "dense": _step(0)}
    rng = np.random.default_rng(rank.rank)
    batch = {"ids": tf.constant(rng.integers(0, ROWS, (BATCH, IDS))), "label": tf.constant(rng.integers(0, 2, BATCH))}
    for step, _ in runs.values():
        step(batch)  # trace and warm up
    times: dict[str, list[float]] = {"sparse": [], "dense": []}
    for _ in range(reps):
        for mode, (step, _) in runs.items():  # interleaved: sparse, dense, sparse, ...
            start = time.perf_counter()
            for _ in range(steps_per_rep):
                loss, _ = step(batch)
            float(loss)
            times[mode].append((time.perf_counter() - start) / steps_per_rep)
    if rank.is_chief:
        print("BENCH " + json.dumps({"seconds": times, "choice": list(runs["sparse"][1]), "rows": ROWS, "dim": DIM,
                                     "batch": BATCH, "ids_per_row": IDS, "ranks": rank.size}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
