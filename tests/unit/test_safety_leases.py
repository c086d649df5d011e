"""One writer per shared output: a create-exclusive lease (#54 item 3).

Before, two overlapping ``etl --overwrite`` runs on one output (a scheduler retry) raced: the first one's clean-up
deleted the second's staging, and a checkpoint save deleted a committed checkpoint of the same step written by
another writer. Overlap is arranged with events and barriers, never with sleeps: a loaded machine only waits.
"""
from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from etl import job as etl_job
from hvdtrain.core import config
from hvdtrain.core.errors import DataError
from hvdtrain.data import manifest
from hvdtrain.hadoop import fs, lease, ledger
from hvdtrain.training import checkpoint, leases, publish
from tests.unit.test_safety_etl_ledger import _publish

HOST = socket.gethostname()


def _holder(host: str = HOST, pid: int = 4242, expires: float = 100.0, pidns: str = "") -> lease.Holder:
    return lease.Holder("etl.output /d", "alice", host, pid, 10.0, expires, "t0", pidns)


NS = "pid:[4026531836]"


@pytest.mark.parametrize("now, host, pidns, alive, stale", [
    (99.0, HOST, "", False, False),        # not expired, namespace unknown: held, even with its process gone
    (101.0, HOST, "", True, False),        # expired but its process runs here: a slow renewer, not a dead one
    (101.0, HOST, "", False, True),        # expired, process gone: stale
    (101.0, "elsewhere", "", True, True),  # expired on another host: its pid means nothing here
    (99.0, HOST, NS, False, True),         # not expired, but gone from this host's namespace: a crash, rerun now
    (99.0, HOST, NS, True, False),         # not expired and running here: held
    (99.0, HOST, "pid:[1]", False, False),  # another namespace on this host (a container): its pid is not ours
    (99.0, "elsewhere", NS, False, False),  # another host with an equal namespace id: wait for the expiry
])
def test_a_lease_is_stale_when_expired_or_its_process_is_gone_from_here(now, host, pidns, alive, stale) -> None:
    assert lease.is_stale(_holder(host=host, pidns=pidns), now, HOST, lambda pid: alive, NS) is stale


def test_a_holder_records_its_pid_namespace_and_reads_a_lease_without_one() -> None:
    assert lease.pid_namespace().startswith("pid:[")  # Linux
    old = b'{"what": "x", "user": "u", "host": "h", "pid": 1, "started": 1, "expires": 2, "token": "t"}'
    assert lease.Holder.from_json(old) == lease.Holder("x", "u", "h", 1, 1.0, 2.0, "t", "")
    assert lease.Holder.from_json(_holder(pidns=NS).to_json()).pidns == NS


def test_the_refusal_is_one_line_naming_holder_since_path_and_what_to_do() -> None:
    line = lease.refusal(_holder(), "/d/_hvdtrain_lease.json")
    assert "\n" not in line
    assert line.startswith("etl.output /d is being written by alice@" + HOST + " pid 4242 since 1970-01-01T00:00:10")
    assert "lease /d/_hvdtrain_lease.json" in line and "wait for that job to end" in line
    assert "remove /d/_hvdtrain_lease.json" in line


