"""Automatic restart: relaunch a failed training job, which resumes from its newest valid checkpoint.

A week-long job on a shared cluster loses ranks (preempted containers, a host
that reboots), stalls (the watchdog ends a rank with exit 75) and meets storage
that fails after retries (exit 74). ``fault.max_restarts`` (``--max-restarts``)
relaunches the job up to K times; every relaunch resumes from the newest valid
checkpoint (``checkpoint.resume: auto``) in the same MLflow run. A config,
data or environment error never restarts: the same input fails the same way.

A restart that got no further does not get another: when the same failure
comes again from the same checkpoint step (no newer checkpoint since the last
restart), the next try would only repeat it, so the restarts stop with one
line naming the failure, the step and the restarts used. Signals differ in
what a relaunch can do (:data:`SIGNALS_TAKEN_AWAY`, :data:`SIGNALS_NEVER_RETRIED`).

:func:`classify` and :func:`decide` are the policy (pure);
:func:`run_with_restarts` carries the decision out with any launcher
(``horovodrun`` locally or on hosts, ``horovod.spark.run`` inside one YARN
application) and a backoff between tries. The relaunched job learns which try
it is from :data:`RESTARTS_ENV`, and reports it in ``result.json`` and MLflow.
"""
from __future__ import annotations

import json
import logging
import os
import re
import signal
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Mapping, Optional, Sequence

log = logging.getLogger("hvdtrain.runtime.supervise")

RESTARTS_ENV = "HVDTRAIN_RESTARTS"  # JSON list of the restarts before this try (cause, rank, code, step)
EXIT_STALLED = 75  # the watchdog ended a stalled rank (EX_TEMPFAIL)
EXIT_STORAGE = 74  # storage failed after retries (EX_IOERR)
# Exit codes of mistakes a relaunch cannot fix (hvdtrain.core.errors): usage/config, data, environment; Ctrl-C.
NO_RESTART = {2: "a config error", 3: "a data error", 4: "an environment problem", 130: "an interrupt"}
# horovodrun names the first process that failed; every failed one gets a line of its own.
FIRST_FAILED = re.compile(r"Process name: (\S+)\s+Exit code: (-?\d+)")
FAILED = re.compile(r"Process (\d+) exit with status code (-?\d+)")
TERMINATING = re.compile(r"Terminating remaining workers after failure of Process")
# Failures that an exit 1 hides but a relaunch cannot fix: the same code meets the same input again.
DETERMINISTIC = ((re.compile(r"\b(ModuleNotFoundError|ImportError|SyntaxError|NameError|AttributeError)\b"),
                  "an import or code error"),
                 (re.compile(r"\bDataLossError\b"), "corrupt data (DataLossError)"),
                 (re.compile(r"\b(hvdtrain\.errors\.)?(ConfigError|DataError|UsageError)\b"), "a config or data error"))
# A rank taken away from outside (a scheduler's preemption or node drain: SIGTERM; its ssh session or terminal
# gone: SIGHUP, exit 255) did nothing wrong: another try may be left alone, so these are retried up to
# fault.max_restarts even when no checkpoint came between. Unless the output says the memory limit was the reason
# (YARN's and Spark's words), which repeats like the OOM killer's SIGKILL.
SIGNALS_TAKEN_AWAY = frozenset({signal.SIGTERM, signal.SIGHUP})
MEMORY_KILL = re.compile(r"beyond (physical|virtual) memory limits|exceeding (physical |virtual )?memory limits"
                         r"|oom[-_ ]?kill", re.IGNORECASE)
MEMORY_CAUSE = "a rank killed for exceeding its memory limit"
# Signals whose cause is the same on every try: never retried. SIGILL: the binary uses an instruction this
# host's CPU lacks (a TensorFlow built for AVX-512); SIGSYS: a system call the host's sandbox forbids; SIGQUIT:
# someone asked for it (Ctrl-\), as Ctrl-C (exit 130) is never retried.
SIGNALS_NEVER_RETRIED: dict[int, str] = {signal.SIGILL: "an instruction this host's CPU lacks",
                                          signal.SIGSYS: "a system call this host forbids",
                                          signal.SIGQUIT: "a quit request"}
# Every other signal (SIGKILL: the OOM killer or a hard kill after a grace period; SIGSEGV, SIGBUS, SIGABRT,
# SIGFPE: a native crash, a race or a bad host as often as a bug) is retried, and stops when it comes again
# from the same step.
HINTS = {"SIGKILL": "a SIGKILL that repeats is most often the out-of-memory killer: give the ranks more "
                         "memory or lower train.batch_size",
         f"exit {EXIT_STALLED}": "the watchdog's message above names the rank and what it waited for",
         f"exit {EXIT_STORAGE}": "the storage error above is not transient: fix the storage or the path"}
