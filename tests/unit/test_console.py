"""The launcher's terminal: horovodrun's lines tidied, rank 0's progress drawn, errors last (no horovodrun here)."""
from __future__ import annotations

import io
import json
import sys

import pytest

from hvdtrain.core import errors
from hvdtrain.observe import console, progress

# What horovodrun relays from a failing 2-rank job, as recorded from `hvdtrain train --np 2`.
EVENT = console.EVENT_MARK + json.dumps({"event": "error", "code": 3, "message": "no dataset at /d", "notes": []})
FAILING_RUN = [
    ("stderr", "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"),
    ("stderr", "[0]<stderr>:16:14:18 [rank 0] INFO world size 2 (horovod) on vm"),
    ("stderr", "[1]<stderr>:Traceback (most recent call last):"),
    ("stderr", "[1]<stderr>:16:14:19 [rank 1] WARNING something odd"),
    ("stdout", "[1]<stdout>:" + EVENT),
    ("stdout", "Process 1 exit with status code 3."),
    ("stderr", "[0]<stderr>:HorovodInternalError: broken collective"),
    ("stderr", "[1]<stderr>:rank 1's last words"),
    ("stderr", "Traceback (most recent call last):"),
    ("stderr", "RuntimeError: Horovod detected that one or more processes exited with non-zero status"),
]


def test_parse_line_splits_horovodruns_prefix_and_decodes_events() -> None:
    line = console.parse_line("[1]<stdout>:hello [0]<stderr>:", "stderr")
    assert (line.rank, line.stream, line.text, line.event) == (1, "stdout", "hello [0]<stderr>:", None)
    own = console.parse_line("Process 1 exit with status code 75.", "stdout")
    assert own.rank is None and console.rank_exit(own) == (1, 75)
    assert console.rank_exit(console.parse_line("[0]<stdout>:Process 1 exit with status code 75.", "stdout")) is None
    event = console.parse_line("[0]<stdout>:" + console.EVENT_MARK + '{"event": "progress", "step": 3}', "stdout")
    assert event.event == {"event": "progress", "step": 3} and event.rank == 0
    broken = console.parse_line(console.EVENT_MARK + "{not json", "stdout")
    assert broken.event is None and console.display(broken, tty=True) == broken.text


@pytest.mark.parametrize("raw,tty,shown", [
    ("[0]<stderr>:12:00 [rank 0] INFO epoch 1/3", True, "12:00 [rank 0] INFO epoch 1/3"),
    ("[1]<stderr>:12:00 [rank 1] WARNING slow", True, "12:00 [rank 1] WARNING slow"),  # labelled once
    ("[1]<stderr>:Traceback (most recent call last):", True, "[rank 1] Traceback (most recent call last):"),
    ("[12]<stdout>:x", True, "[rank 12] x"),
    ("Process 1 exit with status code 3.", True, "Process 1 exit with status code 3."),
    ("[1]<stderr>:Traceback (most recent call last):", False, "[1]<stderr>:Traceback (most recent call last):"),
    ("[0]<stderr>:" + console.NOISE[0], True, None),
    ("[0]<stderr>:" + console.NOISE[0], False, "[0]<stderr>:" + console.NOISE[0]),
    ("[0]<stdout>:" + EVENT, False, None),
])
def test_display_strips_prefixes_and_labels_other_ranks_on_a_terminal_only(raw: str, tty: bool, shown) -> None:
    assert console.display(console.parse_line(raw, "stderr"), tty) == shown


def _feed(view: console.View, lines) -> console.Outcome:
    for stream, raw in lines:
        view.feed(console.parse_line(raw, stream))
    view.close()
    return view.outcome


def test_after_a_reported_error_only_the_reporting_rank_still_speaks() -> None:
    out, err = io.StringIO(), io.StringIO()
    outcome = _feed(console.View(tty=True, out=out, err=err), FAILING_RUN)
    assert outcome.error["code"] == 3 and outcome.rank_exit == (1, 3)
    assert err.getvalue().splitlines() == [
        "16:14:18 [rank 0] INFO world size 2 (horovod) on vm", "[rank 1] Traceback (most recent call last):",
        "16:14:19 [rank 1] WARNING something odd", "[rank 1] rank 1's last words"]
    assert out.getvalue() == ""  # horovodrun's "Process 1 exit ..." came after the error: its echo
    exc = console.failure(outcome, "training")
    assert isinstance(exc, errors.StepFailed) and exc.exit_code == 3 and str(exc) == "no dataset at /d"


