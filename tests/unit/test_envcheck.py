"""`hvdtrain env check`: every failure path names what is missing and how to fix it.

The checks take the environment, `which`, a command runner and the Horovod build facts as
arguments, so these tests describe hosts with fakes instead of changing this one.
"""
from __future__ import annotations

import datetime
import re
from typing import Sequence

import pytest

from hvdtrain.hadoop import envcheck
from hvdtrain.hadoop.envcheck import Check, CommandResult, HorovodBuild

GOOD_BUILD = HorovodBuild(version="0.28.1", tensorflow=True, gloo=True, nccl=False)
PYTHON = "/venv/bin/python"


def which_of(*found: str):
    table = {name: f"/usr/bin/{name}" for name in found}
    return table.get


def runner(outputs: dict[str, CommandResult]):
    def run(cmd: Sequence[str]) -> CommandResult:
        return outputs[" ".join(cmd)]
    return run


JAVA17 = CommandResult(0, 'openjdk version "17.0.15" 2025-04-15\nOpenJDK Runtime Environment')


@pytest.mark.parametrize("text, major", [
    ('openjdk version "17.0.15" 2025-04-15', 17),
    ('java version "1.8.0_292"', 8),
    ('openjdk version "21" 2023-09-19', 21),
    ("no version here", None),
])
def test_java_version_parsing(text: str, major: int) -> None:
    assert envcheck.parse_java_major(text) == major


def test_java_missing_old_or_fine() -> None:
    missing = envcheck.check_java(which_of(), runner({}))
    assert not missing.ok and "java not found on PATH" in missing.detail and "openjdk-17" in missing.fix
    java11 = CommandResult(0, 'java version "11.0.2"')
    old = envcheck.check_java(which_of("java"), runner({"/usr/bin/java -version": java11}))
    assert not old.ok and old.detail == "Java 11 at /usr/bin/java; Spark 4 needs Java 17 or newer"
    good = envcheck.check_java(which_of("java"), runner({"/usr/bin/java -version": JAVA17}))
    assert good.ok and good.detail == "Java 17 at /usr/bin/java"


def test_spark_submit_missing_names_the_places_and_the_fix() -> None:
    c = envcheck.check_spark_submit({"SPARK_HOME": "/opt/spark"}, which_of(), PYTHON, lambda p: False)
    assert not c.ok and c.required
    assert c.detail.startswith("spark-submit not found (looked in /opt/spark/bin/spark-submit")
    assert "pip install 'pyspark" in c.fix and "SPARK_HOME" in c.fix
    ok = envcheck.check_spark_submit({}, which_of("spark-submit"), PYTHON, lambda p: p == "/usr/bin/spark-submit")
    assert ok.ok and ok.detail == "/usr/bin/spark-submit"


def test_horovod_build_facts() -> None:
    missing = envcheck.check_horovod(HorovodBuild(error="ModuleNotFoundError: No module named 'horovod'"))
    assert [(c.name, c.ok) for c in missing] == [("Horovod", False)]
    assert "No module named 'horovod'" in missing[0].detail and "make env" in missing[0].fix
    no_tf = {c.name: c for c in envcheck.check_horovod(HorovodBuild(version="0.28.1", error="ImportError: x"))}
    assert not no_tf["Horovod TensorFlow ops"].ok and "HOROVOD_WITH_TENSORFLOW=1" in no_tf["Horovod TensorFlow ops"].fix
    assert not no_tf["Horovod Gloo"].ok and "HOROVOD_WITH_GLOO=1" in no_tf["Horovod Gloo"].fix
    cpu = {c.name: c for c in envcheck.check_horovod(GOOD_BUILD)}
    assert cpu["Horovod TensorFlow ops"].ok and cpu["Horovod Gloo"].ok
    nccl = cpu["Horovod NCCL"]
    assert not nccl.ok and not nccl.required and nccl.scope == "gpu"
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in nccl.fix