ERROR_LINE = re.compile(r"^\S*(Error|Exception)\b.*$|error: .*$", re.MULTILINE)


@dataclass(frozen=True)
class Failure:
    """Why a try ended, and whether another try may help."""

    code: int  # the decisive exit code: the first failed rank's, else the launcher's
    rank: Optional[int]  # the rank that failed first, when the launcher says
    cause: str
    restartable: bool
    error: str = ""  # the output's last error line: the same one twice at the same step is deterministic


def describe_code(code: int) -> str:
    """What an exit code of a rank says about the failure (pure)."""
    if code == EXIT_STALLED:
        return "a stalled rank (watchdog, exit 75)"
    if code == EXIT_STORAGE:
        return "storage failed after retries (exit 74)"
    if code in NO_RESTART:
        return f"{NO_RESTART[code]} (exit {code})"
    if code == 255:
        return "a lost rank (ssh connection to its host dropped, exit 255)"
    number = signal_of(code)
    if number in SIGNALS_NEVER_RETRIED:
        return (f"a rank killed by {signal.Signals(number).name} ({SIGNALS_NEVER_RETRIED[number]}, the same on "
                "every try)")
    if number is not None:
        return f"a lost rank (killed by signal {number})"
    return f"a rank failure (exit {code})"


def signal_of(code: int) -> Optional[int]:
    """The signal that ended a process with exit ``code`` (``-N`` from Python, ``128 + N`` from a shell), or
    None (pure)."""
    number = -code if code < 0 else code - 128 if code > 128 and code != 255 else 0
    return number if number in signal.valid_signals() else None


def signal_name(code: int) -> str:
    number = signal_of(code)
    return signal.Signals(number).name if number is not None else f"exit {code}"


def classify(code: int, output: str = "") -> Failure:
    """The failure behind a job's exit ``code`` and its output (pure).

    The first failed rank decides when horovodrun names it; a user mistake on
    any rank (config, data, environment) is never restarted.
    """
    codes = [(int(r), int(c)) for r, c in FAILED.findall(output)]
    first = FIRST_FAILED.search(output)
    rank, decisive = (None, code)
    if first:
        name, decisive = first.group(1), int(first.group(2))
        rank = int(name) if name.isdigit() else None
    errors = [m.group(0).strip() for m in ERROR_LINE.finditer(output)]
    error = errors[-1][:300] if errors else ""
    for r, c in codes:
        if c in NO_RESTART and c != 130:
            return Failure(c, r, describe_code(c), False, error)
    if decisive not in NO_RESTART and decisive not in (EXIT_STALLED, EXIT_STORAGE) and 0 < decisive < 128:
        for pattern, what in DETERMINISTIC:
            if pattern.search(output):
                return Failure(decisive, rank, f"{what} (exit {decisive})", False, error)
    restartable = decisive not in NO_RESTART and signal_of(decisive) not in SIGNALS_NEVER_RETRIED
    if signal_of(decisive) in SIGNALS_TAKEN_AWAY and MEMORY_KILL.search(output):
        return Failure(decisive, rank, f"{MEMORY_CAUSE} (signal {signal_of(decisive)})", restartable, error)
    return Failure(decisive, rank, describe_code(decisive), restartable, error)


def _plain(code: int) -> bool:
    """An exit the process chose (not a signal, a stall, a storage failure or a dropped ssh session)."""
    return 0 < code < 128 and code not in (EXIT_STALLED, EXIT_STORAGE)


def repeated(failure: Failure, step: Optional[int], before: list["Restart"]) -> bool:
    """Whether this failure is the previous try's again from the same step, so the restart got no further
    (pure). A plain exit repeats when its error line does (an exit 1 is anything); a death by signal, a stall or
    a storage failure when its code does; a rank taken away from outside (:data:`SIGNALS_TAKEN_AWAY`, a dropped
    ssh session) never counts, as another try may be left alone."""
    if not before or before[-1].resume_step != step:
        return False
    last = before[-1]
    if _plain(failure.code):
        return bool(failure.error) and last.error == failure.error
    taken_away = failure.code == 255 or (signal_of(failure.code) in SIGNALS_TAKEN_AWAY
                                         and not failure.cause.startswith(MEMORY_CAUSE))
    return not taken_away and last.code == failure.code and last.cause == failure.cause


@dataclass(frozen=True)
class Decision:
    """What to do after a failed try: relaunch or stop, the failure as finally judged, and the one line that
    says so when stopping."""

    restart: bool
    failure: Failure
    message: str = ""


