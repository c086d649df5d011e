"""Early stopping as a pure policy: validation history in, a decision out.

Every rank calls :func:`decide` on the same numbers (validation metrics come
from counts and sums all-reduced over ranks, and the all-reduce hands every
rank the same result), so every rank stops at the same epoch and restores
the same best weights, without a separate vote.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence


@dataclass(frozen=True)
class StopDecision:
    """What to do after the latest epoch (epochs are 1-based)."""

    improved: bool  # the latest epoch is the new best
    stop: bool  # no improvement for ``patience`` epochs: stop after this one
    best_epoch: int
    best_value: float
    epochs_without_improvement: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _better(value: float, best: float, direction: str, min_delta: float) -> bool:
    if math.isnan(value):
        return False
    if math.isnan(best):
        return True
    return value < best - min_delta if direction == "min" else value > best + min_delta


def decide(values: Sequence[float], direction: str, patience: int, min_delta: float = 0.0) -> StopDecision:
    """Decision after ``len(values)`` epochs of validation ``values`` (epoch 1 first).

    An epoch improves when it beats the best so far by more than ``min_delta``
    (a NaN never does). Stop once ``patience`` epochs in a row did not improve;
    as in Keras's ``EarlyStopping``, patience 0 and 1 both stop at the first
    epoch that does not improve.
    """
    if direction not in ("min", "max"):
        raise ValueError(f"direction must be min or max (got {direction!r})")
    if not values:
        raise ValueError("decide() needs at least one epoch's value")
    best_epoch, best = 0, math.nan
    for epoch, value in enumerate(values, start=1):
        if _better(float(value), best, direction, min_delta):
            best_epoch, best = epoch, float(value)
    waited = len(values) - best_epoch if best_epoch else len(values)
    return StopDecision(improved=best_epoch == len(values), stop=waited >= max(1, patience),
                        best_epoch=best_epoch, best_value=best, epochs_without_improvement=waited)