def test_off_a_terminal_lines_pass_unchanged_until_the_error() -> None:
    out, err = io.StringIO(), io.StringIO()
    _feed(console.View(tty=False, out=out, err=err), FAILING_RUN[:4])
    assert err.getvalue().splitlines() == [raw for _, raw in FAILING_RUN[:4]]


@pytest.mark.parametrize("outcome,code,says", [
    (console.Outcome(1, rank_exit=(1, 75)), 75, "training failed: rank 1 exited with code 75 (a rank stalled)"),
    (console.Outcome(1, rank_exit=(0, -9)), 5, "training failed: rank 0 exited with code -9; see the messages"),
    (console.Outcome(1), 1, "training failed with exit code 1 (unexpected failure (a bug or a crash))"),
    (console.Outcome(1, error={"event": "error", "code": 4, "message": "no java", "notes": ["Spark's own log: f"]}),
     4, "no java"),
])
def test_failure_keeps_the_kind_of_error(outcome: console.Outcome, code: int, says: str) -> None:
    exc = console.failure(outcome, "training")
    assert exc.exit_code == code and str(exc).startswith(says)


def test_print_error_puts_notes_first_and_the_error_last(capsys) -> None:
    exc = errors.DataError("source.table nope.missing does not exist")
    exc.add_note("Spark's own log: /w/logs/spark-etl.log")
    assert console.print_error(exc, "hvdtrain") == 3
    assert capsys.readouterr().err.splitlines() == ["Spark's own log: /w/logs/spark-etl.log",
                                                    "hvdtrain: error: source.table nope.missing does not exist"]


def test_a_child_of_the_launcher_reports_errors_as_events(monkeypatch, capsys) -> None:
    monkeypatch.setenv(console.CONSOLE_ENV, "pipe")
    assert console.report_error(errors.EnvironmentProblem("no java"), "etl") == 4
    captured = capsys.readouterr()
    line = console.parse_line(captured.out.strip(), "stdout")
    assert line.event == {"event": "error", "code": 4, "message": "no java", "notes": []} and captured.err == ""
    monkeypatch.delenv(console.CONSOLE_ENV)
    assert console.report_error(errors.EnvironmentProblem("no java"), "etl") == 4
    assert capsys.readouterr().err == "etl: error: no java\n"


@pytest.mark.parametrize("env,setting,tty,mode", [
    ("tty", "auto", False, "events"), ("tty", "bar", False, "events"), ("tty", "log", False, "log"),
    ("pipe", "auto", False, "log"), (None, "auto", True, "bar"), (None, "auto", False, "log"),
])
def test_rank_0_sends_progress_events_when_the_launcher_has_a_terminal(monkeypatch, env, setting, tty, mode):
    if env is None:
        monkeypatch.delenv(console.CONSOLE_ENV, raising=False)
    else:
        monkeypatch.setenv(console.CONSOLE_ENV, env)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: tty)
    assert progress.mode_for(setting, is_chief=True) == mode
    assert progress.mode_for(setting, is_chief=False) == "off"


def test_progress_events_draw_the_launchers_bar() -> None:
    sent: list[dict] = []
    rank0 = progress.Progress("events", epochs=2, steps=4, every_steps=50, every_seconds=30.0,
                              sinks=progress.Sinks(send=lambda event, **fields: sent.append({"event": event, **fields})))
    for epoch in (1, 2):
        rank0.start_epoch(epoch)
        for step in range(1, 5):
            rank0.on_step(step, 0.0, 2.0 * step, 4, 2)
        rank0.end_epoch()
    # an epoch's first step at once, then the window's figures at the epoch's end (steps are fast here)
    assert [(e["epoch"], e["step"], e["done"]) for e in sent] == [(1, 1, 0), (1, 4, 1), (2, 1, 4), (2, 4, 5)]
    assert sent[1]["loss"] == pytest.approx((4 + 6 + 8) / 12) and sent[1]["samples_per_sec"] > 0
    err = io.StringIO()
    view = console.View(tty=True, out=io.StringIO(), err=err)
    _feed(view, [("stdout", "[0]<stdout>:" + console.EVENT_MARK + json.dumps(e)) for e in sent])
    screen = err.getvalue().split("\r")[-1]
    assert screen.startswith("epoch 2/2 step 4/4 | loss 1.5000 | ") and "samples/s | 100%|" in screen
    assert "ETA 00:00" in screen
