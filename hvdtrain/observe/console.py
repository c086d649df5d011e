"""What ``hvdtrain`` shows at the terminal while its child processes work.

The launcher (:mod:`hvdtrain.cli`) runs each step in a child process
(``python -m etl.job``; ``python -m hvdtrain.training.train``, under ``horovodrun`` for
more than one rank) and reads the child's output through pipes (:func:`run`).
It tells the child so in :data:`CONSOLE_ENV` (``tty`` when the launcher's
stderr is a terminal, else ``pipe``), and the child then speaks a small line
protocol on stdout (:func:`emit`): one JSON event per line after
:data:`EVENT_MARK`. Three events exist: rank 0's ``progress``
(:mod:`hvdtrain.observe.progress`, mode ``events``), the ``result`` of a training run,
and a user ``error`` with its exit code (:func:`report_error`).

On a terminal the launcher strips horovodrun's ``[N]<stdout|stderr>:``
prefixes (rank 0's lines appear as the rank wrote them, other ranks' carry a
``[rank N]`` label) and draws rank 0's progress bar from its events. Elsewhere
(CI, YARN and other log files) every line passes unchanged. Either way an
error is held back and printed last, and sets the exit code
(:mod:`hvdtrain.core.errors` has the table).
"""
from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import IO, Any, Optional, Sequence, TextIO

from hvdtrain.core import errors, secrets
from hvdtrain.hadoop import fs
from hvdtrain.observe.bar import TerminalBar
from hvdtrain.runtime import startup
from hvdtrain.runtime.supervise import RESTARTS_ENV

TAIL_LINES = 400  # kept for telling a lost rank from a stall or a user error
CONSOLE_ENV = "HVDTRAIN_CONSOLE"  # set by the launcher for its children: "tty" or "pipe"
EVENT_MARK = "@hvdtrain-event "
_PREFIX = re.compile(r"^\[(\d+)\]<(stdout|stderr)>:")  # horovodrun's, per line of each rank
_RANK_EXIT = re.compile(r"^Process (\d+) exit with status code (-?\d+)\.")  # horovodrun's, per failed rank
# TensorFlow's start-up notices, printed by every process that imports it (horovodrun and each
# rank) before absl logging starts, so TF_CPP_MIN_LOG_LEVEL cannot hide them: hidden on a terminal.
NOISE = ("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
         "port.cc:153] oneDNN custom operations are on.")


def spark_log_file(workdir: str, job: str) -> Optional[str]:
    """Where a local Spark job (``job``: etl, score, ...) writes Spark's own log; None off a local workdir."""
    return os.path.join(fs.local_path(workdir), "logs", f"spark-{job}.log") if fs.is_local(workdir) else None


def spark_log_note(path: str) -> str:
    return f"Spark's own log: {path}"


# -- the child's side ------------------------------------------------------------------------

def launcher_mode() -> Optional[str]:
    """``tty`` or ``pipe`` when the ``hvdtrain`` launcher reads this process's output, else None."""
    mode = os.environ.get(CONSOLE_ENV)
    return mode if mode in ("tty", "pipe") else None


def launcher_has_tty() -> bool:
    return launcher_mode() == "tty"


def emit(event: str, stream: Optional[TextIO] = None, **fields: Any) -> None:
    """One event line for the launcher (on stdout, flushed at once)."""
    stream = stream or sys.stdout
    stream.write(EVENT_MARK + json.dumps({"event": event, **fields}) + "\n")
    stream.flush()


def report_error(exc: BaseException, prog: str) -> int:
    """Tell the user (or the launcher) about ``exc`` in one line; returns the exit code for it.

    Notes added to the exception (``exc.add_note``, e.g. where Spark's log is) come first. Secrets in either
    are masked (:func:`hvdtrain.core.secrets.scrub`).
    """
    if launcher_mode():
        emit("error", code=errors.exit_code(exc), message=secrets.scrub(str(exc)),
             notes=[secrets.scrub(str(note)) for note in getattr(exc, "__notes__", ())])
        return errors.exit_code(exc)
    return print_error(exc, prog)


