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
  run collectives; whether it does must depend on the step number only.

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
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from hvdtrain import distributed
from hvdtrain.training.events import EpochStats, LoopPlan, LoopState, Start, StepInfo, epoch_stats
from hvdtrain.training.hooks import Hook, HookList


def take_batches(batches: Iterator[Any], count: int,
                 clock: Callable[[], float] = time.perf_counter) -> tuple[list[Any], float]:
    """The next ``count`` batches, and the seconds spent waiting for them."""
    start = clock()
    taken = [next(batches) for _ in range(count)]
    return taken, clock() - start


def fit(step_fn: Callable[[Sequence[Any]], tuple[Any, Any]], batches: Iterator[Any], plan: LoopPlan,
        hooks: Sequence[Hook], start: Optional[Start] = None,
        phase: Callable[[str], None] = lambda what: None) -> list[EpochStats]:
    """Run up to ``plan.epochs`` x ``plan.steps`` optimizer steps; stops early when a hook's ``end_epoch`` says so.

    ``hooks`` are called in order (see the module docstring); ``phase`` hears
    what the loop is about to wait for (the stall watchdog's message).
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

        for step in range(done_in_epoch + 1 if resumed else 1, steps + 1):
            layout_step = (epoch - 1) * steps + step
            global_step = offset + layout_step
            phase(f"waiting for input batches of step {global_step}")
            micro, waited = take_batches(batches, plan.accum_steps)
            phase(f"computing and all-reducing step {global_step}")
            stepping = time.perf_counter()
            loss_sum, correct = step_fn(micro)
            stepped = time.perf_counter() - stepping
            loss_sums.append(loss_sum)
            corrects.append(correct)
            hook_list.on_step(StepInfo(epoch, step, global_step, waited, loss_sum, plan.examples_per_step, stepped))
            if step < steps:
                hook_list.after_step(LoopState(global_step, epoch, False, partial, time.perf_counter() - begin, history,
                                           layout_step=layout_step))
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
