"""Learning-rate schedules (pure reference vs the Keras schedule) and optimizer-step arithmetic."""
from __future__ import annotations

import math

import pytest

from hvdtrain import data
from hvdtrain.core.errors import DataError
from hvdtrain.model import schedules

PEAK = 4e-3


def test_warmup_then_constant() -> None:
    rates = [schedules.learning_rate_at(s, PEAK, warmup_steps=4) for s in (0, 1, 3, 4, 100)]
    assert rates == pytest.approx([1e-3, 2e-3, 4e-3, 4e-3, 4e-3])
    assert schedules.learning_rate_at(0, PEAK) == PEAK  # no warm-up: the peak from the first step


def test_cosine_decays_from_peak_to_the_floor_over_the_horizon() -> None:
    def at(s: int) -> float:
        return schedules.learning_rate_at(s, PEAK, warmup_steps=10, total_steps=110, decay="cosine",
                                          min_lr_ratio=0.1)

    assert at(9) == pytest.approx(PEAK)  # end of warm-up
    assert at(10) == pytest.approx(PEAK)  # decay starts at the peak
    assert at(60) == pytest.approx(0.1 * PEAK + 0.9 * PEAK * 0.5)  # halfway: midpoint of peak and floor
    assert at(110) == pytest.approx(0.1 * PEAK) and at(500) == pytest.approx(0.1 * PEAK)  # stays at the floor
    rates = [at(s) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(rates, rates[1:]))  # monotone


def test_linear_decay_is_a_straight_line_to_the_floor() -> None:
    rates = [schedules.learning_rate_at(s, PEAK, warmup_steps=0, total_steps=100, decay="linear") for s in
             (0, 25, 50, 100, 150)]
    assert rates == pytest.approx([PEAK, 0.75 * PEAK, 0.5 * PEAK, 0.0, 0.0])


@pytest.mark.parametrize("decay", schedules.DECAYS)
@pytest.mark.parametrize("warmup,total,ratio", [(0, 50, 0.0), (5, 40, 0.2), (20, 20, 0.5), (3, 0, 0.0)])
def test_keras_schedule_matches_the_pure_function(decay: str, warmup: int, total: int, ratio: float) -> None:
    schedule = schedules.WarmupDecay(PEAK, warmup, total, decay, ratio)
    for step in (0, 1, 2, 4, 5, 6, 19, 20, 21, 39, 40, 41, 60):
        want = schedules.learning_rate_at(step, PEAK, warmup, total, decay, ratio)
        assert float(schedule(step)) == pytest.approx(want, rel=1e-5, abs=1e-9), (decay, step)


def test_old_warmup_schedule_keeps_its_behaviour() -> None:
    schedule = schedules.WarmupSchedule(PEAK, 4)
    assert [float(schedule(s)) for s in (0, 1, 3, 10)] == pytest.approx([1e-3, 2e-3, 4e-3, 4e-3])
    assert schedule.get_config() == {"peak": PEAK, "warmup_steps": 4}


def test_unknown_decay_is_refused() -> None:
    with pytest.raises(ValueError, match="train.lr_schedule must be one of constant, linear, cosine"):
        schedules.learning_rate_at(0, PEAK, decay="step")


def test_decay_progress_is_clipped() -> None:
    assert schedules.decay_progress(0, 10, 110) == 0.0
    assert schedules.decay_progress(60, 10, 110) == 0.5
    assert schedules.decay_progress(200, 10, 110) == 1.0
    assert not math.isnan(schedules.decay_progress(5, 10, 10))


# -- gradient accumulation: how many optimizer steps an epoch has --------------------------

def test_accumulation_divides_the_epoch_into_larger_optimizer_steps() -> None:
    # 1000 records, batch 16, 2 ranks: 31 steps of 32; with k=4 each step takes 4 batches per rank.
    assert data.steps_per_epoch(1000, 16, 2) == 31
    assert data.steps_per_epoch(1000, 16, 2, accum_steps=4) == 1000 // (16 * 4 * 2) == 7
    with pytest.raises(DataError, match=r"train.batch_size 16 x train.grad_accum_steps 8 x 4 ranks = 512"):
        data.steps_per_epoch(500, 16, 4, accum_steps=8)
