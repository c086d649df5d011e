"""Fail fast, never hang: a stall watchdog and Horovod's own timers.

The training loop tells the watchdog what it is doing (``phase("waiting for
input batch")``, ``phase("all-reduce step 1234")``) and when it made progress
(``beat()``). If no progress comes for ``timeout`` seconds, the watchdog
dumps every thread's stack to stderr and ends the process with a message
naming the rank and what it was waiting for, so horovodrun (or Spark) tears
the job down instead of letting it hang.

When a peer rank dies, horovodrun stops the job and names the process; the
Horovod settings from :func:`horovod_env` bound how long a surviving rank
may wait on a lost peer when nothing else stops it.
"""
from __future__ import annotations

import faulthandler
import logging
import os
import sys
import threading
import time
from typing import Callable, Optional

from hvdtrain.core import errors

log = logging.getLogger(__name__)
EXIT_STALLED = errors.EXIT_STALLED  # 75, EX_TEMPFAIL: a retry of the job may succeed


def horovod_env(peer_timeout: int, stall_check_warning: int, stall_timeout: int,
                checkpoint_timeout: int = 0) -> dict[str, str]:
    """Horovod's timers, as environment variables read by ``hvd.init()``."""
    return {
        "HOROVOD_GLOO_TIMEOUT_SECONDS": str(peer_timeout),
        "HOROVOD_STALL_CHECK_TIME_SECONDS": str(stall_check_warning),
        # Horovod's own stall shutdown, a little after ours so the watchdog's message comes first; the
        # other ranks legitimately wait in a collective while rank 0 publishes or reads a checkpoint.
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": str(max(stall_timeout, checkpoint_timeout) + 30),
    }


def stall_message(rank: int, idle: float, phase: str) -> str:
    return (f"rank {rank}: no progress for {idle:.0f}s while {phase}; stacks of every thread are above. "
            "Exiting so the job fails instead of hanging (fault.stall_timeout, fault.checkpoint_timeout)")


class Watchdog:
    """Ends the process when the training loop stops making progress."""

    def __init__(self, timeout: float, rank: int, on_stall: Optional[Callable[[str], None]] = None,
                 clock: Callable[[], float] = time.monotonic, poll: Optional[float] = None):
        self.timeout, self.rank = timeout, rank
        self._on_stall = on_stall or _dump_and_exit
        self._clock = clock
        self._poll = poll if poll is not None else max(0.05, min(5.0, timeout / 4))
        self._state = (clock(), timeout, "starting")  # (last progress, limit, phase): swapped whole, read once
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def phase(self, what: str, timeout: Optional[float] = None) -> None:
        """Now doing ``what`` (named if it stalls); entering a phase counts as progress.

        ``timeout`` replaces the stall timeout until the next phase, for work that legitimately
        takes long without a step (publishing or reading a checkpoint on slow storage).
        """
        self._state = (self._clock(), timeout if timeout is not None else self.timeout, what)

    def beat(self) -> None:
        _, limit, what = self._state
        self._state = (self._clock(), limit, what)

    def check(self) -> Optional[str]:
        """The stall message when the loop is stalled now, else None (pure but for the clock)."""
        last, limit, what = self._state
        idle = self._clock() - last
        return stall_message(self.rank, idle, what) if idle > limit else None

    def __enter__(self) -> "Watchdog":
        self.beat()
        self._thread = threading.Thread(target=self._watch, name="hvdtrain-watchdog", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _watch(self) -> None:
        while not self._stop.wait(self._poll):
            message = self.check()
            if message:
                self._on_stall(message)
                return


def _dump_and_exit(message: str) -> None:
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    log.error(message)
    print(f"hvdtrain: error: {message}", file=sys.stderr, flush=True)
    os._exit(EXIT_STALLED)
