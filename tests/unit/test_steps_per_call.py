"""Several optimizer steps per compiled call (train.steps_per_call): the loop's side, with fakes, and the
compiled multi-step against one step per call on a real Keras model."""
from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from hvdtrain.observe.events import Hook
from hvdtrain.runtime import distributed
from hvdtrain.training import steps as steps_lib
from hvdtrain.training.loop import LoopPlan, StepValue, call_size, fit, per_step


def test_a_call_stops_at_the_epoch_end_and_after_a_pausing_step() -> None:
    never = lambda s: False  # noqa: E731
    assert call_size(1, 10, 4, never) == 4
    assert call_size(9, 10, 4, never) == 2  # never past the epoch's end
    assert call_size(10, 10, 4, never) == 1
    assert call_size(1, 10, 4, lambda s: s == 2) == 2  # a hook acts after step 2: the call ends there
    assert call_size(3, 10, 4, lambda s: s == 2) == 4
    assert call_size(5, 10, 1, never) == 1


def test_per_step_values_are_read_only_when_converted() -> None:
    assert per_step(3.0, 1) == [3.0]
    values = per_step(np.array([1.5, 2.5]), 2)
    assert [float(v) for v in values] == [1.5, 2.5] and isinstance(values[0], StepValue)


class Recorder(Hook):
    """Records what hooks hear; pauses (a checkpoint is due) every ``every`` layout steps."""

    def __init__(self, every: int):
        self.every, self.events = every, []

    def on_step(self, info: Any) -> None:
        self.events.append(("step", info.epoch, info.step, info.global_step, float(info.loss_sum), info.examples))

    def after_step(self, state: Any) -> None:
        self.events.append(("after", state.step, state.epoch_end, tuple(state.partial())))

    def pause_after(self, global_step: int, layout_step: int) -> bool:
        return layout_step % self.every == 0


def _run(steps_per_call: int, calls: list[int]) -> tuple[list[Any], list[Any]]:
    def step(batches):  # loss of a step = its batches' sum, so a shifted stream changes every figure
        per = [batches[i:i + 2] for i in range(0, len(batches), 2)]
        calls.append(len(per))
        losses = [float(sum(b)) for b in per]
        return (losses[0], 1.0) if steps_per_call == 1 else (np.array(losses), np.ones(len(per)))

    hook = Recorder(every=3)
    history = fit(step, itertools.count(), LoopPlan(epochs=2, steps=7, accum_steps=2, batch_size=4,
                                                     steps_per_call=steps_per_call), hooks=[hook])
    return [h.to_dict() | {"seconds": 0, "samples_per_sec": 0} for h in history], hook.events


def test_several_steps_per_call_give_every_hook_and_epoch_figure_of_one_step_per_call() -> None:
    distributed.init(use_horovod=False)
    one_calls: list[int] = []
    many_calls: list[int] = []
    assert _run(1, one_calls) == _run(4, many_calls)
    assert one_calls == [1] * 14
    # 7 steps an epoch, a pause after layout steps 3, 6, 9, 12: calls end there and at epoch ends
    assert many_calls == [3, 3, 1, 2, 3, 2]


@pytest.mark.parametrize("accum", [1, 2])
def test_the_compiled_multi_step_trains_exactly_as_one_step_per_call(accum: int) -> None:
    """Same model, same batches: 5 steps in calls of 3 and 2 end on the weights, optimizer state and
    per-step losses of 5 calls of one step (bit for bit, on CPU)."""
    import keras
    import tensorflow as tf

    distributed.init(use_horovod=False)
    rng = np.random.default_rng(0)
    batches = [{"x": tf.constant(rng.normal(size=(8, 5)), tf.float32),
                "label": tf.constant(rng.integers(0, 3, size=8), tf.int64)} for _ in range(5 * accum)]

    def build() -> tuple[Any, Any]:
        keras.utils.set_random_seed(3)
        inputs = keras.Input((5,), name="x")
        model = keras.Model({"x": inputs}, keras.layers.Dense(3)(keras.layers.Dense(16, activation="relu")(inputs)))
        optimizer = keras.optimizers.Adam(1e-2)
        optimizer.build(model.trainable_variables)
        return model, optimizer

    results = []
    for per_call, sizes in ((1, [1] * 5), (3, [3, 2])):
        model, optimizer = build()
        make = steps_lib.make_unrolled_step if per_call > 1 else steps_lib.make_optimizer_step
        step = make(model, optimizer, "label", ("x",), accum)
        losses, at = [], 0
        for n in sizes:
            out = step(batches[at:at + n * accum])
            at += n * accum
            losses += [float(v) for v in per_step(out[0], n)]
        results.append((losses, [v.numpy() for v in model.weights], [v.numpy() for v in optimizer.variables]))
    (l1, w1, o1), (l3, w3, o3) = results
    assert l1 == l3
    assert all(np.array_equal(a, b) for a, b in zip(w1, w3)) and all(np.array_equal(a, b) for a, b in zip(o1, o3))
