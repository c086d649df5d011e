"""The training loop's parts, driven with small fakes: accumulation, early stopping, progress, fit."""
from __future__ import annotations

import io
import itertools
from typing import Any

import numpy as np
import pytest

from hvdtrain.core.config import EarlyStoppingConfig, ModelConfig
from hvdtrain.core.errors import ConfigError
from hvdtrain.model import early_stopping
from hvdtrain.observe import progress

# -- early stopping (pure) ------------------------------------------------------------------


@pytest.mark.parametrize("values,direction,patience,stop,best", [
    ([0.5, 0.4, 0.3], "min", 2, False, 3),  # improving
    ([0.5, 0.4, 0.45, 0.46], "min", 2, True, 2),  # two epochs without improvement
    ([0.5, 0.4, 0.45], "min", 2, False, 2),  # one epoch: keep going
    ([0.5, 0.4, 0.45], "min", 1, True, 2),
    ([0.5, 0.4, 0.45], "min", 0, True, 2),  # patience 0 stops at the first non-improvement, as Keras
    ([0.7, 0.8, 0.8], "max", 1, True, 2),  # a tie is not an improvement
    ([0.7, 0.8, 0.9], "max", 1, False, 3),
])
def test_early_stopping_decision(values, direction, patience, stop, best) -> None:
    decision = early_stopping.decide(values, direction, patience)
    assert (decision.stop, decision.best_epoch) == (stop, best)
    assert decision.best_value == values[best - 1]
    assert decision.improved == (best == len(values))


def test_min_delta_and_nan() -> None:
    assert early_stopping.decide([0.5, 0.499], "min", 1, min_delta=0.01).stop  # too small a gain
    nan = early_stopping.decide([float("nan"), 0.3, float("nan")], "min", 5)
    assert nan.best_epoch == 2 and nan.epochs_without_improvement == 1
    assert early_stopping.decide([float("nan")] * 3, "max", 2).stop  # never improves


def test_early_stopping_config_names_a_contradictory_mode() -> None:
    assert EarlyStoppingConfig(metric="accuracy").direction == "max"
    assert EarlyStoppingConfig(metric="loss").direction == "min"
    with pytest.raises(ConfigError, match="mode must be auto or max for metric macro_f1"):
        EarlyStoppingConfig(metric="macro_f1", mode="min")


def test_early_stopper_keeps_the_best_epochs_weights() -> None:
    from hvdtrain.training.hooks import EarlyStopper

    weights = [np.zeros(2)]
    stopper = EarlyStopper(EarlyStoppingConfig(metric="accuracy", patience=1), lambda: weights)
    for epoch, acc in enumerate([0.6, 0.9, 0.8], start=1):
        weights[0][:] = epoch  # training moves the weights each epoch
        stop = stopper.update({"accuracy": acc, "loss": 1.0})
    assert stop and stopper.decision.best_epoch == 2
    np.testing.assert_array_equal(stopper.best_weights[0], [2, 2])  # a copy, not the live array
    summary = stopper.summary(restored=True, epochs=10)
    assert summary["stopped_early"] and summary["best_value"] == 0.9 and summary["values"] == [0.6, 0.9, 0.8]


class FakeModel:
    """Weights that every optimizer step moves (weight = steps taken), like training does."""

    def __init__(self) -> None:
        self.weights = [np.zeros(3), np.zeros((2, 2))]

    def get_weights(self) -> list[np.ndarray]:
        return self.weights

    def set_weights(self, weights: list[np.ndarray]) -> None:
        self.weights = [np.array(w, copy=True) for w in weights]


@pytest.mark.parametrize("patience", [1, 2, 3])
def test_fit_stops_patience_epochs_after_the_best_and_restores_its_weights(patience: int) -> None:
    """Validation loss improves up to epoch 4, then never again: fit runs exactly 4 + patience epochs
    and the run ends on epoch 4's weights."""
    from hvdtrain.observe.events import LoopPlan
    from hvdtrain.runtime import distributed
    from hvdtrain.training.hooks import EarlyStopper, ValidationAndEarlyStopping
    from hvdtrain.training.loop import fit

    distributed.init(use_horovod=False)
    losses = iter([0.9, 0.7, 0.6, 0.5, 0.55, 0.52, 0.51, 0.6, 0.58, 0.7])
    model = FakeModel()

    def step(batches):
        for w in model.weights:
            w += 1.0  # in place, as an optimizer updates variables
        return 1.0, 1.0

    stopper = EarlyStopper(EarlyStoppingConfig(metric="loss", patience=patience), model.get_weights)
    validation = ValidationAndEarlyStopping(lambda: {"loss": next(losses)}, stopper)
    history = fit(step, itertools.count(), LoopPlan(epochs=10, steps=3), hooks=[validation])
    assert len(history) == 4 + patience and stopper.decision.best_epoch == 4
    assert model.weights[0].tolist() == [3.0 * len(history)] * 3  # trained to the end...
    assert stopper.restore_best(model, len(history))
    for w in model.weights:  # ...and restored to the end of epoch 4 (3 steps per epoch)
        assert (w == 12.0).all()
    summary = stopper.summary(restored=True, epochs=10)
    assert summary["stopped_early"] and summary["best_epoch"] == 4 and summary["best_value"] == 0.5


