"""A custom training loop with Horovod's DistributedGradientTape, on TensorFlow 2.21 + Keras 3.

    hvdtrain run --np 2 examples/gradient_tape_horovod.py [--out DIR]
    hvdtrain yarn run --num-workers 2 examples/gradient_tape_horovod.py [--out DIR]

The other common shape of a Horovod TF2 script (beside model.fit with hvd.DistributedOptimizer,
see keras3_horovod.py): `hvd.init()`, a `tf.function` step under `hvd.DistributedGradientTape`,
the learning rate scaled by the number of ranks, and rank 0's model and optimizer variables
broadcast after the first step (so the optimizer's slots exist). In Keras 3 `opt.variables` is a
property (Keras 2: a method). With `--out`, each rank writes `rank<N>.json` (loss per epoch, a
SHA-256 of its final weights, the rank and host Horovod gave it) so a test can check that the
ranks end identical.
"""
import argparse
import hashlib
import json
import os
import socket

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

FEATURES, CLASSES, SAMPLES = 20, 3, 2048


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
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--out", help="folder for rank<N>.json (loss history, weight digest)")
    args = parser.parse_args()

    hvd.init()
    tf.keras.utils.set_random_seed(1234 + hvd.rank())  # different on purpose: the broadcast must fix it

    x, y = synthetic_data()
    dataset = (tf.data.Dataset.from_tensor_slices((x, y)).shard(hvd.size(), hvd.rank())
               .shuffle(512, seed=hvd.rank()).batch(args.batch_size, drop_remainder=True))
    model = tf.keras.Sequential([tf.keras.Input(shape=(FEATURES,)), tf.keras.layers.Dense(32, activation="relu"),
                                 tf.keras.layers.Dense(CLASSES)])
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    opt = tf.keras.optimizers.Adam(learning_rate=0.001 * hvd.size())
    initial_digest = weights_digest(model)

    @tf.function
    def train_step(features, labels, first_batch):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(features, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)
        return loss

    losses = []
    for epoch in range(args.epochs):
        total, batches = 0.0, 0
        for batch, (features, labels) in enumerate(dataset):
            total += float(train_step(features, labels, epoch == 0 and batch == 0))
            batches += 1
        losses.append(float(hvd.allreduce(tf.constant(total / batches), op=hvd.Average)))
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1}/{args.epochs}: loss {losses[-1]:.4f}", flush=True)

    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"rank{hvd.rank()}.json"), "w") as f:
            json.dump({"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
                       "host": socket.gethostname(), "env_rank": os.environ.get("HOROVOD_RANK"),
                       "loss": losses, "initial_weights_sha256": initial_digest,
                       "final_weights_sha256": weights_digest(model)}, f)


if __name__ == "__main__":
    main()
