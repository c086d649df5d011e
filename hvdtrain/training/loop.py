"""The epoch loop every rank runs.

:func:`fit` runs ``epochs`` x ``steps`` optimizer steps (a :class:`LoopPlan`)
on the rank's endless batch stream; each step takes ``accum_steps`` batches
(gradient accumulation), and the time blocked in ``next(batches)`` is
measured apart from the step. Per-epoch loss and accuracy are sums
all-reduced over ranks. Everything else is a hook (:mod:`hvdtrain.training.hooks`),
called on every rank in list order, the way Keras composes callbacks:

* ``start_epoch(epoch)``;
* ``on_step(info)`` after each optimizer step (:class:`StepInfo`: epoch, step
  in the epoch, global step, data wait, loss sum, the step call's wall time; no collectives here: rank
  0's reporting is timed by the clock, which differs between ranks);
* ``end_epoch(stats) -> stop`` after each epoch (validation, early
  stopping). It may run collectives, and must return the same decision on
  every rank; the loop stops when any hook says so;
* ``after_step(state)`` after every optimizer step that does not end an
  epoch, and after ``end_epoch`` (``state.epoch_end``): checkpoints. It may
  run collectives; whether it does must depend on the step number only;
* ``pause_after(global_step, layout_step) -> bool``: whether the hook acts
  after that step (a checkpoint, the timeline starting or stopping), so a
  multi-step call must end there.

Several steps per call (``plan.steps_per_call`` = K > 1, like Keras's
``steps_per_execution``): the loop hands the step function the batches of
up to K optimizer steps at once and gets back per-step loss sums and correct
counts (vectors, read only when a hook reads them). A call never crosses an
epoch end or a step some hook pauses after, so checkpoints, resumes and
epoch sums are those of one step per call; hooks still hear every step.

Step numbers are computed once, here: the *global step* (checkpoint names,
MLflow steps; it only grows, across resumes in another layout) and the
*layout step* (steps of this run's ``steps_per_epoch``, which epochs are
counted in). A resumed run passes ``start`` (:class:`Start`): the global
steps already done, the offset between the two numberings, the finished
epochs' stats, and the interrupted epoch's sums so far (rank-summed, carried
by rank 0 only, so the epoch's all-reduce stays exact).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from hvdtrain.observe.events import EpochStats, Hook, HookList, LoopPlan, LoopState, Start, StepInfo, epoch_stats
from hvdtrain.runtime import distributed


def take_batches(batches: Iterator[Any], count: int,
                 clock: Callable[[], float] = time.perf_counter) -> tuple[list[Any], float]:
    """The next ``count`` batches, and the seconds spent waiting for them."""
    start = clock()
    taken = [next(batches) for _ in range(count)]
    return taken, clock() - start


def call_size(step: int, steps: int, steps_per_call: int, pause_after: Callable[[int], bool]) -> int:
    """How many optimizer steps the next call runs from ``step`` (1-based in an epoch of ``steps``) on (pure):
    up to ``steps_per_call``, never past the epoch's end, ending at the first step a hook pauses after."""
    n = 1
    while n < steps_per_call and step + n <= steps and not pause_after(step + n - 1):
        n += 1
    return n


@dataclass(frozen=True)
class StepValue:
    """Step ``index``'s entry of a multi-step call's per-step vector; read (a device sync) when converted."""

    values: Any
    index: int

    def __float__(self) -> float:
        return float(np.asarray(self.values)[self.index])


def per_step(values: Any, n: int) -> list[Any]:
    """One value per step from a call's result: the value itself when it is one step's (a scalar), else
    the entries of its per-step vector, unread."""
    if n == 1 and len(getattr(values, "shape", ())) == 0:
        return [values]
    return [StepValue(values, i) for i in range(n)]


def fit(step_fn: Callable[[Sequence[Any]], tuple[Any, Any]], batches: Iterator[Any], plan: LoopPlan,
        hooks: Sequence[Hook], start: Optional[Start] = None,
        phase: Callable[[str], None] = lambda what: None) -> list[EpochStats]:
    """Run up to ``plan.epochs`` x ``plan.steps`` optimizer steps; stops early when a hook's ``end_epoch`` says so.

    ``step_fn`` takes the batches of n optimizer steps (n x ``plan.accum_steps``; n is 1 unless
    ``plan.steps_per_call`` > 1) and returns their loss sums and correct counts: scalars for one step,
    per-step vectors for several. ``hooks`` are called in order (see the module docstring); ``phase``
    hears what the loop is about to wait for (the stall watchdog's message).
    Returns every epoch's stats, those of a resumed run's earlier epochs included.
    """
    hook_list = HookList(hooks)
    start = start or Start()
    history = list(start.history)
    if start.stopped:
        return history
    steps, offset = plan.steps, start.step_offset
    first_epoch, done_in_epoch = divmod(start.step - offset, steps)
    for epoch in range(first_epoch + 1, plan.epochs + 1):
        resumed = epoch == first_epoch + 1 and done_in_epoch > 0
        carried = start.carried if resumed and start.carried is not None else np.zeros(3)
        hook_list.start_epoch(epoch)
        begin = time.perf_counter() - (start.carried_seconds if resumed else 0.0)
        loss_sums: list[Any] = []  # per-step device scalars, read only when a partial sum is needed
        corrects: list[Any] = []

        def partial() -> np.ndarray:
            done = len(loss_sums) * plan.examples_per_step
            return carried + np.array([sum(float(x) for x in loss_sums), sum(float(x) for x in corrects), done],
                                      np.float64)

        base = (epoch - 1) * steps  # layout steps before this epoch
        step = done_in_epoch + 1 if resumed else 1
        while step <= steps:
            n = call_size(step, steps, plan.steps_per_call, lambda s: hook_list.pause_after(offset + base + s, base + s))
            first = offset + base + step
            what = f"step {first}" if n == 1 else f"steps {first}-{first + n - 1}"
            phase(f"waiting for input batches of {what}")
            micro, waited = take_batches(batches, n * plan.accum_steps)
            phase(f"computing and all-reducing {what}")
            stepping = time.perf_counter()
            losses, rights = step_fn(micro)
            stepped = time.perf_counter() - stepping
            for loss_sum, correct in zip(per_step(losses, n), per_step(rights, n)):
                layout_step = base + step
                loss_sums.append(loss_sum)
                corrects.append(correct)
                hook_list.on_step(StepInfo(epoch, step, offset + layout_step, waited / n, loss_sum,
                                           plan.examples_per_step, stepped / n))
                if step < steps:
                    hook_list.after_step(LoopState(offset + layout_step, epoch, False, partial,
                                                   time.perf_counter() - begin, history, layout_step=layout_step))
                step += 1
        phase(f"all-reducing the metrics of epoch {epoch}")
        totals = distributed.allreduce_sum(partial(), name=f"hvdtrain.epoch{epoch}")
        stats = epoch_stats(epoch, steps, totals, time.perf_counter() - begin)
        history.append(stats)
        phase(f"ending epoch {epoch} (validation, early stopping)")
        stop = hook_list.end_epoch(stats)
        hook_list.after_step(LoopState(offset + epoch * steps, epoch, True, lambda: np.zeros(3), 0.0, history,
                                   stopped=stop, layout_step=epoch * steps))
        if stop:
            break
    return history
