"""A small Horovod elastic job (hvd.elastic.run, TensorFlowKerasState) that tests/multiprocess/test_elastic_horovod.py
launches with horovodrun host discovery. Usage: elastic_worker.py OUT_DIR STEPS [FAIL_HOST FAIL_AT]

Every rank appends one JSON line per event to OUT_DIR/<pid>.jsonl: start, each step (with the world size and the
committed step it continued from), reset, end. The rank on FAIL_HOST (HOROVOD_HOSTNAME) exits at step FAIL_AT
the first time (a marker file in OUT_DIR makes the failure happen once): a lost rank.
"""
import json
import os
import sys

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

OUT, STEPS = sys.argv[1], int(sys.argv[2])
FAIL_HOST, FAIL_AT = (sys.argv[3], int(sys.argv[4])) if len(sys.argv) > 4 else (None, -1)
COMMIT_EVERY = 2


def record(**event):
    with open(os.path.join(OUT, f"{os.getpid()}.jsonl"), "a") as fh:
        fh.write(json.dumps({"pid": os.getpid(), "host": os.environ.get("HOROVOD_HOSTNAME"), **event}) + "\n")


hvd.init()
tf.random.set_seed(1)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
optimizer = keras.optimizers.SGD(0.01)
optimizer.build(model.trainable_variables)
x = np.ones((8, 4), np.float32)
record(event="start", rank=hvd.rank(), size=hvd.size())


@tf.function
def train_step():
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x)))
    grads = hvd.grouped_allreduce(tape.gradient(loss, model.trainable_variables), op=hvd.Average)
    optimizer.apply(grads, model.trainable_variables)
    return loss


@hvd.elastic.run
def train(state):
    while state.step < STEPS:
        marker = os.path.join(OUT, "failed-once")
        if os.environ.get("HOROVOD_HOSTNAME") == FAIL_HOST and state.step == FAIL_AT and not os.path.exists(marker):
            open(marker, "w").close()
            record(event="exit", step=state.step)
            os._exit(1)
        train_step()
        state.step += 1
        record(event="step", step=state.step, size=hvd.size(), rank=hvd.rank())
        if state.step % COMMIT_EVERY == 0:
            state.commit()


def on_reset():
    record(event="reset", size=hvd.size(), rank=hvd.rank())


state = hvd.elastic.TensorFlowKerasState(model, optimizer, step=0)
state.register_reset_callbacks([on_reset])
train(state)
record(event="end", step=state.step, size=hvd.size(), rank=hvd.rank(),
       weights=float(np.sum([np.sum(w) for w in model.get_weights()])))
