"""Where a rank's time to its first training step went: every restart, resize and tuning trial pays it.

The clock starts when the hvdtrain command started the job (``HVDTRAIN_LAUNCHED_AT``: for the first try the
command's own start, for a relaunch the relaunch; set by :func:`hvdtrain.observe.console.run` for ``hvdtrain train`` and
by the YARN driver, :mod:`yarn.driver`, for ``hvdtrain yarn submit``, so there spark-submit, the containers
and the env archive count too) or, without a launcher (plain ``horovodrun``), when this process started. Each
phase ends at a :func:`mark`; the last one is the first optimizer step (tracing included). Rank 0 logs the
breakdown once, and the run's report keeps it (``eval_report.json`` ``startup``).
"""
from __future__ import annotations

import logging
import os
import time
from typing import Optional

import psutil

log = logging.getLogger("hvdtrain.training.train")

LAUNCHED_AT_ENV = "HVDTRAIN_LAUNCHED_AT"  # seconds since the epoch when the launcher started this try


def launched_at(env: Optional[dict[str, str]] = None) -> Optional[float]:
    """The launcher's start time, when one set it (None for a value that is not a number)."""
    value = (os.environ if env is None else env).get(LAUNCHED_AT_ENV)
    try:
        return float(value) if value else None
    except ValueError:
        return None


def try_clock(first_try: bool, command_start: Optional[float], now: float) -> dict[str, str]:
    """The environment that starts a try's ranks' clock (pure): the first try's at the command's start (when
    known), a relaunch's at its own start."""
    return {LAUNCHED_AT_ENV: f"{command_start if first_try and command_start is not None else now:.3f}"}


def process_start() -> float:
    """When this process started (seconds since the epoch), to the kernel's 10 ms clock tick.

    From ``/proc/self/stat`` against the boot-time clock: psutil's ``create_time`` adds the boot time in whole
    seconds, up to a second off, more than some phases last. Elsewhere than Linux, psutil's."""
    try:
        with open("/proc/self/stat") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime, in clock ticks after boot
        return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return float(psutil.Process().create_time())


class Clock:
    """Phases of one process's start-up, as (name, end time) marks after its start."""

    def __init__(self, process_start: float, launcher_start: Optional[float]) -> None:
        self.marks: list[tuple[str, float]] = []
        # a launcher's clock after this process started is another try's or another host's: left out
        self.start = min(launcher_start, process_start) if launcher_start is not None and \
            launcher_start <= process_start + 0.05 else process_start
        if self.start < process_start:
            self.marks.append(("launcher", process_start))
        self.logged = False

    def mark(self, phase: str, at: Optional[float] = None) -> None:
        """``phase`` ended now (or at ``at``); a phase marked twice keeps its first end."""
        if all(name != phase for name, _ in self.marks):
            self.marks.append((phase, time.time() if at is None else at))

    def breakdown(self) -> dict[str, float]:
        """Seconds per phase, in order, and ``total`` from the clock's start to the last mark (pure)."""
        out, before = {}, self.start
        for name, end in self.marks:
            out[name] = round(max(0.0, end - before), 3)
            before = max(before, end)
        out["total"] = round(before - self.start, 3)
        return out


def describe(breakdown: dict[str, float]) -> str:
    """One line: ``11.2 s to the first step (launcher 0.4 s, ...)`` (pure)."""
    parts = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in breakdown.items() if name != "total")
    return f"{breakdown.get('total', 0.0):.1f} s to the first step ({parts})"


CLOCK = Clock(process_start(), launched_at())


def mark(phase: str) -> None:
    CLOCK.mark(phase)


def first_step_done(is_chief: bool) -> None:
    """The first optimizer step (with its tracing) ended: the breakdown is complete; rank 0 logs it once."""
    CLOCK.mark("first step")
    if is_chief and not CLOCK.logged:
        CLOCK.logged = True
        log.info("start-up: %s", describe(CLOCK.breakdown()))
