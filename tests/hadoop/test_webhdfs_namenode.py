"""``hdfs://`` and ``webhdfs://`` against the real NameNode and DataNode of the session's minicluster.

hvdtrain.hadoop.fs, checkpoints, staged training input and the ETL, end to end over WebHDFS (``hdfs://`` paths reach it
through HADOOP_CONF_DIR). The stand-in server (tests/webhdfs_server.py, tests/test_webhdfs.py) keeps only the
faults a NameNode cannot be made to show on demand.
"""
from __future__ import annotations

import dataclasses
import os
import uuid

import numpy as np
import pytest

from hvdtrain import data
from hvdtrain.core import config
from hvdtrain.data.synthetic import Layout, TextSpec, make_text_dataset
from hvdtrain.hadoop import fs
from hvdtrain.training import checkpoint as ck
from yarn import packaging

pytestmark = pytest.mark.hadoop


@pytest.fixture
def base(hdfs_root: str) -> str:
    """A fresh folder, as ``hdfs://`` (odd tests) or ``webhdfs://`` URI."""
    return f"{hdfs_root}/webhdfs-{uuid.uuid4().hex[:8]}"


def as_webhdfs(uri: str, cluster: dict) -> str:
    """The same path through the NameNode's HTTP address (webhdfs://)."""
    path = uri.split("://", 1)[1].split("/", 1)[1]
    return f"{cluster['namenode_web'].replace('http://', 'webhdfs://')}/{path}"


def test_files_round_trip_through_the_namenode(hadoop_cluster, base, tmp_path):
    fs.makedirs(base)
    fs.write_bytes_atomic(fs.join(base, "a.json"), b"first")
    fs.write_bytes_atomic(fs.join(base, "a.json"), b"second version")  # rename over an existing file
    assert fs.read_bytes(fs.join(base, "a.json")) == b"second version"
    assert fs.size(fs.join(base, "a.json")) == len(b"second version")
    blob = os.urandom(3 << 20)
    src = tmp_path / "blob.bin"
    src.write_bytes(blob)
    assert fs.copy_from_local(str(src), fs.join(base, "sub", "blob.bin")) == len(blob)  # parents created
    assert fs.copy_to_local(fs.join(base, "sub", "blob.bin"), str(tmp_path / "back.bin"), chunk=1 << 20) == len(blob)
    assert (tmp_path / "back.bin").read_bytes() == blob
    assert fs.listdir(base) == ["a.json", "sub"]
    fs.move(fs.join(base, "sub"), fs.join(base, "moved"))
    assert fs.listdir(base) == ["a.json", "moved"] and fs.exists(fs.join(base, "moved", "blob.bin"))
    web = as_webhdfs(base, hadoop_cluster)  # one file, two URI schemes
    assert fs.read_bytes(fs.join(web, "moved", "blob.bin")) == blob
    fs.delete(fs.join(base, "moved"))
    assert not fs.exists(fs.join(web, "moved")) and fs.listdir(web) == ["a.json"]


def test_missing_file_is_file_not_found_naming_the_path(hadoop_cluster, base):
    uri = fs.join(base, "nope", "part-00000.tfrecord")
    with pytest.raises(FileNotFoundError, match="nope/part-00000.tfrecord"):
        fs.read_bytes(uri)
    with pytest.raises(FileNotFoundError):
        fs.size(uri)


def test_checkpoints_publish_verify_and_restore(hadoop_cluster, base):
    root = fs.join(base, "ckpts")
    rng = np.random.default_rng(0)
    states = {s: {"w": rng.normal(size=(64, 32)).astype(np.float32), "step": np.array(s, np.int64)} for s in (5, 10)}
    w = ck.CheckpointWriter(root, keep_last=1, keep_best=0, background=True)
    for step, arrays in states.items():
        w.save(step, arrays, {"epoch": 0, "metrics": {"validation_accuracy": step / 10}})
    w.wait()
    infos = ck.scan(root)
    assert [(i.step, i.status) for i in infos] == [(10, "ok")]  # retention pruned step 5 on HDFS
    info, arrays, meta = ck.restore_latest(root)
    assert info.step == 10 and meta["metrics"]["validation_accuracy"] == 1.0
    np.testing.assert_array_equal(arrays["w"], states[10]["w"])
    state = fs.join(root, ck.checkpoint_name(10), ck.STATE)
    rotten = bytearray(fs.read_bytes(state))
    rotten[64:66] = b"\xff\xfe"  # bit rot on the cluster (written through the NameNode, as a bad disk could)
    with fs.open_output(state) as fh:
        fh.write(bytes(rotten))
    assert [i.status for i in ck.scan(root)] == ["corrupt"] and ck.restore_latest(root) is None


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_training_stream_staged_from_hdfs_equals_the_local_one(hadoop_cluster, base, tmp_path, compression):
    local_root = tmp_path / "ds"
    m = make_text_dataset(str(local_root), TextSpec(layout=Layout(n_per_split=48, shards_per_split=4,
                                                                  compression=compression), max_length=6))
    for folder, _, files in os.walk(local_root):
        for name in files:
            rel = os.path.relpath(os.path.join(folder, name), local_root)
            fs.copy_from_local(os.path.join(folder, name), fs.join(base, "ds", rel))
    remote = dataclasses.replace(m, location=fs.join(base, "ds", "manifest.json"))
    stage = tmp_path / "stage"
    stage.mkdir()
    stream = data.TrainStream(rank=0, size=1, batch_size=8, shuffle_buffer=4, seed=5, cycle_length=2)
    staged = data.train_dataset(remote, stream, stage_dir=str(stage))
    local = data.train_dataset(m, stream)
    assert [b["key"].numpy().tolist() for b in staged.take(12)] == [b["key"].numpy().tolist() for b in local.take(12)]
    copy = tmp_path / "copy"
    fs.copy_to_local(remote.shard_uri(m.split("train").shards[0]), str(copy))
    assert copy.read_bytes() == open(m.shard_uri(m.split("train").shards[0]), "rb").read()  # staged as stored