def print_error(exc: BaseException, prog: str, stream: Optional[TextIO] = None) -> int:
    """``exc``'s notes, then ``PROG: error: MESSAGE`` as the last line (secrets masked); returns the exit code."""
    stream = stream or sys.stderr
    sys.stdout.flush()
    for note in getattr(exc, "__notes__", ()):
        print(secrets.scrub(str(note)), file=stream)
    print(f"{prog}: error: {secrets.scrub(str(exc))}", file=stream, flush=True)
    return errors.exit_code(exc)


# -- reading a child's lines (pure) ----------------------------------------------------------

@dataclass(frozen=True)
class Line:
    """One line of a child's output."""

    raw: str  # as received, without the newline
    stream: str  # "stdout" or "stderr", as the rank wrote it when horovodrun says so
    rank: Optional[int] = None  # None: horovodrun's own line, or a child run without horovodrun
    text: str = ""  # without horovodrun's prefix
    event: Optional[dict[str, Any]] = None


def parse_line(raw: str, stream: str) -> Line:
    """Split off horovodrun's prefix and decode an event line (pure)."""
    rank, text = None, raw
    match = _PREFIX.match(raw)
    if match:
        rank, stream, text = int(match.group(1)), match.group(2), raw[match.end():]
    event = None
    if text.startswith(EVENT_MARK):
        try:
            event = json.loads(text[len(EVENT_MARK):])
        except ValueError:
            event = None  # not one of ours after all: show it
    return Line(raw, stream, rank, text, event)


def display(line: Line, tty: bool) -> Optional[str]:
    """What the user sees of a line, None for nothing (pure).

    Off a terminal every line stays as it was; on one, horovodrun's prefix goes, the
    lines of ranks other than 0 carry a short ``[rank N]`` label (once), and TensorFlow's
    start-up notices (:data:`NOISE`) are left out.
    """
    if line.event is not None:
        return None
    if not tty:
        return line.raw
    if any(noise in line.text for noise in NOISE):
        return None
    if line.rank is None or line.rank == 0:
        return line.text
    label = f"[rank {line.rank}]"
    return line.text if label in line.text else f"{label} {line.text}"


def rank_exit(line: Line) -> Optional[tuple[int, int]]:
    """(rank, exit code) from horovodrun's ``Process N exit with status code X.`` line (pure)."""
    match = _RANK_EXIT.match(line.text) if line.rank is None else None
    return (int(match.group(1)), int(match.group(2))) if match else None


# -- the launcher's side ---------------------------------------------------------------------

@dataclass
class Outcome:
    """How a child ended, and what it reported."""

    returncode: int = 0
    error: Optional[dict[str, Any]] = None  # the first error event
    result: Optional[dict[str, Any]] = None  # the result event's document
    rank_exit: Optional[tuple[int, int]] = None  # the first failed rank and its exit code (horovodrun)
    lines: deque = field(default_factory=lambda: deque(maxlen=TAIL_LINES))  # the last lines, as received

    @property
    def tail(self) -> str:
        """The last lines as one text, for :func:`hvdtrain.runtime.supervise.classify`."""
        return "\n".join(self.lines)


