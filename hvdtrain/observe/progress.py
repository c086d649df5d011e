"""Step-level progress on rank 0: a tqdm bar on a terminal, plain log lines elsewhere.

YARN and ``horovodrun`` capture stderr into log files, where a progress bar
turns into megabytes of carriage returns; there rank 0 writes a log line
every ``train.progress_every_steps`` steps or ``train.progress_every_seconds``
seconds instead. Under ``horovodrun`` rank 0 never has a terminal, even when
the user does: when the ``hvdtrain`` launcher says it has one
(:data:`hvdtrain.observe.console.CONSOLE_ENV`), rank 0 sends progress events instead
(mode ``events``) and the launcher draws the same :class:`hvdtrain.observe.bar.TerminalBar`.
:func:`choose_mode` decides (pure).

Step figures come from a :class:`WindowMeter`: wall time per optimizer step,
samples per second (global: this rank's examples x world size), and the
fraction of wall time the loop spent blocked in ``next(batches)`` waiting for
input. The loss is rank 0's own (exact, all-reduced losses are per epoch);
reading it syncs with the device, so that happens once per window, not per
step. The same meter feeds MLflow's per-step metrics (:class:`MetricsLogger`).
"""
from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Optional, TextIO

from hvdtrain.observe import console
from hvdtrain.observe.bar import TerminalBar

Mode = Literal["bar", "events", "log", "off"]
log = logging.getLogger("hvdtrain.observe.progress")
REFRESH_SECONDS = 0.5  # how often a bar (or the launcher's bar) gets a new loss and rate


def choose_mode(setting: str, is_chief: bool, stderr_is_tty: bool, launcher_has_tty: bool = False) -> Mode:
    """``bar``, ``events``, ``log`` or ``off`` for ``train.progress`` (auto|bar|log|off) on this rank (pure).

    ``launcher_has_tty``: the ``hvdtrain`` launcher reads this rank's output and draws the bar
    on its terminal, so a bar here becomes progress events for it.
    """
    if setting not in ("auto", "bar", "log", "off"):
        raise ValueError(f"train.progress must be one of auto, bar, log, off (got {setting!r})")
    if not is_chief or setting == "off":
        return "off"
    if setting == "log":
        return "log"
    if launcher_has_tty:
        return "events"
    if setting == "auto":
        return "bar" if stderr_is_tty else "log"
    return "bar"


def mode_for(setting: str, is_chief: bool) -> Mode:
    """:func:`choose_mode` for this process: its stderr, and what the launcher said."""
    return choose_mode(setting, is_chief, sys.stderr.isatty(), console.launcher_has_tty())


def due(steps_since: int, seconds_since: float, every_steps: int, every_seconds: Optional[float]) -> bool:
    """Whether a report is due after ``steps_since`` steps / ``seconds_since`` seconds (pure)."""
    if steps_since <= 0:
        return False
    return steps_since >= every_steps or (every_seconds is not None and seconds_since >= every_seconds)


@dataclass(frozen=True)
class WindowStats:
    """Figures of the steps since the previous report."""

    steps: int
    examples: int  # global
    seconds: float
    data_seconds: float
    loss: float

    @property
    def samples_per_sec(self) -> float:
        return self.examples / self.seconds if self.seconds > 0 else 0.0

    @property
    def step_seconds(self) -> float:
        return self.seconds / self.steps if self.steps else 0.0

    @property
    def data_wait_fraction(self) -> float:
        return min(1.0, self.data_seconds / self.seconds) if self.seconds > 0 else 0.0


@dataclass
class WindowMeter:
    """Accumulates steps between reports; ``clock`` is injectable for tests."""

    clock: Callable[[], float] = time.perf_counter
    start: float = field(default=0.0)
    steps: int = 0
    examples: int = 0
    local_examples: int = 0
    data_seconds: float = 0.0
    loss_sums: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.start = self.clock()

    def add(self, data_seconds: float, loss_sum: Any, local_examples: int, world_size: int) -> None:
        self.steps += 1
        self.data_seconds += data_seconds
        self.local_examples += local_examples
        self.examples += local_examples * world_size
        self.loss_sums.append(loss_sum)

    def elapsed(self) -> float:
        return self.clock() - self.start

    def flush(self) -> WindowStats:
        """The window's figures (reads the losses: a device sync), then start a new window."""
        loss = sum(float(x) for x in self.loss_sums) / max(self.local_examples, 1)
        stats = WindowStats(self.steps, self.examples, self.elapsed(), self.data_seconds, loss)
        self.start, self.steps, self.examples, self.local_examples = self.clock(), 0, 0, 0
        self.data_seconds, self.loss_sums = 0.0, []
        return stats


