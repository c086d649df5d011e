"""Deterministic failures are not restarted (#28 item 13): code errors, corrupt data, the same error twice."""
from __future__ import annotations

import pytest

from hvdtrain.runtime import supervise

IMPORT = ("Traceback (most recent call last):\nModuleNotFoundError: No module named 'hvdtrain_plugins'\n"
          "Process 0 exit with status code 1.\nProcess name: 0\nExit code: 1\n")
LOSS = ("tensorflow.python.framework.errors_impl.DataLossError: corrupted record at 1024\n"
        "Process name: 1\nExit code: 1\n")
OOM = "RuntimeError: CUDA out of memory at step 120\nProcess name: 0\nExit code: 1\n"


@pytest.mark.parametrize("output, cause", [(IMPORT, "an import or code error (exit 1)"),
                                           (LOSS, "corrupt data (DataLossError) (exit 1)")])
def test_code_and_corrupt_data_failures_are_never_restarted(output, cause):
    failure = supervise.classify(1, output)
    assert (failure.restartable, failure.cause) == (False, cause)
    outcome = supervise.run_with_restarts(lambda env: (1, output), 5, sleep=lambda s: None)
    assert not outcome.restarts


def test_the_same_error_twice_from_the_same_step_stops_the_restarts():
    slept = []
    outcome = supervise.run_with_restarts(lambda env: (1, OOM), 5, resume_step=lambda: 120, sleep=slept.append,
                                          wait=lambda a: 1.0)
    assert len(outcome.restarts) == 1 and slept == [1.0]  # one retry: it might have been transient
    assert not outcome.failure.restartable and "the same error twice from the same step" in outcome.failure.cause
    steps = iter([100, 140, 180])  # progress between the failures: each try got further, keep going
    outcome = supervise.run_with_restarts(lambda env: (1, OOM), 2, resume_step=lambda: next(steps),
                                          sleep=lambda s: None)
    assert len(outcome.restarts) == 2


# -- no progress since the last restart (#54 item 9) ------------------------------------------------------------

def _rank_died(code: int, rank: int = 1) -> str:
    return f"Process {rank} exit with status code {code}.\nProcess name: {rank}\nExit code: {code}\n"


@pytest.mark.parametrize("code, output", [(1, _rank_died(-9)), (1, _rank_died(75)), (74, ""),
                                          (1, _rank_died(-11))])
def test_the_same_death_at_the_same_step_stops_the_restarts_with_one_line(code, output, caplog):
    """A SIGKILL (the OOM killer), a stall (75), a storage failure (74) or a crash twice from the same checkpoint
    step: the relaunch gained nothing, so the next one would not either; today's policy retries to the limit."""
    tries = []
    outcome = supervise.run_with_restarts(lambda env: tries.append(env) or (code, output), 5,
                                          resume_step=lambda: 120, sleep=lambda s: None)
    assert len(outcome.restarts) == 1 and len(tries) == 2
    assert not outcome.failure.restartable and "twice from the same step" in outcome.failure.cause
    stop = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(stop) == 1 and "\n" not in stop[0]
    assert "step 120" in stop[0] and "1 of fault.max_restarts=5" in stop[0] and "no progress" in stop[0]


def test_a_death_that_repeats_after_progress_is_restarted_to_the_limit():
    steps = iter([100, 140, 180, 220])
    outcome = supervise.run_with_restarts(lambda env: (1, _rank_died(-9)), 3, resume_step=lambda: next(steps),
                                          sleep=lambda s: None)
    assert len(outcome.restarts) == 3 and outcome.failure.restartable  # stopped by the limit, not for no progress


def test_a_scheduler_sigterm_is_retried_even_at_the_same_step_but_sigill_never():
    outcome = supervise.run_with_restarts(lambda env: (1, _rank_died(-15)), 3, resume_step=lambda: 120,
                                          sleep=lambda s: None)
    assert len(outcome.restarts) == 3  # preemption is not the job's doing: another try may be left alone
    memory = _rank_died(143) + "Container killed on request: is running beyond physical memory limits\n"
    outcome = supervise.run_with_restarts(lambda env: (1, memory), 3, resume_step=lambda: 120, sleep=lambda s: None)
    assert len(outcome.restarts) == 1  # a SIGTERM for memory is the OOM killer's again
    outcome = supervise.run_with_restarts(lambda env: (1, _rank_died(-4)), 3, sleep=lambda s: None)
    assert not outcome.restarts and "SIGILL" in outcome.failure.cause


def test_decide_is_a_pure_policy():
    killed = supervise.classify(1, _rank_died(-9))
    before = [supervise.Restart(1, killed.code, 1, killed.cause, 120, 0.0, killed.error)]
    go = supervise.decide(killed, 160, before, max_restarts=5)
    assert go.restart and go.failure == killed
    stop = supervise.decide(killed, 120, before, max_restarts=5)
    assert not stop.restart and not stop.failure.restartable and "SIGKILL" in stop.message
    assert not supervise.decide(killed, 160, before * 5, max_restarts=5).restart  # the limit
