"""Learning-rate schedules: pure functions, and the same curves as Keras schedules.

The rate at optimizer step ``s`` (0-based; with gradient accumulation a step is
one all-reduce + update, not one batch):

* warm-up: ``peak * (s + 1) / warmup_steps`` for ``s < warmup_steps``;
* then, over the remaining ``total_steps - warmup_steps`` steps, ``constant``
  (stay at ``peak``), ``linear`` or ``cosine`` decay from ``peak`` down to
  ``peak * min_lr_ratio``, where it stays.

``peak`` is ``train.learning_rate * world size`` (linear scaling: the global
batch grows with the rank count) and ``total_steps`` is ``epochs x
steps_per_epoch``. :func:`learning_rate_at` is the reference; the Keras
:class:`WarmupDecay` computes the same values in the graph from the
optimizer's step counter (tests hold them equal).
"""
from __future__ import annotations

import math
from typing import Any

import keras

DECAYS = ("constant", "linear", "cosine")


def scaled_learning_rate(base: float, size: int) -> float:
    """Linear scaling: the global batch grows with the rank count, so does the step size."""
    return base * size


def warmup_learning_rate(step: int, peak: float, warmup_steps: int) -> float:
    """Rate at optimizer step ``step`` (0-based): linear ramp to ``peak`` over ``warmup_steps``."""
    return peak if warmup_steps <= 0 else peak * min(1.0, (step + 1) / warmup_steps)


def decay_progress(step: int, warmup_steps: int, total_steps: int) -> float:
    """How far step ``step`` is through the decay phase, in [0, 1]."""
    span = max(1, total_steps - warmup_steps)
    return min(1.0, max(0.0, (step - warmup_steps) / span))


def learning_rate_at(step: int, peak: float, warmup_steps: int = 0, total_steps: int = 0,
                     decay: str = "constant", min_lr_ratio: float = 0.0) -> float:
    """The learning rate at optimizer step ``step`` (pure; see the module docstring)."""
    if decay not in DECAYS:
        raise ValueError(f"train.lr_schedule must be one of {', '.join(DECAYS)} (got {decay!r})")
    if step < warmup_steps:
        return warmup_learning_rate(step, peak, warmup_steps)
    if decay == "constant":
        return peak
    floor = peak * min_lr_ratio
    p = decay_progress(step, warmup_steps, total_steps)
    if decay == "linear":
        return peak - (peak - floor) * p
    return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * p))


class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """:func:`learning_rate_at` as a Keras schedule over the optimizer's step counter."""

    def __init__(self, peak: float, warmup_steps: int = 0, total_steps: int = 0, decay: str = "constant",
                 min_lr_ratio: float = 0.0):
        if decay not in DECAYS:
            raise ValueError(f"train.lr_schedule must be one of {', '.join(DECAYS)} (got {decay!r})")
        self.peak, self.warmup_steps, self.total_steps = float(peak), int(warmup_steps), int(total_steps)
        self.decay, self.min_lr_ratio = decay, float(min_lr_ratio)

    def __call__(self, step: Any) -> Any:
        ops = keras.ops
        s = ops.cast(step, "float32")
        peak = ops.convert_to_tensor(self.peak, "float32")
        if self.warmup_steps > 0:
            warm = peak * ops.minimum(1.0, (s + 1.0) / float(self.warmup_steps))
        else:
            warm = peak
        if self.decay == "constant":
            return warm
        floor = self.peak * self.min_lr_ratio
        span = float(max(1, self.total_steps - self.warmup_steps))
        p = ops.clip((s - float(self.warmup_steps)) / span, 0.0, 1.0)
        if self.decay == "linear":
            decayed = peak - (self.peak - floor) * p
        else:
            decayed = floor + (self.peak - floor) * 0.5 * (1.0 + ops.cos(math.pi * p))
        return ops.where(s < float(self.warmup_steps), warm, decayed)

    def get_config(self) -> dict[str, Any]:
        return {"peak": self.peak, "warmup_steps": self.warmup_steps, "total_steps": self.total_steps,
                "decay": self.decay, "min_lr_ratio": self.min_lr_ratio}


class WarmupSchedule(WarmupDecay):
    """Warm-up to a constant rate (the schedule before decay options existed)."""

    def __init__(self, peak: float, warmup_steps: int):
        super().__init__(peak, warmup_steps)

    def get_config(self) -> dict[str, Any]:
        return {"peak": self.peak, "warmup_steps": self.warmup_steps}
