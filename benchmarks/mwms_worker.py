"""TensorFlow MultiWorkerMirroredStrategy peer of ``train_worker``'s hvd mode; worker 0 prints 'BENCH {json}'.

    TF_CONFIG=... python -m benchmarks.mwms_worker DATASET STEPS [--threads 1] [--try-fit] [--model demo|large]

One worker process per TF_CONFIG task, ring collectives. Same model, optimizer,
input pipeline (this task's shards), per-worker batch and thread budget as
``train_worker``; the step is hvdtrain's own step function run under
``strategy.run``. Keras 3's optimizer sums the gradients over replicas inside
``apply`` (its ``_all_reduce_sum_gradients``), so the step hands it each
replica's gradients, made dense and divided by the replica count: the update
is the mean, as with Horovod. ``--try-fit`` first tries Keras ``model.fit`` on the strategy's
distributed dataset for one step and reports what happened (on TF 2.21 it fails).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from benchmarks.train_worker import BATCH, MODELS, WARMUP, bench_config
from hvdtrain.core.errors import ANY_ERROR


def _try_fit(strategy, model, ds, inputs) -> str:
    """What Keras ``model.fit`` does with the strategy's distributed dataset (one step); the error if it fails."""
    import keras

    xy = ds.map(lambda b: ({k: b[k] for k in inputs}, b["label"]))
    with strategy.scope():
        model.compile(optimizer=keras.optimizers.Adam(),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    try:
        model.fit(strategy.experimental_distribute_dataset(xy), steps_per_epoch=1, epochs=1, verbose=0)
    except ANY_ERROR as exc:  # the failure is the finding: report it
        msg = " ".join(str(exc).split())  # the message embeds the whole batch: keep its head and its tail
        return f"model.fit failed: {type(exc).__name__}: {msg[:70]} ... {msg[-110:]}"
    return "model.fit on the distributed dataset ran one step"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("dataset")
    p.add_argument("steps", type=int)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--try-fit", action="store_true")
    p.add_argument("--model", choices=sorted(MODELS), default="demo")
    args = p.parse_args()

    import tensorflow as tf

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    tf_config = json.loads(os.environ["TF_CONFIG"])
    task, size = tf_config["task"]["index"], len(tf_config["cluster"]["worker"])

    from hvdtrain import data
    from hvdtrain.core import config
    from hvdtrain.data import contract, manifest
    from hvdtrain.training import state
    from hvdtrain.training import steps as steps_lib

    m = manifest.read(args.dataset)
    cfg = config.from_dict(bench_config(args.dataset, args.model))
    shape = data.check_manifest(m, cfg.model)
    with strategy.scope():
        model, optimizer = state.build_state(cfg, shape, size)
    inputs = contract.MODEL_INPUTS["transformer"]
    ds = data.train_dataset(m, data.TrainStream(rank=task, size=size, batch_size=BATCH, shuffle_buffer=1024, seed=1),
                            features=[*inputs, "label"])
    if args.threads:  # as train_worker: the input pipeline shares the model's thread budget
        ds_options = tf.data.Options()
        ds_options.threading.private_threadpool_size = args.threads
        ds_options.threading.max_intra_op_parallelism = 1
        ds = ds.with_options(ds_options)
    fit_note = _try_fit(strategy, model, ds, inputs) if args.try_fit else None
    replicas = strategy.num_replicas_in_sync

    def mean_share(grads):  # dense first, as hvdtrain's all-reduce does (Horovod's sparse_as_dense)
        return [tf.convert_to_tensor(g) / replicas for g in grads]

    step = steps_lib.make_train_step(model, optimizer, "label", allreduce=mean_share)

    @tf.function
    def dist_step(batch):
        return strategy.run(step, args=(batch,))

    batches = iter(ds)

    def run(n: int) -> None:
        out = None
        for _ in range(n):
            out = dist_step(next(batches))
        float(strategy.experimental_local_results(out[0])[0])  # wait for the last step

    run(1)
    first_step_at = time.time()
    run(WARMUP)
    start = time.perf_counter()
    run(args.steps)
    seconds = time.perf_counter() - start
    # Replicas stay identical only if the gradients were really all-reduced (stderr, for a manual check).
    print(f"weights checksum task {task}: {sum(float(tf.reduce_sum(v)) for v in model.trainable_variables):.8f}",
          file=sys.stderr, flush=True)
    if task == 0:
        print("BENCH " + json.dumps({"samples_per_sec": args.steps * BATCH * size / seconds, "size": size,
                                     "first_step_at": first_step_at, "model_fit": fit_note}), flush=True)


if __name__ == "__main__":
    main()
