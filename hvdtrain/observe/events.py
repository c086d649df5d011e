"""The loop's data types: what :func:`hvdtrain.training.loop.fit` passes to its hooks and takes to resume.

The contract layer of :mod:`hvdtrain.training`: the loop and the hooks
(:mod:`hvdtrain.training.hooks`) both build on it, neither on the other's
internals. Importing this module imports no heavy dependency.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

from hvdtrain.model.evaluation import scalar_metrics

EPOCH_METRIC = "train_loss"  # logged at every epoch's end: the steps it has are the epochs a run logged


@dataclass
class EpochStats:
    epoch: int
    steps: int
    examples: int
    loss: float
    accuracy: float
    seconds: float
    learning_rate: float = 0.0  # at the end of the epoch
    validation: Optional[dict[str, Any]] = None  # the validation split's report, when validated this epoch
    skipped_steps: int = 0  # optimizer steps skipped: non-finite gradients after a float16 all-reduce

    @property
    def samples_per_sec(self) -> float:
        return self.examples / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "samples_per_sec": self.samples_per_sec}

    def metrics(self) -> dict[str, float]:
        """Per-epoch MLflow metrics (validation ones prefixed ``val_``); :data:`EPOCH_METRIC` is always one."""
        out = {EPOCH_METRIC: self.loss, "train_accuracy": self.accuracy, "samples_per_sec": self.samples_per_sec,
               "epoch_seconds": self.seconds, "learning_rate": self.learning_rate,
               "skipped_steps": float(self.skipped_steps)}
        if self.validation is not None:
            out.update(scalar_metrics(self.validation, "val"))
        return out


def epoch_stats(epoch: int, steps: int, totals: np.ndarray, seconds: float) -> EpochStats:
    """From rank-summed [loss sum, correct, examples]: exact means, not a mean of means."""
    loss_sum, correct, examples = (float(x) for x in totals)
    return EpochStats(epoch, steps, int(examples), loss_sum / max(examples, 1), correct / max(examples, 1), seconds)


@dataclass(frozen=True)
class LoopPlan:
    """How much one run trains: ``epochs`` x ``steps`` optimizer steps of ``accum_steps`` batches of
    ``batch_size`` records on each rank."""

    epochs: int
    steps: int
    accum_steps: int = 1
    batch_size: int = 1
    steps_per_call: int = 1  # optimizer steps per call of the step function (hvdtrain.training.loop)

    @property
    def examples_per_step(self) -> int:
        """This rank's examples per optimizer step."""
        return self.accum_steps * self.batch_size


@dataclass(frozen=True)
class StepInfo:
    """What the hooks hear after an optimizer step."""

    epoch: int
    step: int  # 1-based within the epoch
    global_step: int  # 1-based over the whole run, resumed runs included
    data_seconds: float  # time blocked waiting for this step's batches
    loss_sum: Any  # this rank's loss sum over its examples (a tensor: reading it syncs the device)
    examples: int  # this rank's examples in the step
    step_seconds: float = 0.0  # wall time of the step function call (computing and all-reducing)


@dataclass
class Start:
    """Where a (resumed) run starts: 0 steps, no history, nothing carried for a fresh one."""

    step: int = 0  # global optimizer steps already done, over all epochs
    history: list[EpochStats] = field(default_factory=list)
    carried: Optional[np.ndarray] = None  # [loss sum, correct, examples] of the interrupted epoch, rank-summed
    carried_seconds: float = 0.0
    stopped: bool = False  # the run had already stopped (early stopping) when it was saved
    step_offset: int = 0  # global step = ``step_offset`` + layout step (see resume.check_layout)


@dataclass
class LoopState:
    """What a checkpoint needs from the loop after a step."""

    step: int  # global optimizer step just finished (1-based)
    epoch: int
    epoch_end: bool
    partial: Callable[[], np.ndarray]  # this rank's [loss sum, correct, examples] of the epoch so far (a device
    # sync: call it only when saving); zeros at an epoch end
    epoch_seconds: float
    history: list[EpochStats]
    stopped: bool = False
    layout_step: Optional[int] = None  # steps of this run's layout done; the global step when there is no offset

    def __post_init__(self) -> None:
        if self.layout_step is None:
            self.layout_step = self.step


class Hook:
    """A loop hook that does nothing; subclasses override what they need."""

    def start_epoch(self, epoch: int) -> None:
        """Before the epoch's first step."""

    def on_step(self, info: StepInfo) -> None:
        """After each optimizer step; no collectives (rank 0's reporting is timed by its own clock)."""

    def end_epoch(self, stats: EpochStats) -> bool:
        """After each epoch; may run collectives; True stops training (the same answer on every rank)."""
        return False

    def after_step(self, state: LoopState) -> None:
        """After each step that does not end an epoch, and after ``end_epoch``; may run collectives."""

    def pause_after(self, global_step: int, layout_step: int) -> bool:
        """Whether this hook acts after that step, so that a multi-step call must end there (pure)."""
        return False


class HookList(Hook):
    """Hooks called in order; training stops when any hook's ``end_epoch`` says so."""

    def __init__(self, hooks: Sequence[Hook]):
        self.hooks = list(hooks)

    def start_epoch(self, epoch: int) -> None:
        for hook in self.hooks:
            hook.start_epoch(epoch)

    def on_step(self, info: StepInfo) -> None:
        for hook in self.hooks:
            hook.on_step(info)

    def end_epoch(self, stats: EpochStats) -> bool:
        stops = [hook.end_epoch(stats) for hook in self.hooks]  # every hook runs: some are collectives
        return any(stops)

    def after_step(self, state: LoopState) -> None:
        for hook in self.hooks:
            hook.after_step(state)

    def pause_after(self, global_step: int, layout_step: int) -> bool:
        return any(hook.pause_after(global_step, layout_step) for hook in self.hooks
                   if hasattr(hook, "pause_after"))  # duck-typed hooks without it never pause