@pytest.mark.spark
def test_etl_publishes_to_hdfs_byte_identical_to_a_local_run(hadoop_cluster, base, tmp_path):
    """Spark writes through its own Hadoop client where Python goes through WebHDFS: same hdfs:// path."""
    from etl import job as etl_job
    from etl import session
    from hvdtrain.core import config
    from hvdtrain.data import manifest
    from tests.support.spark_jvm import stop_with_jvm

    conf = {"name": "hdfs-etl", "workdir": str(tmp_path / "work"),
            "source": {"path": str(tmp_path / "src.json"), "format": "json"},
            "etl": {"max_length": 16, "vocab_size": 200, "min_shards_per_split": 2, "min_shard_mb": 0}}
    with open(tmp_path / "src.json", "w") as fh:
        for i in range(300):
            fh.write(f'{{"id": "r{i}", "text": "words for row {i} about {["cats", "dogs", "birds"][i % 3]}", '
                     f'"label": "{["a", "b", "c"][i % 3]}"}}\n')
    spark = session.get_session(config.from_dict(conf, base_dir=str(tmp_path)), "local[2]")
    out = fs.join(base, "warehouse", "ds")
    try:
        reports = {}
        for where, output in (("local", str(tmp_path / "local-out")), ("hdfs", out)):
            cfg = config.from_dict({**conf, "etl": {**conf["etl"], "output": output}}, base_dir=str(tmp_path))
            reports[where] = etl_job.run(spark, cfg)
    finally:
        stop_with_jvm(spark)  # its JVM has the cluster's core-site.xml: no later test may join it
    remote, here = manifest.read(out), manifest.read(str(tmp_path / "local-out"))
    assert reports["hdfs"]["rows_written"] == reports["local"]["rows_written"] == 300
    assert [(s.path, s.records, s.sha256) for sp in remote.splits for s in remote.split(sp).shards] == \
        [(s.path, s.records, s.sha256) for sp in here.splits for s in here.split(sp).shards]
    for sp in remote.splits:
        for s in remote.split(sp).shards:
            assert fs.read_bytes(remote.shard_uri(s)) == open(here.shard_uri(s), "rb").read()
    assert not fs.exists(fs.join(out, "_staging"))


@pytest.mark.skipif(fs.libhdfs_dir(os.environ) is not None, reason="hdfs:// goes through libhdfs on this host, "
                    "which has no checksum call (the SHA-256 decides alone)")
def test_a_cached_env_archive_is_vouched_for_by_hdfss_checksum_without_a_read(hadoop_cluster, base, tmp_path,
                                                                          monkeypatch):
    """The archive's HDFS checksum, kept at upload, stands in for reading it back on reuse; a changed archive
    fails it and the SHA-256 decides."""
    monkeypatch.setenv(packaging.PACK_CACHE_ENV, "")  # not the user's pack cache: this archive is a stand-in
    yarn_cfg = config.YarnConfig(env_cache=fs.join(base, "envs"))

    def pack(prefix, local):
        with open(local, "wb") as fh:
            fh.write(b"environment archive " * 5000)

    first = packaging.ensure_env_archive(yarn_cfg, ["python 3.11"], prefix="/venv", pack=pack, log=lambda m: None)
    stored = fs.storage_checksum(first.uri)
    assert stored and stored.startswith("MD5-of-") and \
        fs.read_bytes(first.uri + packaging.STORAGE_SUFFIX).decode().strip() == stored
    sha = fs.read_bytes(first.uri + packaging.SHA_SUFFIX)
    fs.write_bytes_atomic(first.uri + packaging.SHA_SUFFIX, b"0" * 64 + b"\n")  # a SHA-256 read would now fail
    assert packaging.cached_archive_problem(first.uri) is None  # HDFS's checksum vouched: the bytes were not read
    fs.write_bytes_atomic(first.uri + packaging.SHA_SUFFIX, sha)
    fs.delete(first.uri + packaging.STORAGE_SUFFIX)  # e.g. cached before the checksum was kept: a full read
    assert packaging.cached_archive_problem(first.uri) is None
    assert fs.read_bytes(first.uri + packaging.STORAGE_SUFFIX).decode().strip() == stored  # kept from now on
    fs.write_bytes_atomic(first.uri, b"environment archivX " * 5000)  # same size, other bytes
    assert fs.storage_checksum(first.uri) != stored
    assert "is not the recorded" in (packaging.cached_archive_problem(first.uri) or "")
    assert fs.storage_checksum(str(tmp_path / "local.bin")) is None  # a local disk keeps none: SHA-256 only
