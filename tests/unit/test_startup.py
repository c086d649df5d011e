"""hvdtrain.runtime.startup: where a rank's time to its first step went (pure parts, and the first-step hook)."""
from __future__ import annotations

import time

from hvdtrain.observe.events import StepInfo
from hvdtrain.runtime import startup
from hvdtrain.training.hooks import FirstStep

PHASES = ["interpreter and imports", "rendezvous", "data plan", "tracking", "model build", "first step"]


def test_phases_are_the_gaps_between_marks_from_the_launcher_on() -> None:
    clock = startup.Clock(process_start=100.0, launcher_start=99.5)
    for name, at in zip(PHASES, (103.0, 103.2, 103.3, 105.5, 106.0, 108.5)):
        clock.mark(name, at)
    assert clock.breakdown() == {"launcher": 0.5, "interpreter and imports": 3.0, "rendezvous": 0.2,
                                 "data plan": 0.1, "tracking": 2.2, "model build": 0.5, "first step": 2.5,
                                 "total": 9.0}
    assert startup.describe(clock.breakdown()) == (
        "9.0 s to the first step (launcher 0.5 s, interpreter and imports 3.0 s, rendezvous 0.2 s, data plan "
        "0.1 s, tracking 2.2 s, model build 0.5 s, first step 2.5 s)")


def test_without_a_launcher_or_with_a_later_one_the_clock_starts_with_the_process() -> None:
    for launcher in (None, 100.5):  # 100.5: another try's or another host's clock, after this process started
        clock = startup.Clock(process_start=100.0, launcher_start=launcher)
        clock.mark("interpreter and imports", 103.0)
        assert clock.breakdown() == {"interpreter and imports": 3.0, "total": 3.0}


def test_a_phase_marked_twice_keeps_its_first_end() -> None:
    clock = startup.Clock(process_start=0.0, launcher_start=None)
    clock.mark("first step", 2.0)
    clock.mark("first step", 50.0)  # a second call of the loop, an elastic reset
    assert clock.breakdown() == {"first step": 2.0, "total": 2.0}


def test_the_launchers_time_is_read_from_the_environment() -> None:
    assert startup.launched_at({startup.LAUNCHED_AT_ENV: "1795663000.25"}) == 1795663000.25
    assert startup.launched_at({}) is None
    assert startup.launched_at({startup.LAUNCHED_AT_ENV: "soon"}) is None


def test_the_first_step_hook_fires_once() -> None:
    calls = []
    hook = FirstStep(lambda: calls.append(1))
    for step in (1, 2, 3):
        hook.on_step(StepInfo(epoch=1, step=step, global_step=step, data_seconds=0.0, loss_sum=0.0, examples=8))
    assert calls == [1]


def test_a_process_knows_when_it_started_to_the_clock_tick() -> None:
    """Between the parent's clock just before it started the child and the child's clock when it asked (psutil's
    create_time, with the boot time in whole seconds, is up to a second early)."""
    import subprocess
    import sys

    before = time.time()
    out = subprocess.run([sys.executable, "-c", "import time; from hvdtrain.runtime import startup; "
                          "print(startup.process_start(), time.time())"], capture_output=True, text=True, check=True)
    started, asked = map(float, out.stdout.split())
    assert before - 0.02 <= started <= asked, (before, started, asked)


def test_a_jobs_first_try_times_its_ranks_from_the_command_and_a_relaunch_from_its_own_start() -> None:
    assert startup.try_clock(True, 1000.0, 1090.5) == {startup.LAUNCHED_AT_ENV: "1000.000"}  # e.g. spark-submit, AM
    assert startup.try_clock(False, 1000.0, 1200.25) == {startup.LAUNCHED_AT_ENV: "1200.250"}  # a relaunch
    assert startup.try_clock(True, None, 1090.5) == {startup.LAUNCHED_AT_ENV: "1090.500"}  # a driver not given it