@dataclass
class View:
    """Shows a child's lines and draws rank 0's progress bar on a terminal."""

    tty: bool
    out: TextIO = field(default_factory=lambda: sys.stdout)
    err: TextIO = field(default_factory=lambda: sys.stderr)
    outcome: Outcome = field(default_factory=Outcome)
    _bar: Any = None
    _reporter: Optional[int] = None  # the rank whose error came first

    def feed(self, line: Line) -> None:
        self.outcome.lines.append(line.raw)
        if line.event is not None:
            self._event(line.event, line.rank)
            return
        found = rank_exit(line)
        if found and self.outcome.rank_exit is None:
            self.outcome.rank_exit = found
        if self.outcome.error is not None and line.rank != self._reporter:
            # After a rank's reported error, the rest is its echo: horovodrun's traceback saying a
            # rank failed, the other ranks' broken collectives. The error line says why.
            return
        text = display(line, self.tty)
        if text is not None:
            self._write(text, self.out if line.stream == "stdout" else self.err)

    def _event(self, event: dict[str, Any], rank: Optional[int]) -> None:
        kind = event.get("event")
        if kind == "progress" and self.tty:
            self._progress(event)
        elif kind == "result":
            self.outcome.result = event.get("result")
        elif kind == "error" and self.outcome.error is None:
            self.outcome.error, self._reporter = event, rank
            self.close()  # the run is over: the bar would be in the way of what follows

    def _progress(self, event: dict[str, Any]) -> None:
        if self._bar is None:
            self._bar = TerminalBar(event["epochs"], event["steps"], done=event.get("done", 0), stream=self.err)
        self._bar.update(event["epoch"], event["step"], event.get("loss"), event.get("samples_per_sec"))
        if self._bar.finished:
            self.close()

    def _write(self, text: str, stream: TextIO) -> None:
        if self._bar is not None:
            self._bar.write(text, stream)
        else:
            stream.write(text + "\n")
            stream.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def child_env(base: dict[str, str], tty: bool) -> dict[str, str]:
    """A child's environment: told about the launcher, and unbuffered so lines arrive as written (pure)."""
    return {**base, CONSOLE_ENV: "tty" if tty else "pipe", "PYTHONUNBUFFERED": "1"}


def run(cmd: Sequence[str], env: dict[str, str], view: View) -> Outcome:
    """Run ``cmd``, showing its lines through ``view``; returns how it ended.

    Ctrl-C reaches the child too (same process group); this waits for it to go.
    """
    # The first try's ranks time their start-up from the command's start (its checks and config load count), a
    # relaunch's from here.
    env = {**env, **startup.try_clock(RESTARTS_ENV not in env, startup.CLOCK.start, time.time())}
    proc = subprocess.Popen(list(cmd), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines: "queue.Queue[Optional[tuple[str, bytes]]]" = queue.Queue()
    pumps = [threading.Thread(target=_pump, args=(pipe, name, lines), daemon=True)
             for pipe, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr"))]
    for pump in pumps:
        pump.start()
    try:
        open_pipes = len(pumps)
        while open_pipes:
            item = lines.get()
            if item is None:
                open_pipes -= 1
                continue
            view.feed(parse_line(item[1].decode("utf-8", "replace").rstrip("\r\n"), item[0]))
        view.outcome.returncode = proc.wait()
    except BaseException:
        _stop(proc)
        raise
    finally:
        view.close()
    return view.outcome


def _pump(pipe: IO[bytes], name: str, lines: "queue.Queue[Optional[tuple[str, bytes]]]") -> None:
    """Lines of one pipe onto the queue, then None. Binary, so a '\\r' stays inside its line."""
    try:
        for raw in iter(pipe.readline, b""):
            lines.put((name, raw))
    finally:
        lines.put(None)


def _stop(proc: subprocess.Popen) -> None:
    try:
        proc.wait(timeout=10)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):  # a child that ignores SIGINT, or a second Ctrl-C
        proc.kill()
        proc.wait()


def failure(outcome: Outcome, what: str) -> errors.HvdtrainError:
    """The error a failed child stands for: its own reported error, else what its exit says (pure)."""
    if outcome.error is not None:
        exc = errors.StepFailed(outcome.error.get("message", f"{what} failed"),
                                int(outcome.error.get("code", errors.StepFailed.exit_code)))
        for note in outcome.error.get("notes", ()):
            errors.add_note(exc, note)
        return exc
    if outcome.rank_exit is not None:
        rank, code = outcome.rank_exit
        who = f"{what} failed: rank {rank} exited with code {code}"
    else:
        code = outcome.returncode
        who = f"{what} failed with exit code {code}"
    kind = errors.EXIT_CODES.get(code)
    if kind is None or code == 0:  # e.g. killed by a signal (negative)
        return errors.StepFailed(f"{who}; see the messages above")
    return errors.StepFailed(f"{who} ({kind}); see the messages above", code)