def test_no_restore_when_the_last_epoch_is_the_best() -> None:
    from hvdtrain.training.hooks import EarlyStopper

    model = FakeModel()
    stopper = EarlyStopper(EarlyStoppingConfig(metric="loss", patience=2), model.get_weights)
    for loss in (0.9, 0.8):
        model.weights[0] += 1
        stopper.update({"loss": loss})
    assert not stopper.restore_best(model, 2) and model.weights[0].tolist() == [2.0] * 3


# -- fit with a fake step and recording hooks ---------------------------------------------------

class RecordingHooks:
    def __init__(self, stop_after: int = 0):
        self.events: list[Any] = []
        self.stop_after = stop_after

    def start_epoch(self, epoch: int) -> None:
        self.events.append(("start", epoch))

    def on_step(self, info: Any) -> None:
        self.events.append(("step", info.epoch, info.step, info.examples))

    def end_epoch(self, stats: Any) -> bool:
        self.events.append(("end", stats.epoch, stats.examples, stats.loss))
        return stats.epoch == self.stop_after

    def after_step(self, state: Any) -> None:
        self.events.append(("after", state.step, state.epoch_end, tuple(state.partial())))


def test_fit_feeds_k_batches_per_step_and_stops_when_told() -> None:
    from hvdtrain.observe.events import LoopPlan
    from hvdtrain.runtime import distributed
    from hvdtrain.training.loop import fit

    distributed.init(use_horovod=False)
    seen: list[list[int]] = []

    def step(batches):
        seen.append(list(batches))
        return float(2 * len(batches) * 4), 1.0  # loss sum 2 per example, 4 examples per batch

    hooks = RecordingHooks(stop_after=2)
    history = fit(step, itertools.count(), LoopPlan(epochs=5, steps=3, accum_steps=2, batch_size=4), hooks=[hooks])
    assert len(history) == 2  # stopped after epoch 2
    assert seen[:2] == [[0, 1], [2, 3]] and len(seen) == 6  # 2 batches per optimizer step, stream shared
    assert history[0].examples == 3 * 2 * 4 and history[0].loss == 2.0
    assert ("step", 1, 3, 8) in hooks.events and hooks.events[0] == ("start", 1)
    assert [e[1] for e in hooks.events if e[0] == "end"] == [1, 2]


def test_fit_resumed_mid_epoch_continues_the_same_stream_and_epoch_sums() -> None:
    """A run resumed after step 4 (mid epoch 2) sees the batches and epoch sums of the uninterrupted run."""
    from hvdtrain.observe.events import LoopPlan, Start
    from hvdtrain.runtime import distributed
    from hvdtrain.training.loop import fit

    distributed.init(use_horovod=False)

    def step(batches):  # loss depends on the batch, so a wrong position changes the sums
        return float(sum(batches)), float(len(batches))

    full_hooks = RecordingHooks()
    full = fit(step, itertools.count(), LoopPlan(epochs=3, steps=3, accum_steps=1, batch_size=4), hooks=[full_hooks])
    # the state the checkpointer would have saved after step 4: epoch 1 done, 1 step of epoch 2
    after4 = [e for e in full_hooks.events if e[0] == "after" and e[1] == 4][0]
    assert after4[2] is False and after4[3] == (3.0, 1.0, 4.0)  # batch 3's loss, 1 correct, 4 examples
    hooks = RecordingHooks()
    resumed = fit(step, itertools.count(4), LoopPlan(epochs=3, steps=3, accum_steps=1, batch_size=4), hooks=[hooks],
                  start=Start(4, full[:1], np.array(after4[3]), 0.0))
    assert [(h.epoch, h.examples, h.loss, h.accuracy) for h in resumed] == \
        [(h.epoch, h.examples, h.loss, h.accuracy) for h in full]
    assert [e for e in hooks.events if e[0] == "step"] == [("step", 2, 2, 4), ("step", 2, 3, 4)] + \
        [("step", 3, s, 4) for s in (1, 2, 3)]
    assert [e[1] for e in hooks.events if e[0] == "after" and e[2]] == [6, 9]  # epoch-end saves
    assert fit(step, itertools.count(), LoopPlan(epochs=3, steps=3, accum_steps=1, batch_size=4),
               hooks=[RecordingHooks()],
               start=Start(9, full, None, 0.0, stopped=True)) == full  # a finished run has nothing left to do


