"""Deterministic failures are not restarted (#28 item 13): code errors, corrupt data, the same error twice."""
from __future__ import annotations

import pytest

from hvdtrain import supervise

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
