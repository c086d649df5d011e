"""hvdtrain.hadoop.spark_start: a driver whose start failed by Spark's web UI race starts once more, and only then.

The failures are injected (the race itself cannot be provoked on demand): the text is the Java stack trace py4j
carried in the scoring job's failure on the minicluster, shortened."""
from __future__ import annotations

import io

import pytest

from hvdtrain.hadoop import spark_start
from yarn import submit

RACE = ("An error occurred while calling None.org.apache.spark.api.java.JavaSparkContext.\n"
        ": java.util.ConcurrentModificationException\n"
        "\tat java.base/java.util.ArrayList$ArrayListSpliterator.forEachRemaining(ArrayList.java:1631)\n"
        "\tat org.sparkproject.jetty.servlet.ServletHandler.initialize(ServletHandler.java:749)\n"
        "\tat org.apache.spark.ui.WebUI.$anonfun$attachAllHandlers$1(WebUI.scala:170)\n"
        "\tat org.apache.spark.SparkContext.<init>(SparkContext.scala:707)\n")
OTHER = ("An error occurred while calling None.org.apache.spark.api.java.JavaSparkContext.\n"
         ": org.apache.spark.SparkException: Application application_1_2 failed 1 times due to AM Container\n")


class Flaky:
    """Fails its first calls with the given texts, then returns a context."""

    def __init__(self, *failures: str):
        self.failures, self.calls = list(failures), 0

    def __call__(self) -> str:
        self.calls += 1
        if self.failures:
            raise RuntimeError(self.failures.pop(0))
        return "context"


def test_the_ui_race_is_started_again_once_and_says_why() -> None:
    create, err = Flaky(RACE), io.StringIO()
    assert spark_start.start(create, err=err) == "context"
    assert create.calls == 2
    assert "web UI start-up race" in err.getvalue() and "try 2 of 2" in err.getvalue()


def test_any_other_failure_and_a_second_race_are_raised_as_they_came() -> None:
    create = Flaky(OTHER)
    with pytest.raises(RuntimeError, match="AM Container"):
        spark_start.start(create, err=io.StringIO())
    assert create.calls == 1
    create = Flaky(RACE, RACE)
    with pytest.raises(RuntimeError, match="ConcurrentModificationException"):
        spark_start.start(create, err=io.StringIO())
    assert create.calls == 2
    assert not spark_start.is_ui_start_race(RuntimeError("java.util.ConcurrentModificationException elsewhere"))


def test_the_submission_follows_the_application_the_driver_submitted_last() -> None:
    first = "INFO Client: Submitted application application_1700000000000_0042\n"
    report = "INFO Client: Application report for application_1700000000000_0042 (state: RUNNING)\n"
    again = "INFO Client: Submitted application application_1700000000000_0043\n"
    app = None
    for line in (first, report, "INFO staging .sparkStaging/application_1700000000000_0042\n", again, report):
        app = submit.parse_app_id(line, app)
    assert app == "application_1700000000000_0043"
    assert submit.parse_app_id(report) == "application_1700000000000_0042"  # nothing known yet: the first seen