def test_build_probe_output_parsing() -> None:
    out = 'noise\nHVDTRAIN_HOROVOD_BUILD {"version": "0.28.1", "tensorflow": true, "gloo": true, "nccl": false, ' \
          '"mpi": false, "cuda": false}\n'
    assert envcheck.parse_build_probe(out) == GOOD_BUILD
    broken = envcheck.parse_build_probe("Traceback ...\nSegmentation fault\n")
    assert broken.version is None and broken.error == "the build probe failed: Segmentation fault"
    probed = envcheck.probe_horovod_build("/py", run=lambda cmd: CommandResult(0, out))
    assert probed == GOOD_BUILD


def test_the_build_probe_runs_once_per_environment_fingerprint(tmp_path, monkeypatch) -> None:
    out = 'HVDTRAIN_HOROVOD_BUILD {"version": "0.28.1", "tensorflow": true, "gloo": true, "nccl": false, ' \
          '"mpi": false, "cuda": false}\n'
    calls: list[list[str]] = []

    def run(cmd):
        calls.append(list(cmd))
        return CommandResult(0, out)

    real = envcheck.build_fingerprint()  # this venv's Horovod and TensorFlow libraries, found without importing
    assert real is not None and real == envcheck.build_fingerprint() and envcheck.build_fingerprint("/py") is None
    assert envcheck.probe_horovod_build(run=run, cache_dir=str(tmp_path)) == GOOD_BUILD
    assert envcheck.probe_horovod_build(run=run, cache_dir=str(tmp_path)) == GOOD_BUILD
    assert len(calls) == 1  # the second answer came from the cache
    monkeypatch.setattr(envcheck, "build_fingerprint", lambda python=None: "another-install")
    assert envcheck.probe_horovod_build(run=run, cache_dir=str(tmp_path)) == GOOD_BUILD
    assert len(calls) == 2  # a reinstalled Horovod or TensorFlow is asked again
    broken = envcheck.probe_horovod_build(run=lambda cmd: CommandResult(1, "Segmentation fault"),
                                          cache_dir=str(tmp_path / "other"))
    assert broken.error and not (tmp_path / "other" / envcheck.BUILD_CACHE).exists()  # failures are not kept
    (tmp_path / envcheck.BUILD_CACHE).write_text("{not json")
    assert envcheck.probe_horovod_build(run=run, cache_dir=str(tmp_path)) == GOOD_BUILD and len(calls) == 3


def test_hadoop_home_and_libhdfs() -> None:
    unset = envcheck.check_hadoop_home({}, lambda p: True)
    assert not unset.ok and unset.scope == "cluster" and unset.fix.startswith("export HADOOP_HOME=")
    assert "is not a directory" in envcheck.check_hadoop_home({"HADOOP_HOME": "/nope"}, lambda p: False).detail
    env = {"HADOOP_HOME": "/opt/hadoop"}
    found = envcheck.check_libhdfs(env, lambda p: p == "/opt/hadoop/lib/native/libhdfs.so")
    assert found.ok and found.detail == "/opt/hadoop/lib/native/libhdfs.so"
    arrow = envcheck.check_libhdfs({"ARROW_LIBHDFS_DIR": "/libs", **env}, lambda p: p == "/libs/libhdfs.so")
    assert arrow.ok and arrow.detail == "/libs/libhdfs.so"
    missing = envcheck.check_libhdfs(env, lambda p: False)
    assert not missing.ok and missing.detail == "libhdfs.so not found in /opt/hadoop/lib/native"
    assert "ARROW_LIBHDFS_DIR" in missing.fix
    nothing = envcheck.check_libhdfs({}, lambda p: False)
    assert "neither ARROW_LIBHDFS_DIR nor HADOOP_HOME is set" in nothing.detail