def decide(failure: Failure, step: Optional[int], before: list["Restart"], max_restarts: int) -> Decision:
    """Whether to relaunch after ``failure``, the next try resuming from ``step`` (None: from the start), after
    the restarts ``before`` (pure)."""
    where = f" on rank {failure.rank}" if failure.rank is not None else ""
    if not failure.restartable:
        return Decision(False, failure, f"the job failed: {failure.cause}{where}; never restarted")
    if repeated(failure, step, before):
        what = "error" if _plain(failure.code) else "failure"
        detail = failure.error if _plain(failure.code) else signal_name(failure.code)
        at = f"step {step}" if step is not None else "the start (no checkpoint)"
        stopped = Failure(failure.code, failure.rank, f"{failure.cause}, the same {what} twice from the same step "
                          f"({detail})", False, failure.error)
        hint = HINTS.get(signal_name(failure.code)) if not _plain(failure.code) else None
        return Decision(False, stopped, f"the job failed: {failure.cause}{where} again from {at}, no progress "
                        f"since the last restart; stopped after {len(before)} of fault.max_restarts={max_restarts} "
                        f"restarts ({detail}){f': {hint}' if hint else ''}")
    if len(before) >= max_restarts:
        return Decision(False, failure, f"the job failed: {failure.cause}{where}; fault.max_restarts="
                        f"{max_restarts} used up")
    return Decision(True, failure)


def rank_codes(output: str) -> list[int]:
    """The exit codes of the ranks that failed on their own, as horovodrun reported them in ``output`` (pure).

    Once a rank fails, horovodrun says so and terminates the rest (SIGTERM, 143): their codes, printed after
    that line, are the launcher's doing and would otherwise outrank the code of the failure that caused them."""
    cut = TERMINATING.search(output)
    return [int(c) for _, c in FAILED.findall(output[:cut.start()] if cut else output)]


def worst_code(codes: Sequence[int], fallback: int = 0) -> int:
    """The exit code of a job from its ranks' codes: the worst one, a signal (negative) counting as 128 + its
    number; ``fallback`` (the launcher's own code) when no rank failed (pure)."""
    normalized = [128 - c if c < 0 else c for c in codes if c != 0]
    return max(normalized) if normalized else fallback


def backoff(attempt: int, base: float = 10.0, cap: float = 300.0) -> float:
    """Seconds to wait before restart ``attempt`` (1-based): doubling from ``base``, at most ``cap``."""
    return min(cap, base * 2 ** (attempt - 1))


@dataclass
class Restart:
    """One relaunch: why, and where the job went on from."""

    attempt: int
    code: int
    rank: Optional[int]
    cause: str
    resume_step: Optional[int]  # the newest valid checkpoint's step when relaunching (None: from the start)
    waited_seconds: float
    error: str = ""


@dataclass
class Outcome:
    code: int  # the last try's exit code
    restarts: list[Restart] = field(default_factory=list)
    failure: Optional[Failure] = None  # why the last try failed, when it did


def run_with_restarts(run_once: Callable[[Mapping[str, str]], tuple[int, str]], max_restarts: int,
                      resume_step: Callable[[], Optional[int]] = lambda: None,
                      sleep: Callable[[float], None] = time.sleep,
                      wait: Callable[[int], float] = backoff) -> Outcome:
    """Run a job, relaunching it after restartable failures up to ``max_restarts`` times.

    ``run_once(env)`` runs one try with ``env`` added to its environment and
    returns (exit code, the tail of its output); ``resume_step()`` reads the
    step the next try will resume from (for the log).
    """
    outcome = Outcome(code=0)
    while True:
        env = {RESTARTS_ENV: json.dumps([asdict(r) for r in outcome.restarts])} if outcome.restarts else {}
        code, output = run_once(env)
        outcome.code = code
        if code == 0:
            outcome.failure = None
            return outcome
        attempt = len(outcome.restarts) + 1
        step = resume_step()
        decision = decide(classify(code, output), step, outcome.restarts, max_restarts)
        failure = outcome.failure = decision.failure
        if not decision.restart:
            log.error("%s", decision.message)
            return outcome
        delay = wait(attempt)
        log.warning("restart %d/%d in %.0fs after %s%s: resuming from %s", attempt, max_restarts, delay,
                    failure.cause, f" on rank {failure.rank}" if failure.rank is not None else "",
                    f"step {step} (the newest valid checkpoint)" if step is not None else "the start (no checkpoint)")
        sleep(delay)
        outcome.restarts.append(Restart(attempt, failure.code, failure.rank, failure.cause, step, delay,
                                        failure.error))


def restarts_from_env(env: Mapping[str, str] = os.environ) -> list[dict]:
    """The restarts before this try, as the supervisor passed them (empty on the first try)."""
    try:
        value = json.loads(env.get(RESTARTS_ENV, "[]"))
    except ValueError:
        return []
    return value if isinstance(value, list) else []
