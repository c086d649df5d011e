"""Which state hvdtrain averages over ranks (BatchNormalization's moving statistics, not seeds or counters), and
when the loop's hook does it (each epoch end, before a mid-epoch checkpoint). The averaging itself runs under
horovodrun in tests/multiprocess/test_batch_norm_mp.py."""
from __future__ import annotations

import keras
import numpy as np

from hvdtrain.observe.events import EpochStats, LoopState
from hvdtrain.training import hooks, state


class _Counter(keras.layers.Layer):
    """An integer non-trainable weight (a count every rank keeps): never averaged."""

    def build(self, input_shape: tuple) -> None:
        self.calls = self.add_weight(shape=(), dtype="int64", initializer="zeros", trainable=False, name="calls")

    def call(self, x: object) -> object:
        return x


def test_the_moving_statistics_are_averaged_but_not_seeds_counters_or_trainable_weights() -> None:
    x = keras.Input((4,), name="numeric")
    h = keras.layers.Dense(3, name="hidden")(x)
    h = keras.layers.BatchNormalization(name="bn")(h)
    h = keras.layers.Dropout(0.5, name="drop")(_Counter(name="count")(h))
    model = keras.Model({"numeric": x}, keras.layers.Dense(2, name="logits")(h))
    assert [v.path for v in state.rank_local_statistics(model)] == ["bn/moving_mean", "bn/moving_variance"]
    assert any("seed" in v.path for v in model.non_trainable_variables)  # there, and left per rank


def test_a_model_without_such_state_has_nothing_to_average() -> None:
    x = keras.Input((4,), name="numeric")
    model = keras.Model({"numeric": x}, keras.layers.Dense(2)(keras.layers.Dropout(0.1)(x)))
    assert state.rank_local_statistics(model) == []
    state.average_statistics(model)  # one process: nothing to do, and no error


def _state(step: int, epoch_end: bool) -> LoopState:
    return LoopState(step, 1, epoch_end, lambda: np.zeros(3), 0.0, [])


def test_the_hook_averages_at_each_epoch_end_and_before_each_mid_epoch_checkpoint() -> None:
    calls: list[str] = []
    hook = hooks.AverageStatistics(lambda: calls.append("average"), lambda s: s.step % 5 == 0)
    for step in range(1, 10):
        hook.after_step(_state(step, False))
    assert calls == ["average"]  # step 5's checkpoint
    hook.end_epoch(EpochStats(1, 10, 160, 0.5, 0.5, 1.0))
    hook.after_step(_state(10, True))  # the epoch end's checkpoint: end_epoch already averaged
    assert calls == ["average", "average"]