@pytest.mark.parametrize("classpath, ok, detail", [
    (None, False, "not set; libhdfs needs the Hadoop jars on it"),
    ("/etc/hadoop/conf:/opt/hadoop/share/hadoop/common/*", False,
     "lists folder wildcards, which libhdfs (JNI) does not expand"),
    ("/opt/app/app.jar", False, "has no hadoop-*.jar"),
    ("/etc/hadoop/conf:/opt/hadoop/share/hadoop/common/hadoop-common-3.3.6.jar:/x/guava.jar", True,
     "2 jars including Hadoop's"),
])
def test_classpath(classpath, ok, detail) -> None:
    c = envcheck.check_classpath({} if classpath is None else {"CLASSPATH": classpath})
    assert (c.ok, c.detail) == (ok, detail)
    assert c.fix == ("" if ok else "export CLASSPATH=$(hadoop classpath --glob)")


def test_kerberos_ticket() -> None:
    skipped = envcheck.check_kerberos(which_of(), runner({}))
    assert skipped.ok and skipped.detail.startswith("klist not found: skipped")
    expired = envcheck.check_kerberos(which_of("klist"), runner({"/usr/bin/klist -s": CommandResult(1, "")}))
    assert not expired.ok and expired.detail == "no valid ticket (klist -s failed)" and "kinit" in expired.fix
    listing = CommandResult(0, KLIST.replace("11/24/26 02:00:00", (datetime.datetime.now() + datetime.timedelta(
        hours=7, minutes=30)).strftime("%m/%d/%y %H:%M:%S")))
    valid = envcheck.check_kerberos(which_of("klist"), runner({"/usr/bin/klist -s": CommandResult(0, ""),
                                                               "/usr/bin/klist": listing}))
    assert valid.ok and re.match(r"ml@EXAMPLE\.COM, expires in 7h (29|30)m", valid.detail), valid.detail


KLIST = """Ticket cache: FILE:/tmp/krb5cc_1000
Default principal: ml@EXAMPLE.COM

Valid starting     Expires            Service principal
11/23/26 16:00:00  11/24/26 02:00:00  krbtgt/EXAMPLE.COM@EXAMPLE.COM
	renew until 11/30/26 16:00:00
"""


def test_klist_parsing_and_when_to_renew() -> None:
    from hvdtrain.hadoop import kerberos

    ticket = kerberos.parse_klist(KLIST)
    assert ticket.principal == "ml@EXAMPLE.COM" and ticket.expires == datetime.datetime(2026, 11, 24, 2, 0)
    assert kerberos.parse_klist("klist: No credentials cache found") is None
    assert not kerberos.renew_due(ticket, datetime.datetime(2026, 11, 23, 20, 0))  # 6 h of 10 left
    assert kerberos.renew_due(ticket, datetime.datetime(2026, 11, 24, 1, 1))  # under an hour left
    short = kerberos.Ticket("a@B", datetime.datetime(2026, 1, 1, 0, 0), datetime.datetime(2026, 1, 1, 0, 30))
    assert not kerberos.renew_due(short, datetime.datetime(2026, 1, 1, 0, 19))
    assert kerberos.renew_due(short, datetime.datetime(2026, 1, 1, 0, 21))  # a third of 30 min left
    assert kerberos.renew_due(None, datetime.datetime(2026, 1, 1))


def test_the_renewer_kinits_from_the_keytab_only_when_due() -> None:
    import subprocess

    from hvdtrain.hadoop import kerberos

    calls, now, cache = [], datetime.datetime(2026, 11, 24, 1, 30), [KLIST]  # 30 min left of a 10 h ticket

    def run(cmd):  # klist reads the cache; kinit puts a ticket valid a day longer in it
        calls.append(list(cmd))
        if cmd[0] == "kinit":
            cache[0] = KLIST.replace("11/24/26 02:00:00", "11/25/26 02:00:00")
        return subprocess.CompletedProcess(cmd, 0, cache[0] if cmd[0] == "klist" else "", "")

    renewer = kerberos.Renewer("ml@EXAMPLE.COM", "/k/ml.keytab", run=run, now=lambda: now)
    renewer.check()
    assert ["kinit", "-kt", "/k/ml.keytab", "ml@EXAMPLE.COM"] in calls and renewer.renewals == 1
    calls.clear()
    renewer.check()  # the new ticket lasts another day: nothing to do
    assert calls == [["klist"]] and renewer.renewals == 1
    assert renewer.next_check() == 300.0  # a day-long ticket: the default interval