def test_create_exclusive_lets_exactly_one_of_two_racing_writers_in(tmp_path: Path) -> None:
    barrier, won = threading.Barrier(2), []

    def create(tag: bytes) -> None:
        barrier.wait()
        if fs.create_exclusive(str(tmp_path / "lease"), tag):
            won.append(tag)

    threads = [threading.Thread(target=create, args=(t,)) for t in (b"a", b"b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and (tmp_path / "lease").read_bytes() == won[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lease"]  # no temporary file left


def test_create_exclusive_over_webhdfs_is_refused_by_the_namenode(server) -> None:
    uri = server.uri("/out/lease")
    assert fs.create_exclusive(uri, b"first") is True
    assert fs.create_exclusive(uri, b"second") is False
    assert fs.read_bytes(uri) == b"first"


def _hold_in_child(folder: str, held, done) -> None:
    with lease.acquire(folder, f"etl.output {folder}"):
        held.set()
        done.wait()


def test_a_second_writer_in_another_process_is_refused_until_the_first_releases(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    held, done = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_hold_in_child, args=(str(tmp_path), held, done))
    child.start()
    try:
        assert held.wait(120)
        with pytest.raises(lease.LeaseHeld) as err:
            lease.acquire(str(tmp_path), f"etl.output {tmp_path}")
        assert f"pid {child.pid} since" in str(err.value) and "\n" not in str(err.value)
    finally:
        done.set()
        child.join(120)
    with lease.acquire(str(tmp_path), "again"):  # released: the next writer gets it
        pass
    assert not (tmp_path / lease.NAME).exists()


def test_a_stale_lease_of_a_dead_process_is_broken_and_the_run_proceeds(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / lease.NAME).write_bytes(_holder(pid=dead.pid, expires=1.0).to_json())
    with lease.acquire(str(tmp_path), "the output") as held:
        assert lease.Holder.from_json((tmp_path / lease.NAME).read_bytes()) == held.holder
        assert held.holder.pid == os.getpid()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # the broken lease moved aside was deleted


def test_an_expired_lease_whose_process_still_runs_here_is_not_broken(tmp_path: Path) -> None:
    (tmp_path / lease.NAME).write_bytes(_holder(pid=os.getpid(), expires=1.0).to_json())
    with pytest.raises(lease.LeaseHeld, match=f"alice@{HOST} pid {os.getpid()}"):
        lease.acquire(str(tmp_path), "the output")


def test_renewing_pushes_the_expiry_and_never_overwrites_a_lease_taken_over(tmp_path: Path) -> None:
    now = [1000.0]
    held = lease.acquire(str(tmp_path), "the output", ttl=60.0, clock=lambda: now[0])
    try:
        now[0] = 1030.0
        held.renew()
        assert lease.Holder.from_json((tmp_path / lease.NAME).read_bytes()).expires == 1090.0
        taken = lease.Holder("x", "bob", "h2", 7, 1.0, 9e9, "other")
        (tmp_path / lease.NAME).write_bytes(taken.to_json())  # someone broke it (wrongly) and took it
        held.renew()
        assert held.lost and lease.Holder.from_json((tmp_path / lease.NAME).read_bytes()) == taken
    finally:
        held.release()
    assert lease.Holder.from_json((tmp_path / lease.NAME).read_bytes()) == taken  # not this holder's to remove


# -- the ETL: a second run started mid-write ---------------------------------------------------------------

def _job(out: Path, tmp: Path) -> config.JobConfig:
    return config.from_dict({"name": "ow", "workdir": str(tmp), "source": {"table": "db.t"},
                             "etl": {"output": str(out), "max_length": 8, "overwrite": True}}, base_dir=str(tmp))


def _whole(out: Path) -> None:
    """Every file the manifest names exists and matches its checksum."""
    m = manifest.read(str(out))
    for split in m.splits.values():
        for shard in split.shards:
            assert hashlib.sha256((out / shard.path).read_bytes()).hexdigest() == shard.sha256


def test_a_second_etl_started_mid_write_is_refused_in_one_line_and_the_first_keeps_its_staging(
        tmp_path: Path) -> None:
    out = tmp_path / "ds"
    _publish(out, "A", tmp_path)  # the dataset a retry would replace
    mid_write, finish = threading.Event(), threading.Event()
    first: dict[str, BaseException] = {}

    class Spark:
        def __getattr__(self, name: str):  # the first run is mid-write: its staging holds a shard
            entry = next(e for e in ledger.read(str(out)).entries if e.startswith("_staging/"))
            staging = out / entry.removesuffix("/*")  # recorded before anything was staged
            staging.mkdir(parents=True, exist_ok=True)  # the run made it (private) before staging anything
            (staging / "part-0.tf").write_bytes(b"half a shard")
            mid_write.set()
            assert finish.wait(120)
            raise RuntimeError("the executor was lost")

    def run_first() -> None:
        try:
            etl_job.run(Spark(), _job(out, tmp_path))
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            first["error"] = exc

    thread = threading.Thread(target=run_first)
    thread.start()
    try:
        assert mid_write.wait(120)
        staged = sorted(p.relative_to(out).as_posix() for p in (out / "_staging").rglob("*") if p.is_file())
        with pytest.raises(DataError) as err:
            etl_job.run(None, _job(out, tmp_path))  # never gets as far as Spark
        message = str(err.value)
        assert "\n" not in message and f"etl.output {out} is being written by" in message
        assert f"pid {os.getpid()} since" in message and str(out / lease.NAME) in message
        assert sorted(p.relative_to(out).as_posix() for p in (out / "_staging").rglob("*")
                      if p.is_file()) == staged  # the refused run deleted nothing of the first one's
    finally:
        finish.set()
        thread.join(120)
    assert "executor was lost" in str(first["error"])
    assert not (out / lease.NAME).exists() and not (out / "_staging").exists()
    _whole(out)  # the published dataset: every file there, matching its checksum
    assert manifest.read(str(out)).created_at == "A"


# -- checkpoints: a committed checkpoint of the same step is never deleted ---------------------------------

def test_a_save_never_deletes_a_committed_checkpoint_of_the_same_step_written_by_another_writer(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = str(tmp_path / "ckpt")
    first = checkpoint.CheckpointWriter(root, background=False)
    first.save(10, {"w": np.arange(4.0)}, {"epoch": 1})
    committed = {p.name: p.read_bytes() for p in (tmp_path / "ckpt" / "ckpt-0000000010").iterdir()}
    second = checkpoint.CheckpointWriter(root, background=False)
    second.save(10, {"w": np.zeros(4)}, {"epoch": 1})
    assert "ckpt-0000000010 is already committed" in caplog.text
    assert {p.name: p.read_bytes() for p in (tmp_path / "ckpt" / "ckpt-0000000010").iterdir()} == committed
    assert checkpoint.latest_valid(root).step == 10


# -- training: train.output and checkpoint.dir, held by the launcher or by rank 0 ------------------------------

@pytest.mark.parametrize("output, uri", [
    ("/runs/mp", "/runs/.mp._hvdtrain_lease.json"),
    ("hdfs://nn:8020/runs/mp/", "hdfs://nn:8020/runs/.mp._hvdtrain_lease.json"),
])
def test_train_outputs_lease_lies_beside_the_folder_a_publish_swaps_whole(output: str, uri: str) -> None:
    assert leases.output_lease(output) == uri
    assert [t[2] for t in leases.targets(output, "/ck")] == [uri, None]  # checkpoint.dir: inside
    assert [t[0] for t in leases.targets(output, None)] == [output]  # checkpoints off: no lease on them


def test_a_second_training_job_on_the_same_outputs_is_refused_in_one_line_and_takes_nothing(tmp_path: Path) -> None:
    out, ckpt = str(tmp_path / "runs" / "a"), str(tmp_path / "ck" / "a")
    with leases.hold(out, ckpt) as env:
        assert env[leases.HELD_ENV].count(",") == 1
        mine = {p: p.read_bytes() for p in (tmp_path / "runs" / ".a._hvdtrain_lease.json", Path(ckpt, lease.NAME))}
        with pytest.raises(lease.LeaseHeld) as err:
            with leases.hold(str(tmp_path / "runs" / "b"), ckpt):  # another output, the same checkpoints
                pass
        assert "\n" not in str(err.value) and f"checkpoint.dir {ckpt} is being written by" in str(err.value)
        assert f"pid {os.getpid()} since" in str(err.value)
        assert not (tmp_path / "runs" / ".b._hvdtrain_lease.json").exists()  # b's first lease was given back
        assert {p: p.read_bytes() for p in mine} == mine  # the holder's leases untouched
        with pytest.raises(lease.LeaseHeld, match=f"train.output {out} is being written by"):
            with leases.hold(out, None):
                pass
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [] and not os.listdir(ckpt)
    with leases.hold(out, ckpt):  # released: the next job gets both
        pass


def test_replacing_train_output_whole_keeps_its_lease_and_sees_no_foreign_file(tmp_path: Path) -> None:
    out = tmp_path / "runs" / "a"
    local = tmp_path / "local"
    local.mkdir()
    (local / "result.json").write_text("{}")
    with leases.hold(str(out), None):
        for _ in range(2):  # a first publish, then one replacing it
            publish.claim_output(str(out), write=True)
            publish.upload_dir(str(local), str(out))
        assert (tmp_path / "runs" / ".a._hvdtrain_lease.json").is_file()
        assert sorted(p.name for p in out.iterdir()) == [ledger.NAME, "result.json"]


@pytest.mark.parametrize("chief", [True, False])
def test_ranks_share_rank_0s_refusal_and_take_nothing_when_their_launcher_holds_the_leases(
        tmp_path: Path, chief: bool) -> None:
    out, ckpt = str(tmp_path / "a"), str(tmp_path / "ck")
    sent: list = []

    def broadcast(obj):  # rank 0's object: this rank's own when it is rank 0, else the one rank 0 sent
        sent.append(obj)
        return obj if chief else (True, "train.output a is being written by bob@h pid 1 since then")

    with leases.for_ranks(out, ckpt, chief, broadcast, env={leases.HELD_ENV: "t1,t2"}):
        assert not os.path.exists(leases.output_lease(out)) and not os.path.exists(ckpt)
    assert sent == []  # no collective when the launcher holds them
    with leases.hold(out, ckpt):  # another job holds them
        with pytest.raises(lease.LeaseHeld) as err:
            with leases.for_ranks(out, ckpt, chief, broadcast, env={}):
                pass
    assert "\n" not in str(err.value) and "is being written by" in str(err.value)
    assert sent == [(True, str(err.value))] if chief else sent == [None]
    with leases.for_ranks(out, ckpt, chief, lambda obj: obj, env={}):  # free now: rank 0 holds them
        assert os.path.exists(leases.output_lease(out)) is chief
    assert not os.path.exists(leases.output_lease(out))


def test_a_lease_left_by_a_crash_on_this_host_is_broken_at_once_not_after_its_expiry(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / lease.NAME).write_bytes(_holder(pid=dead.pid, expires=9e9, pidns=lease.pid_namespace()).to_json())
    with lease.acquire(str(tmp_path), "the output") as held:  # a rerun right after the crash proceeds
        assert held.holder.pid == os.getpid()


# -- a lease broken while its job ran: that job must not publish -------------------------------------------------

def _taken_over(uri: Path) -> None:
    uri.write_bytes(lease.Holder("the output", "bob", "elsewhere", 7, 1.0, 9e9, "theirs").to_json())


def test_a_job_whose_lease_was_taken_over_or_removed_is_told_before_it_publishes(tmp_path: Path) -> None:
    with lease.acquire(str(tmp_path), "etl.output /d") as held:
        held.check()  # still its own
        _taken_over(tmp_path / lease.NAME)
        with pytest.raises(lease.LeaseLost) as err:
            held.check()
        assert str(err.value).startswith(f"etl.output /d: this job's lease {tmp_path / lease.NAME} was taken by "
                                         "bob@elsewhere pid 7 while it ran") and "nothing was published" in str(err.value)
        (tmp_path / lease.NAME).unlink()
        with pytest.raises(lease.LeaseLost, match="was removed while it ran"):
            held.check()


@pytest.mark.parametrize("launcher", [True, False])
def test_rank_0_checks_train_outputs_lease_before_replacing_it_and_keeps_the_new_outputs(
        tmp_path: Path, launcher: bool) -> None:
    out = tmp_path / "runs" / "a"
    local = tmp_path / "local"
    local.mkdir()
    (local / "result.json").write_text('{"new": 1}')
    publish.upload_dir(str(local), str(out))  # the previous outputs
    before = sorted(p.name for p in out.iterdir())
    with contextlib.ExitStack() as stack:
        env = stack.enter_context(leases.hold(str(out), None)) if launcher else {}
        held = stack.enter_context(leases.for_ranks(str(out), None, True, lambda obj: obj, env=env))
        publish.upload_dir(str(local), str(out), before_replace=held.check)  # its own: replaced
        _taken_over(Path(leases.output_lease(str(out))))
        with pytest.raises(DataError) as err:
            publish.upload_dir(str(local), str(out), before_replace=held.check)
        assert "was taken by bob@elsewhere pid 7" in str(err.value) and "this run's outputs are kept in" in str(err.value)
        Path(leases.output_lease(str(out))).unlink()  # the other job's, gone: nothing for this one to release
    assert sorted(p.name for p in out.iterdir()) == before
    kept = [p for p in (tmp_path / "runs").iterdir() if ".incoming-" in p.name]
    assert len(kept) == 1 and (kept[0] / "result.json").read_text() == '{"new": 1}'