def format_line(epoch: int, epochs: int, step: int, steps: int, stats: WindowStats) -> str:
    """One progress log line (pure)."""
    return (f"epoch {epoch}/{epochs} step {step}/{steps}: loss {stats.loss:.4f}, "
            f"{stats.samples_per_sec:.0f} samples/s, {stats.step_seconds * 1000:.1f} ms/step, "
            f"data wait {stats.data_wait_fraction:.0%}")


@dataclass(frozen=True)
class Sinks:
    """Where :class:`Progress` shows things: the bar's stream (default stderr), log lines (default the
    ``hvdtrain.observe.progress`` logger) and events for the launcher's terminal."""

    stream: Optional[TextIO] = None
    emit: Optional[Callable[[str], None]] = None
    send: Callable[..., None] = console.emit


class Progress:
    """Rank 0's progress display; every method is a no-op in mode ``off``.

    ``bar`` draws a :class:`TerminalBar` per epoch; ``events`` sends the same figures to the
    launcher (:func:`hvdtrain.observe.console.emit`); ``log`` writes a line at the configured cadence.
    """

    def __init__(self, mode: Mode, epochs: int, steps: int, every_steps: int, every_seconds: float,
                 clock: Callable[[], float] = time.perf_counter, sinks: Optional["Sinks"] = None):
        sinks = sinks or Sinks()
        self.mode, self.epochs, self.steps = mode, epochs, steps
        self.every_steps, self.every_seconds = every_steps, every_seconds
        self._clock, self._stream = clock, sinks.stream
        self._emit = sinks.emit or log.info
        self._send = sinks.send
        self._meter = WindowMeter(clock)
        self._bar: Optional[TerminalBar] = None
        self._epoch = 0
        self._step = 0
        self._shown = False  # this epoch's first step has been shown

    def start_epoch(self, epoch: int) -> None:
        self._epoch, self._step, self._shown = epoch, 0, False
        self._meter = WindowMeter(self._clock)

    def on_step(self, step: int, data_seconds: float, loss_sum: Any, local_examples: int, world_size: int) -> None:
        """After optimizer step ``step`` (1-based within the epoch)."""
        if self.mode == "off":
            return
        self._meter.add(data_seconds, loss_sum, local_examples, world_size)
        self._step = step
        if self.mode == "log":
            if due(self._meter.steps, self._meter.elapsed(), self.every_steps, self.every_seconds):
                self._emit(format_line(self._epoch, self.epochs, step, self.steps, self._meter.flush()))
            return
        # A bar shows an epoch's first step at once, then new figures about twice a second.
        if not self._shown or due(self._meter.steps, self._meter.elapsed(), self.steps, REFRESH_SECONDS):
            self._show(self._meter.flush())

    def end_epoch(self) -> None:
        if self.mode in ("bar", "events") and self._meter.steps:
            self._show(self._meter.flush())  # the epoch's last step
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _show(self, stats: WindowStats) -> None:
        position = (self._epoch - 1) * self.steps + self._step
        if self.mode == "events":
            self._send("progress", epoch=self._epoch, epochs=self.epochs, step=self._step, steps=self.steps,
                       done=position - stats.steps, loss=stats.loss, samples_per_sec=stats.samples_per_sec)
        else:
            if self._bar is None:
                self._bar = TerminalBar(self.epochs, self.steps, done=position - stats.steps, stream=self._stream)
            self._bar.update(self._epoch, self._step, stats.loss, stats.samples_per_sec)
        self._shown = True


class MetricsLogger:
    """Per-step metrics every ``every_steps`` optimizer steps to ``log_metrics`` (MLflow on rank 0)."""

    def __init__(self, log_metrics: Callable[[Mapping[str, float], int], None], every_steps: int,
                 clock: Callable[[], float] = time.perf_counter):
        self._log, self.every_steps = log_metrics, every_steps
        self._clock = clock
        self._meter = WindowMeter(clock)

    def start_epoch(self, epoch: int) -> None:
        """Restart timing so a window never spans the previous epoch's validation."""
        self._meter = WindowMeter(self._clock)

    def on_step(self, global_step: int, data_seconds: float, loss_sum: Any, local_examples: int,
                world_size: int) -> None:
        if self.every_steps <= 0:
            return
        self._meter.add(data_seconds, loss_sum, local_examples, world_size)
        if global_step % self.every_steps:
            return
        stats = self._meter.flush()
        self._log({"step_loss": stats.loss, "step_samples_per_sec": stats.samples_per_sec,
                   "step_seconds": stats.step_seconds, "data_wait_fraction": stats.data_wait_fraction},
                  global_step)