def test_a_short_ticket_is_looked_at_often_enough_to_be_renewed_in_its_last_third() -> None:
    from hvdtrain.hadoop import kerberos

    start = datetime.datetime(2026, 1, 1)
    five_min = kerberos.Ticket("a@B", start, start + datetime.timedelta(minutes=5))
    assert kerberos.check_interval(five_min, 300.0) == 50.0  # renewal window 100 s: two looks inside it
    ten_h = kerberos.Ticket("a@B", start, start + datetime.timedelta(hours=10))
    assert kerberos.check_interval(ten_h, 300.0) == 300.0
    assert kerberos.check_interval(kerberos.Ticket("a@B", start, start + datetime.timedelta(seconds=12)), 300) == 5.0
    assert kerberos.check_interval(None, 300.0) == 300.0
    # every check lands at most a sixth of the lifetime after the last: one falls in the last third
    for lifetime_s in (30, 120, 300, 1800, 36000):
        step = kerberos.check_interval(kerberos.Ticket("a@B", start, start + datetime.timedelta(seconds=lifetime_s)),
                                       300.0)
        assert step <= lifetime_s / 3 / 2 or step == 5.0


def test_hadoop_conf_dir() -> None:
    c = envcheck.check_hadoop_conf({})
    assert not c.ok and c.fix == "export HADOOP_CONF_DIR=/etc/hadoop/conf"
    assert envcheck.check_hadoop_conf({"YARN_CONF_DIR": "/etc/hadoop/conf"}).ok


def test_laptop_without_hadoop_is_ready_for_the_local_path() -> None:
    checks = envcheck.check(env={}, which=which_of("java"), run=runner({"/usr/bin/java -version": JAVA17}),
                            build=GOOD_BUILD, python=PYTHON, is_file=lambda p: p == "/venv/bin/spark-submit",
                            is_dir=lambda p: False)
    assert [c.name for c in checks] == [
        "Java", "spark-submit", "Horovod TensorFlow ops", "Horovod Gloo", "Horovod NCCL", "HADOOP_HOME",
        "libhdfs", "CLASSPATH", "HADOOP_CONF_DIR", "Kerberos ticket"]
    assert envcheck.exit_code(checks) == 0
    text = envcheck.render(checks)
    assert "✓ Java: Java 17 at /usr/bin/java" in text
    assert "✗ HADOOP_HOME (cluster): not set" in text and "    fix: export HADOOP_HOME=" in text
    assert text.splitlines()[-3:] == [
        "local path: ready", "cluster path: missing HADOOP_HOME, libhdfs, CLASSPATH, HADOOP_CONF_DIR",
        "GPU training: missing Horovod NCCL"]


def test_missing_java_fails_the_exit_code_with_its_fix() -> None:
    checks = envcheck.check(env={}, which=which_of(), run=runner({}), build=GOOD_BUILD, python=PYTHON,
                            is_file=lambda p: p == "/venv/bin/spark-submit", is_dir=lambda p: False)
    assert envcheck.exit_code(checks) == 1
    java = checks[0]
    assert java.line() == ("✗ Java: java not found on PATH; Spark needs Java 17\n    fix: install Java 17: "
                           "apt-get install openjdk-17-jre-headless (or set JAVA_HOME and put $JAVA_HOME/bin on PATH)")
    assert "local path: missing Java" in envcheck.render(checks)


def test_a_check_line_without_a_failure_shows_no_fix() -> None:
    assert Check("x", True, "fine", "do y").line() == "✓ x: fine"
    assert Check("x", False, "broken", "do y", scope="cluster").line() == "✗ x (cluster): broken\n    fix: do y"
