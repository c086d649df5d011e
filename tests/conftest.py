"""Test tiers, registered as markers.

- unit (no marker): fast, no Spark, no horovodrun.
- spark: a local SparkSession with an embedded Hive (Derby) metastore.
- multiprocess: runs under `horovodrun -np 2 -H localhost:2 --gloo` and checks ranks agree (8 ranks once).
  A missing or broken horovodrun FAILS these tests; HVDTRAIN_SKIP_MULTIPROCESS=1 skips them (and multihost).
- multihost: `horovodrun -np 4 -H 127.0.0.2:2,127.0.0.3:2 -p PORT` over a throwaway sshd that
  scripts/test_sshd.sh starts as root (installing openssh-server if missing) and always stops; skipped,
  with the reason, where it cannot start (not root, no sshd and no apt-get).
- e2e: the whole pipeline, ETL to MLflow.
- hadoop: a real one-machine Hadoop (HDFS + YARN) that tests/hadoop/conftest.py starts once per session with
  `hvdtrain cluster` (Apache Hadoop's minicluster; Maven fetches it on first use) and always stops. Skipped, with
  the reason, only where java/javac/mvn are missing, and never when CI=true (there a missing tool fails).
- horovod_upstream: Horovod v0.28.1's own test_tensorflow.py / test_tensorflow2_keras.py (and their
  Keras 3 ports) under horovodrun against this project's Horovod build; the files come from
  ../shared/horovod-upstream-tests or HVDTRAIN_HOROVOD_TESTS, and a missing folder fails.

Markers are registered in pytest.ini (--strict-markers). `make test` runs every tier
that can run here. Select with -m, e.g. -m "not e2e".
"""
from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from tests.support import mp
from yarn.packaging import PACK_CACHE_ENV

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# A suite started as a background job by a shell without job control (`make test &` in a script, a CI runner's
# shell) begins with SIGINT ignored, and every process it starts inherits that: a launcher the tests press Ctrl-C on ignored it and trained
# on (exit 0, or no exit within the test's wait). Processes started by one with a Python handler begin with the
# default action instead, as under a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    no_java = shutil.which("java") is None
    no_hadoop = [tool for tool in ("java", "javac", "mvn") if shutil.which(tool) is None]
    in_ci = os.environ.get("CI", "").lower() == "true"
    skip_mp = os.environ.get(mp.SKIP_ENV) == "1"
    for item in items:
        if skip_mp and ("multiprocess" in item.keywords or "multihost" in item.keywords):
            item.add_marker(pytest.mark.skip(reason=f"{mp.SKIP_ENV}=1 asks to skip the multiprocess tiers"))
        if item.get_closest_marker("hadoop") and no_hadoop and not in_ci:
            item.add_marker(pytest.mark.skip(reason=f"the Hadoop minicluster needs {', '.join(no_hadoop)} on PATH "
                                                    "(a JDK 17 and Maven)"))
        if no_java and ("spark" in item.keywords or "e2e" in item.keywords):
            item.add_marker(pytest.mark.skip(reason="Spark needs Java 17 on PATH"))


@pytest.fixture(scope="session")
def ssh_hosts() -> Iterator[mp.SshHosts]:
    """A throwaway sshd on 127.0.0.2 and 127.0.0.3 for the whole session, always stopped afterwards."""
    reason = mp.cannot_start_sshd()
    if reason:
        pytest.skip(reason)
    mp.horovodrun()
    folder = Path(tempfile.mkdtemp(prefix="hvdtrain-sshd-"))
    try:
        yield mp.start_sshd(folder)
    finally:
        mp.stop_sshd(folder)
        shutil.rmtree(folder, ignore_errors=True)


_MLFLOW_URI_AT_START = os.environ.get("MLFLOW_TRACKING_URI")
# Set only inside a hadoop-tier test (tests/hadoop/conftest.py); one left behind turns every later Spark session
# and subprocess onto the minicluster's HDFS.
_CLUSTER_ENV = ("HADOOP_CONF_DIR", "HVDTRAIN_CLUSTER_HOME", PACK_CACHE_ENV)
_CLUSTER_ENV_AT_START = {k: os.environ.get(k) for k in _CLUSTER_ENV}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    """After the test's fixtures are torn down.

    ``mlflow.set_tracking_uri`` also sets $MLFLOW_TRACKING_URI in this process: a test that calls it (directly,
    or through hvdtrain.observe.tracking in-process) must not point later tests' default store at its temporary one.
    No cluster setting may outlive the test that set it."""
    yield
    if _MLFLOW_URI_AT_START is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = _MLFLOW_URI_AT_START
    leaked = {k: os.environ.get(k) for k in _CLUSTER_ENV if os.environ.get(k) != _CLUSTER_ENV_AT_START[k]}
    if leaked:
        raise AssertionError(f"{item.nodeid} left {leaked} in the environment: later tests would run against its "
                             "cluster; restore it in the test's fixture")


_TIER_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    tier = report.nodeid.split("/")[1] if report.nodeid.startswith("tests/") and report.nodeid.count("/") > 1 else "?"
    _TIER_SECONDS[tier] = _TIER_SECONDS.get(tier, 0.0) + report.duration


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Where the suite's time goes, by tier folder (setup + call + teardown): the suite's budget is 30 minutes."""
    if _TIER_SECONDS:
        tiers = sorted(_TIER_SECONDS.items(), key=lambda kv: -kv[1])
        terminalreporter.write_line("time by tier: " + ", ".join(f"{t} {s:.0f}s" for t, s in tiers)
                                    + f"; total {sum(_TIER_SECONDS.values()):.0f}s")


@pytest.fixture
def server(tmp_path):
    """A loopback WebHDFS server (tests/support/webhdfs_server.py) over a fresh folder: the `webhdfs://` tests' NameNode."""
    from tests.support.webhdfs_server import WebHdfsServer

    root = tmp_path / "namenode"
    root.mkdir()
    with WebHdfsServer(str(root)) as s:
        yield s
