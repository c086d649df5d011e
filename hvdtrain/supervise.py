"""Automatic restart: relaunch a failed training job, which resumes from its newest valid checkpoint.

A week-long job on a shared cluster loses ranks (preempted containers, a host
that reboots), stalls (the watchdog ends a rank with exit 75) and meets storage
that fails after retries (exit 74). ``fault.max_restarts`` (``--max-restarts``)
relaunches the job up to K times; every relaunch resumes from the newest valid
checkpoint (``checkpoint.resume: auto``) in the same MLflow run. A config,
data or environment error never restarts: the same input fails the same way.

:func:`classify` decides from the job's exit code and output (pure);
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
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Mapping, Optional, Sequence

log = logging.getLogger("hvdtrain.supervise")

RESTARTS_ENV = "HVDTRAIN_RESTARTS"  # JSON list of the restarts before this try (cause, rank, code, step)
EXIT_STALLED = 75  # the watchdog ended a stalled rank (EX_TEMPFAIL)
EXIT_STORAGE = 74  # storage failed after retries (EX_IOERR)
# Exit codes of mistakes a relaunch cannot fix (hvdtrain.errors): usage/config, data, environment; Ctrl-C.
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
    if code < 0 or code > 128:
        signal = -code if code < 0 else code - 128
        return f"a lost rank (killed by signal {signal})"
    return f"a rank failure (exit {code})"


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
    return Failure(decisive, rank, describe_code(decisive), decisive not in NO_RESTART, error)


def repeated(failure: Failure, step: Optional[int], before: list["Restart"]) -> bool:
    """Whether this failure is the previous try's again: same error line, resumed from the same step (pure)."""
    plain = 0 < failure.code < 128 and failure.code not in (EXIT_STALLED, EXIT_STORAGE)  # not a lost rank
    return plain and bool(before) and bool(failure.error) and before[-1].error == failure.error and \
        before[-1].resume_step == step


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
        failure = outcome.failure = classify(code, output)
        attempt = len(outcome.restarts) + 1
        step = resume_step()
        if failure.restartable and repeated(failure, step, outcome.restarts):
            failure = outcome.failure = Failure(failure.code, failure.rank, f"{failure.cause}, the same error twice "
                                                f"from the same step ({failure.error})", False, failure.error)
        if not failure.restartable or attempt > max_restarts:
            why = "never restarted" if not failure.restartable else f"fault.max_restarts={max_restarts} used up"
            log.error("the job failed: %s%s; %s", failure.cause,
                      f" on rank {failure.rank}" if failure.rank is not None else "", why)
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
