"""Automatic restart: which failures relaunch the job, and the relaunch loop (launcher faked, policy real)."""
from __future__ import annotations

import json

import pytest

from hvdtrain.runtime import supervise

KILLED = ("Process 1 exit with status code -9.\nTerminating remaining workers after failure of Process 1.\n"
          "Process 0 exit with status code 143.\nhorovodrun: ... to do so was:\nProcess name: 1\nExit code: -9\n")
STALLED = "Process 0 exit with status code 75.\nProcess name: 0\nExit code: 75\n"
CONFIG = ("Process 0 exit with status code 2.\nProcess 1 exit with status code 2.\nProcess name: 0\n"
          "Exit code: 2\n")
DATA_AFTER_KILL = "Process 1 exit with status code 3.\nProcess name: 0\nExit code: -15\n"


@pytest.mark.parametrize("code, output, rank, restartable, cause", [
    (1, KILLED, 1, True, "a lost rank (killed by signal 9)"),
    (1, STALLED, 0, True, "a stalled rank (watchdog, exit 75)"),
    (74, "", None, True, "storage failed after retries (exit 74)"),  # one process, no horovodrun
    (1, CONFIG, 0, False, "a config error (exit 2)"),
    (1, DATA_AFTER_KILL, 1, False, "a data error (exit 3)"),  # a user mistake anywhere is never restarted
    (4, "", None, False, "an environment problem (exit 4)"),
    (1, "Process name: 1\nExit code: 255\n", 1, True, "a lost rank (ssh connection to its host dropped, exit 255)"),
    (1, "", None, True, "a rank failure (exit 1)"),
])
def test_classify(code, output, rank, restartable, cause) -> None:
    failure = supervise.classify(code, output)
    assert (failure.rank, failure.restartable, failure.cause) == (rank, restartable, cause)


def test_backoff_doubles_up_to_a_cap() -> None:
    assert [supervise.backoff(a, 10.0, 60.0) for a in (1, 2, 3, 4, 5)] == [10.0, 20.0, 40.0, 60.0, 60.0]


class Tries:
    """A launcher that fails with the given (code, output) pairs, then succeeds; records what it was given."""

    def __init__(self, *failures: tuple[int, str]):
        self.failures, self.envs = list(failures), []

    def __call__(self, env):
        self.envs.append(dict(env))
        return self.failures.pop(0) if self.failures else (0, "")


def test_restartable_failures_relaunch_with_backoff_and_tell_the_job_its_restarts() -> None:
    tries, slept = Tries((1, KILLED), (1, STALLED)), []
    outcome = supervise.run_with_restarts(tries, 5, resume_step=lambda: 40, sleep=slept.append,
                                          wait=lambda a: supervise.backoff(a, 1.0))
    assert outcome.code == 0 and outcome.failure is None and slept == [1.0, 2.0]
    assert [(r.attempt, r.rank, r.cause, r.resume_step) for r in outcome.restarts] == [
        (1, 1, "a lost rank (killed by signal 9)", 40), (2, 0, "a stalled rank (watchdog, exit 75)", 40)]
    assert tries.envs[0] == {}  # the first try is not a restart
    told = json.loads(tries.envs[2][supervise.RESTARTS_ENV])
    assert [r["cause"] for r in told] == [r.cause for r in outcome.restarts]
    assert supervise.restarts_from_env(tries.envs[2]) == told


def test_a_config_error_fails_at_once_and_restarts_stop_at_the_limit() -> None:
    tries = Tries((1, CONFIG))
    outcome = supervise.run_with_restarts(tries, 5, sleep=lambda s: None)
    assert outcome.code == 1 and not outcome.restarts and len(tries.envs) == 1
    assert outcome.failure.cause == "a config error (exit 2)"
    tries, steps = Tries(*[(1, KILLED)] * 4), iter([10, 20, 30])  # progress each time: only the limit stops it
    outcome = supervise.run_with_restarts(tries, 2, resume_step=lambda: next(steps), sleep=lambda s: None)
    assert outcome.code == 1 and len(outcome.restarts) == 2 and len(tries.envs) == 3


def test_train_flags_are_config_overrides(tmp_path) -> None:
    from hvdtrain import cli
    from hvdtrain.core import config

    args = cli.build_parser().parse_args(["train", "c.yaml", "--max-restarts", "3", "--principal", "ml@EX.COM",
                                          "--keytab", "ml.keytab"])
    overrides = cli.train_flag_overrides(args, str(tmp_path))
    assert overrides == ["fault.max_restarts=3", 'yarn.principal="ml@EX.COM"', f'yarn.keytab="{tmp_path}/ml.keytab"']
    data = {"source": {"table": "a.b"}}
    for item in overrides:
        config.apply_override(data, item)
    cfg = config.from_dict(data)
    assert (cfg.fault.max_restarts, cfg.yarn.principal, cfg.yarn.keytab) == (3, "ml@EX.COM", f"{tmp_path}/ml.keytab")