# -- progress ---------------------------------------------------------------------------------

@pytest.mark.parametrize("setting,chief,tty,mode", [
    ("auto", True, True, "bar"), ("auto", True, False, "log"), ("auto", False, True, "off"),
    ("bar", True, False, "bar"), ("log", True, True, "log"), ("off", True, True, "off"), ("bar", False, True, "off"),
])
def test_progress_mode_choice(setting: str, chief: bool, tty: bool, mode: str) -> None:
    assert progress.choose_mode(setting, chief, tty) == mode


def test_due_on_steps_or_seconds() -> None:
    assert not progress.due(0, 100.0, 10, 5.0)
    assert progress.due(10, 0.1, 10, 5.0) and progress.due(3, 5.0, 10, 5.0)
    assert not progress.due(3, 4.9, 10, 5.0) and not progress.due(3, 99.0, 10, None)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_window_meter_measures_data_wait_and_throughput() -> None:
    clock = FakeClock()
    meter = progress.WindowMeter(clock)
    for _ in range(4):  # each step: 0.25 s waiting for data, 0.75 s computing
        clock.now += 1.0
        meter.add(0.25, 8.0, local_examples=16, world_size=2)
    stats = meter.flush()
    assert stats.steps == 4 and stats.examples == 128 and stats.seconds == 4.0
    assert stats.data_wait_fraction == 0.25 and stats.step_seconds == 1.0 and stats.samples_per_sec == 32.0
    assert stats.loss == 32.0 / 64  # rank 0's loss sum over its examples
    assert meter.steps == 0 and meter.flush().steps == 0


def test_log_mode_writes_lines_at_the_cadence() -> None:
    clock, lines = FakeClock(), []
    bar = progress.Progress("log", epochs=2, steps=10, every_steps=4, every_seconds=1000.0, clock=clock,
                            sinks=progress.Sinks(emit=lines.append))
    bar.start_epoch(1)
    for step in range(1, 11):
        clock.now += 0.5
        bar.on_step(step, 0.1, 1.6, 16, 2)
    bar.end_epoch()
    assert len(lines) == 2 and lines[0].startswith("epoch 1/2 step 4/10: loss 0.1000, 64 samples/s, 500.0 ms/step")
    assert lines[0].endswith("data wait 20%")
    clock.now += 2000.0  # a slow step: a line on time, not waiting for the step count
    bar.start_epoch(2)
    clock.now += 2000.0
    bar.on_step(1, 0.0, 1.6, 16, 2)
    assert len(lines) == 3 and lines[2].startswith("epoch 2/2 step 1/10")


def test_bar_mode_draws_a_tqdm_bar_and_off_mode_is_silent() -> None:
    stream, lines = io.StringIO(), []
    bar = progress.Progress("bar", epochs=1, steps=5, every_steps=2, every_seconds=1.0,
                            sinks=progress.Sinks(stream=stream, emit=lines.append))
    bar.start_epoch(1)
    for step in range(1, 6):
        bar.on_step(step, 0.0, 1.0, 4, 1)
    bar.end_epoch()
    assert "epoch 1/1" in stream.getvalue() and "5/5" in stream.getvalue() and not lines
    silent = progress.Progress("off", epochs=1, steps=5, every_steps=1, every_seconds=1.0,
                               sinks=progress.Sinks(emit=lines.append))
    silent.start_epoch(1)
    silent.on_step(1, 0.0, 1.0, 4, 1)
    assert not lines


def test_metrics_logger_logs_every_n_global_steps() -> None:
    logged = []
    logger = progress.MetricsLogger(lambda m, step: logged.append((step, m)), every_steps=3, clock=FakeClock())
    logger.start_epoch(1)
    for step in range(1, 8):
        logger.on_step(step, 0.0, 2.0, 4, 1)
    assert [s for s, _ in logged] == [3, 6]
    assert set(logged[0][1]) == {"step_loss", "step_samples_per_sec", "step_seconds", "data_wait_fraction"}
    off = progress.MetricsLogger(lambda m, step: logged.append(step), every_steps=0)
    off.on_step(3, 0.0, 2.0, 4, 1)
    assert len(logged) == 2


# -- gradient accumulation: k micro-batches and one all-reduce equal one big batch -------------

