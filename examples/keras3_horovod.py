"""The canonical Horovod Keras recipe, unchanged, on TensorFlow 2.21 + Keras 3.

    horovodrun -np 2 -H localhost:2 --gloo python examples/keras3_horovod.py [--out DIR]

It is what a Horovod user brings: `hvd.init()`, the learning rate scaled by the number of
ranks, `hvd.DistributedOptimizer`, `BroadcastGlobalVariablesCallback(0)`,
`MetricAverageCallback`, `LearningRateWarmupCallback`, and `model.fit` on a tf.data pipeline
sharded by rank. The data is a small synthetic 3-class problem, so it runs in seconds on a CPU.
With `--out`, each rank writes `rank<N>.json` (loss per epoch and a SHA-256 of its final
weights) so a test can check that the ranks end identical and that the loss falls.
"""
import argparse
import hashlib
import json
import os

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

FEATURES, CLASSES, SAMPLES = 20, 3, 4096


def synthetic_data():
    """The same labelled set on every rank (a fixed linear teacher); ranks then shard it."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(SAMPLES, FEATURES)).astype("float32")
    teacher = rng.normal(size=(FEATURES, CLASSES)).astype("float32")
    return x, np.argmax(x @ teacher, axis=1).astype("int32")


def weights_digest(model):
    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(np.ascontiguousarray(weight).tobytes())
    return digest.hexdigest()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--out", help="folder for rank<N>.json (loss history, weight digest)")
    args = parser.parse_args()

    hvd.init()
    # Each rank starts from different random weights on purpose: the broadcast callback
    # must make them equal before they train.
    tf.keras.utils.set_random_seed(1234 + hvd.rank())

    x, y = synthetic_data()
    dataset = (tf.data.Dataset.from_tensor_slices((x, y))
               .shard(hvd.size(), hvd.rank())
               .shuffle(1024, seed=hvd.rank())
               .repeat()
               .batch(args.batch_size)
               .prefetch(tf.data.AUTOTUNE))
    steps_per_epoch = SAMPLES // (args.batch_size * hvd.size())

    model = tf.keras.Sequential([
        tf.keras.Input(shape=(FEATURES,)),
        tf.keras.layers.Dense(32, activation="relu"),
        tf.keras.layers.Dense(CLASSES),
    ])
    scaled_lr = 0.001 * hvd.size()
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(scaled_lr))
    model.compile(optimizer=opt,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    initial_digest = weights_digest(model)

    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=2,
                                                 verbose=1),
    ]
    history = model.fit(dataset, steps_per_epoch=steps_per_epoch, epochs=args.epochs,
                        callbacks=callbacks, verbose=2 if hvd.rank() == 0 else 0)

    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"rank{hvd.rank()}.json"), "w") as f:
            json.dump({"rank": hvd.rank(), "size": hvd.size(),
                       "loss": [float(v) for v in history.history["loss"]],
                       "lr": [float(v) for v in history.history["lr"]],
                       "initial_weights_sha256": initial_digest,
                       "final_weights_sha256": weights_digest(model)}, f)


if __name__ == "__main__":
    main()
