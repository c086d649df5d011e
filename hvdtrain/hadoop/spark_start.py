"""Starting a Spark driver on YARN past Spark's own start-up race in its web UI.

In client mode the YARN ApplicationMaster, once registered, tells the driver to add its proxy filter
(``AddWebUIFilter``, handled on an RPC thread: ``YarnSchedulerBackend.addWebUIFilter``) while the driver's main
thread is still starting the UI's handlers (``SparkUI.attachAllHandlers``, run once the application is up since
SPARK-36237). When the two meet, Jetty's ``ServletHandler.initialize`` iterates the filters being added and the
SparkContext fails with ``java.util.ConcurrentModificationException`` before any job ran (seen once with Spark 4.0.5, in
the scoring job of a full run of the hadoop test tier). Nothing was read or written then, so
:func:`start` builds the context once more, after saying why, instead of failing the whole submission. The
failed try's SparkContext stopped itself, which ends its YARN application; the retry submits a new one.
"""
from __future__ import annotations

import sys
from typing import IO, Callable, Optional, TypeVar

T = TypeVar("T")

# What the failed start's Java stack trace holds (py4j puts it in the Python exception's text).
UI_RACE_MARKERS = ("java.util.ConcurrentModificationException", "attachAllHandlers")
ATTEMPTS = 2


def is_ui_start_race(exc: BaseException) -> bool:
    """Whether a failed SparkContext start is the web UI's start-up race (pure)."""
    text = str(exc)
    return all(marker in text for marker in UI_RACE_MARKERS)


def start(create: Callable[[], T], attempts: int = ATTEMPTS, err: Optional[IO[str]] = None) -> T:
    """``create()`` (a SparkSession or SparkContext builder's ``getOrCreate``), tried again up to ``attempts``
    times in all when it fails by the UI start-up race; any other failure, or the race on the last try, is
    raised as it came."""
    for attempt in range(1, attempts + 1):
        try:
            return create()
        except Exception as exc:  # py4j's Py4JJavaError, whose text carries the Java stack trace
            if attempt >= attempts or not is_ui_start_race(exc):
                raise
            print(f"hvdtrain: the Spark driver failed to start by Spark's web UI start-up race "
                  f"(java.util.ConcurrentModificationException in SparkUI.attachAllHandlers); nothing ran, "
                  f"starting it again (try {attempt + 1} of {attempts})", file=err or sys.stderr, flush=True)
    raise AssertionError("unreachable")  # the loop returns or raises