def _tiny_mlp():
    from hvdtrain.data.contract import InputShape
    from hvdtrain.model.models import build_model

    shape = InputShape(0, 0, 3, "label", kind="mlp", inputs=("numeric",), numeric_features=5)
    return build_model(ModelConfig(kind="mlp", hidden_units=[8], dropout=0.0), shape)


def test_accumulated_step_equals_one_step_on_the_concatenated_batch() -> None:
    import keras
    import tensorflow as tf

    from hvdtrain.training import steps

    rng = np.random.default_rng(0)
    batches = [{"numeric": tf.constant(rng.normal(size=(4, 5)), tf.float32),
                "label": tf.constant(rng.integers(0, 3, 4), tf.int64)} for _ in range(3)]
    whole = {k: tf.concat([b[k] for b in batches], axis=0) for k in ("numeric", "label")}
    keras.utils.set_random_seed(1)
    big, small = _tiny_mlp(), _tiny_mlp()
    small.set_weights(big.get_weights())
    calls = tf.Variable(0)

    def counting_allreduce(grads):  # stands in for Horovod; counts executions, not traces
        calls.assign_add(1)
        return list(grads)

    big_step = steps.make_train_step(big, keras.optimizers.SGD(0.1), "label", ("numeric",), counting_allreduce)
    loss_big, correct_big = big_step(whole)
    accumulate = steps.AccumulatingStep(small, keras.optimizers.SGD(0.1), "label", 3, ("numeric",),
                                        counting_allreduce)
    loss_small, correct_small = accumulate(batches)
    for a, b in zip(big.get_weights(), small.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert float(loss_small) == pytest.approx(float(loss_big), rel=1e-5)
    assert float(correct_small) == float(correct_big)
    assert int(calls.numpy()) == 2  # one all-reduce per optimizer step, not one per micro-batch
    accumulate(batches)
    assert int(calls.numpy()) == 3
    with pytest.raises(ValueError, match="takes 3 micro-batches"):
        accumulate(batches[:2])


# -- the timed step: the same arithmetic, the all-reduce timed apart -------------------------------

@pytest.mark.parametrize("accum", [1, 2])
def test_timed_step_matches_the_fused_step_and_times_its_allreduce(accum: int) -> None:
    import time

    import keras
    import tensorflow as tf

    from hvdtrain.training import steps

    rng = np.random.default_rng(3)
    batches = [{"numeric": tf.constant(rng.normal(size=(4, 5)), tf.float32),
                "label": tf.constant(rng.integers(0, 3, 4), tf.int64)} for _ in range(2 * accum)]
    keras.utils.set_random_seed(2)
    fused_model, timed_model = _tiny_mlp(), _tiny_mlp()
    timed_model.set_weights(fused_model.get_weights())

    def slow_allreduce(grads):  # stands in for Horovod, with an injected 50 ms delay
        delay = tf.numpy_function(lambda: np.float32(time.sleep(0.05) or 0), [], tf.float32)
        return [g + tf.cast(delay, g.dtype) for g in grads]

    def optimizer_step(model, timed):
        optimizer = keras.optimizers.Adam(0.01)
        optimizer.build(model.trainable_variables)
        if not timed:
            return (steps.make_train_step(model, optimizer, "label", ("numeric",), slow_allreduce) if accum == 1
                    else steps.AccumulatingStep(model, optimizer, "label", accum, ("numeric",), slow_allreduce))
        return steps.TimedStep(model, optimizer, "label", ("numeric",), accum, slow_allreduce)

    fused, timed = optimizer_step(fused_model, False), optimizer_step(timed_model, True)
    for i in range(2):
        micro = batches[i * accum:(i + 1) * accum]
        out_fused = fused(micro[0]) if accum == 1 else fused(micro)
        out_timed = timed(micro)
        assert [float(x) for x in out_fused] == [float(x) for x in out_timed]
        assert 0.05 <= timed.allreduce_seconds < 5
    for a, b in zip(fused_model.get_weights(), timed_model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_fit_tells_hooks_the_step_call_time() -> None:
    import time

    from hvdtrain.observe.events import LoopPlan
    from hvdtrain.runtime import distributed
    from hvdtrain.training.loop import fit

    distributed.init(use_horovod=False)
    seen = []

    class Hook(RecordingHooks):
        def on_step(self, info: Any) -> None:
            seen.append(info.step_seconds)

    def slow_step(batches):
        time.sleep(0.03)
        return 1.0, 1.0

    fit(slow_step, itertools.count(), LoopPlan(epochs=1, steps=2, accum_steps=1, batch_size=1), hooks=[Hook()])
    assert len(seen) == 2 and all(0.03 <= s < 5 for s in seen)
