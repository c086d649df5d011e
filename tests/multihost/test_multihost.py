"""Horovod across two hosts on one machine: 4 ranks, 2 per host, launched by horovodrun over ssh.

The hosts are 127.0.0.2 and 127.0.0.3, served by a throwaway sshd (the
``ssh_hosts`` session fixture in conftest.py, started by scripts/test_sshd.sh
and always stopped). Every rank is started through an ssh session, and each
host's sessions get their own TMPDIR: that host's local disk.
"""
from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from benchmarks import kill_drill
from hvdtrain.core.errors import ANY_FAILURE
from hvdtrain.data.synthetic import Layout, TextSpec, make_text_dataset
from tests.multiprocess.test_train_mp import _assert_complete, _env, _job, _outputs
from tests.support import mp

pytestmark = pytest.mark.multihost

REPO = Path(__file__).resolve().parents[2]
HOSTS = "127.0.0.2:2,127.0.0.3:2"
# (rank, host index, local rank, local size): ranks fill 127.0.0.2's slots, then 127.0.0.3's
PLACEMENT = [(0, 0, 0, 2), (1, 0, 1, 2), (2, 1, 0, 2), (3, 1, 1, 2)]


def horovodrun_4(ssh: mp.SshHosts, config_path: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    cmd = [str(mp.horovodrun()), "-np", "4", "-H", HOSTS, "--gloo", *ssh.horovodrun_args(),
           sys.executable, "-m", "hvdtrain.training.train", str(config_path)]
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=ssh.env(_env()), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(cmd)} did not finish in {timeout}s\n{(exc.stderr or b'')[-3000:]!r}")
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def sessions_by_host(ssh: mp.SshHosts) -> dict[str, int]:
    """ssh sessions sshd accepted on each listening address (its VERBOSE log)."""
    log = (ssh.folder / "sshd.log").read_text()
    return {h: len(re.findall(rf"Connection from \S+ port \d+ on {re.escape(h)} port {ssh.port}", log))
            for h in ssh.hosts}


def assert_placement(report: dict) -> None:
    ranks = report["rank_digest"]["ranks"]
    assert [(r["rank"], r["cross_rank"], r["local_rank"], r["local_size"]) for r in ranks] == PLACEMENT, ranks
    assert report["rank_digest"]["agree"] and len({r["sha256"] for r in ranks}) == 1


def test_four_ranks_on_two_hosts_agree_and_resume_exactly_after_a_kill_on_the_second_host(
        ssh_hosts: mp.SshHosts, tmp_path: Path) -> None:
    """The drill's uninterrupted run is the 4-rank, 2-host run checked first: every rank started through ssh,
    placed by host, identical weights, exact evaluation. Then a rank on the second host is killed."""
    from hvdtrain.data import manifest as manifest_lib

    seed = int(os.environ.get("HVDTRAIN_DRILL_SEED", random.randrange(10_000)))
    before = sessions_by_host(ssh_hosts)
    # `hvdtrain train --max-restarts` launches on this host only: the drill relaunches horovodrun itself
    launch = kill_drill.Launch(np=4, hosts=HOSTS, args=ssh_hosts.horovodrun_args(), kill_ranks=(2, 3),
                               env=ssh_hosts.env({"PATH": os.environ.get("PATH", "")}), timeout=900,
                               supervised=False)
    report = kill_drill.drill_run(str(tmp_path), kills=1, seed=seed, log=lambda msg: None, launch=launch, epochs=2)
    result, uninterrupted = _outputs(tmp_path / "runs" / "uninterrupted")
    assert result["world_size"] == 4 and result["ranks_agree"]
    assert_placement(uninterrupted)
    manifest = manifest_lib.read(str(tmp_path / "data"))
    _assert_complete(uninterrupted, manifest)
    assert uninterrupted["training"]["steps_per_epoch"] == manifest.split("train").records // (kill_drill.Drill.batch_size * 4)
    after = sessions_by_host(ssh_hosts)
    # three launches (uninterrupted, killed, relaunched), each starting both ranks of each host through ssh
    assert all(after[h] - before[h] >= 3 * 2 for h in ssh_hosts.hosts), (before, after)
    kill = report.kills[0]
    where = f"(HVDTRAIN_DRILL_SEED={seed}: {report.to_dict()})"
    assert kill.rank in (2, 3) and kill.exit_code not in (0, None), where
    assert kill.seconds_to_exit < 60 and kill.lost_rank_named, where
    assert report.resumes_ok == 1 and report.batches_equal, where
    assert report.records_lost == 0 and report.records_repeated == 0, where
    assert report.final_weight_max_abs_diff <= 1e-6 and report.optimizer_max_abs_diff <= 1e-6, where


class StageWatcher:
    """Polls each host's TMPDIR for hvdtrain's staging folders and the shard copies in them.

    A rank deletes its staging folder when it is done, possibly while the watcher lists it: a folder that
    vanishes holds nothing more to see. Any other error in the watcher's thread is raised by ``__exit__``,
    in the test, instead of ending the thread with an unhandled exception."""

    def __init__(self, roots: dict[str, Path]):
        self.roots, self.seen = roots, {h: {} for h in roots}  # host -> {stage folder: copies seen}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._error: BaseException | None = None

    def _run(self) -> None:
        try:
            while not self._stop.wait(0.05):
                self.scan()
        except ANY_FAILURE as exc:  # handed to the test by __exit__
            self._error = exc

    def scan(self) -> None:
        for host, root in self.roots.items():
            for folder in root.glob("hvdtrain-stage-*"):
                self.seen[host].setdefault(folder.name, set()).update(staged_copies(folder))

    def __enter__(self) -> "StageWatcher":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if self._error is not None:
            raise self._error


def staged_copies(folder: Path) -> set[str]:
    """The files in a staging folder now; nothing when the folder is gone or going while it is listed."""
    try:
        return {p.name for p in folder.rglob("*") if p.is_file()}
    except FileNotFoundError:
        return set()


def test_remote_input_is_staged_on_each_host_in_its_own_folder(ssh_hosts: mp.SshHosts, tmp_path: Path) -> None:
    """Shards on a WebHDFS server: every rank stages what it reads to its own host's local disk."""
    from tests.support.webhdfs_server import WebHdfsServer

    root = tmp_path / "namenode"
    root.mkdir()
    with WebHdfsServer(str(root)) as server:
        local = make_text_dataset(str(root / "ds"), TextSpec(layout=Layout(
            n_per_split={"train": 256, "validation": 40, "test": 40}, shards_per_split=4), seed=3))
        config_path, output = _job(tmp_path, "staged", server.uri("/ds"), epochs=1, batch_size=16)
        roots = {h: ssh_hosts.host_tmp(h) for h in ssh_hosts.hosts}
        with StageWatcher(roots) as watcher:
            horovodrun_4(ssh_hosts, config_path)
        opened = server.ops().count("dn:OPEN")
    result, report = _outputs(output)
    assert_placement(report)
    _assert_complete(report, local)
    assert opened >= sum(len(local.split(s).shards) for s in local.splits)  # every shard came over WebHDFS
    for host, folders in watcher.seen.items():
        staging = {name for name, copies in folders.items() if copies}
        assert len(staging) == 2, (host, watcher.seen)  # shards staged on this host's disk, by both its ranks
    assert all(list(r.glob("hvdtrain-stage-*/*")) == [] for r in roots.values())  # and deleted after use
