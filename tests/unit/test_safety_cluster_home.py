"""``hvdtrain cluster up --home DIR`` resets only the folders its ledger says it created there (#54 item 9)."""
from __future__ import annotations

import pytest

from hvdtrain.core.errors import EnvironmentProblem
from hvdtrain.hadoop import ledger
from hvdtrain.hadoop.minicluster import cluster


class Started(Exception):
    """Raised where the cluster JVM would start: everything before it has run."""


@pytest.fixture
def no_hadoop(monkeypatch):
    """``up`` up to the JVM's start, without Java, Maven or Hadoop."""
    monkeypatch.setattr(cluster, "require_tools", lambda: ("java", "javac", "mvn"))
    monkeypatch.setattr(cluster, "prepare", lambda mvn=None, javac=None: ("3.4.1", "/jars/*"))

    def java_command(*args, **kwargs):
        raise Started()
    monkeypatch.setattr(cluster, "java_command", java_command)


def test_a_users_data_and_target_folders_are_never_deleted(tmp_path, no_hadoop):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "thesis.csv").write_text("a,b\n1,2\n")
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "app.jar").write_text("jar")
    with pytest.raises(EnvironmentProblem) as refused:
        cluster.up(cluster.ClusterSpec(home=str(tmp_path)))
    assert (tmp_path / "data" / "thesis.csv").read_text() == "a,b\n1,2\n"
    assert (tmp_path / "target" / "app.jar").read_text() == "jar"
    message = str(refused.value)
    assert "\n" not in message and str(tmp_path) in message and "data" in message and "--home" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "target"]  # nothing written either


def test_a_home_hvdtrain_created_is_reset_and_only_its_own_folders(tmp_path, no_hadoop):
    home = tmp_path / "cluster"
    spec = cluster.ClusterSpec(home=str(home))
    with pytest.raises(Started):
        cluster.up(spec)  # a new folder: hvdtrain's, recorded before anything is written
    assert ledger.read(str(home)) is not None
    (home / "data" / "dfs").mkdir(parents=True)
    (home / "data" / "dfs" / "blk_1").write_text("the last run's HDFS")
    (home / "target" / "test").mkdir(parents=True)
    with pytest.raises(Started):
        cluster.up(spec)
    assert not (home / "data").exists() and not (home / "target").exists()


def test_plan_home_is_pure():
    owned = cluster.home_ledger()
    assert cluster.plan_home("/h", [], None) == cluster.HomePlan(owned, ())
    assert cluster.plan_home("/h", ["data", "cluster.log", ledger.NAME], owned) == cluster.HomePlan(owned, ("data",))
    with pytest.raises(EnvironmentProblem, match="notes.txt"):
        cluster.plan_home("/h", ["data", "notes.txt", ledger.NAME], owned)  # a file hvdtrain never writes there
    with pytest.raises(EnvironmentProblem, match="no ledger"):
        cluster.plan_home("/h", ["conf", "bin"], None)  # a home from before ledgers, or anyone's folder
