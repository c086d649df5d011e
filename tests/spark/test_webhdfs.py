"""``webhdfs://`` end to end: hvdtrain.fs, checkpoints, staged training input and the ETL over the WebHDFS REST API.

The server (tests/support/webhdfs_server.py) speaks the NameNode/DataNode HTTP protocol
over a local folder; hvdtrain's pyarrow handler and the ``hdfs`` client are the real ones.
"""
from __future__ import annotations

import dataclasses
import logging
import os

import numpy as np
import pytest

from hvdtrain import checkpoint as ck
from hvdtrain import data, fs
from hvdtrain.errors import DataError
from hvdtrain.synthetic import Layout, TextSpec, make_text_dataset


def test_files_round_trip_through_the_rest_api(server, tmp_path):
    base = server.uri("/user/etl/out")
    fs.makedirs(base)
    fs.write_bytes_atomic(fs.join(base, "a.json"), b"first")
    fs.write_bytes_atomic(fs.join(base, "a.json"), b"second version")  # HDFS rename never replaces: handled
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
    fs.delete(fs.join(base, "moved"))
    assert not fs.exists(fs.join(base, "moved")) and fs.listdir(base) == ["a.json"]
    # the bytes really went NameNode -> 307 -> DataNode, and live where HDFS would keep them
    assert {"CREATE", "dn:CREATE", "OPEN", "dn:OPEN", "RENAME", "DELETE", "LISTSTATUS"} <= set(server.ops())
    assert (tmp_path / "namenode" / "user" / "etl" / "out" / "a.json").read_bytes() == b"second version"


def test_missing_file_is_file_not_found_naming_the_path(server):
    uri = server.uri("/nope/part-00000.tfrecord")
    with pytest.raises(FileNotFoundError, match="/nope/part-00000.tfrecord"):
        fs.read_bytes(uri)
    with pytest.raises(FileNotFoundError):
        fs.size(uri)
    assert server.ops().count("OPEN") == 1  # not retried: a missing file is not transient


def test_a_denied_path_is_a_permission_error_naming_it_and_not_retried(server):
    uri = server.uri("/secure/part-00000.tfrecord")
    fs.write_bytes_atomic(uri, b"payload")
    server.deny("/secure")
    before = len(server.ops())
    with pytest.raises(PermissionError, match=r"/secure/part-00000.tfrecord: .*Permission denied.*access=READ"):
        fs.read_bytes(uri)
    server.deny("/open/out")  # the folder exists and is writable, the file is not: fails at the upload
    fs.makedirs(server.uri("/open"))
    with pytest.raises(PermissionError, match=r"/open/out.bin: .*Permission denied.*access=WRITE"):
        with fs.open_output(server.uri("/open/out.bin")) as fh:
            fh.write(b"x")
    with pytest.raises(PermissionError):
        fs.listdir(server.uri("/secure"))
    assert len(server.ops()) - before <= 6  # each failed once: a denied path is not transient


def test_namenode_safe_mode_is_retried_then_reported_with_path_and_last_error(server, caplog):
    uri = server.uri("/data/x.bin")
    fs.write_bytes_atomic(uri, b"payload")
    server.fail_next(2)
    with caplog.at_level(logging.WARNING):
        assert fs.read_bytes(uri) == b"payload"
    assert caplog.text.count("transient error") == 2 and "safe mode" in caplog.text
    server.fail_next(100)
    with pytest.raises(DataError, match=r"read webhdfs://.*/data/x.bin: failed after 5 attempts.*safe mode"):
        fs.read_bytes(uri)


def test_checkpoints_publish_verify_and_restore(server):
    root = server.uri("/user/ml/ckpts")
    rng = np.random.default_rng(0)
    states = {s: {"w": rng.normal(size=(64, 32)).astype(np.float32), "step": np.array(s, np.int64)} for s in (5, 10)}
    w = ck.CheckpointWriter(root, keep_last=1, keep_best=0, background=True)
    for step, arrays in states.items():
        w.save(step, arrays, {"epoch": 0, "metrics": {"validation_accuracy": step / 10}})
    w.wait()
    infos = ck.scan(root)
    assert [(i.step, i.status) for i in infos] == [(10, "ok")]  # retention pruned step 5 on WebHDFS too
    info, arrays, meta = ck.restore_latest(root)
    assert info.step == 10 and meta["metrics"]["validation_accuracy"] == 1.0
    np.testing.assert_array_equal(arrays["w"], states[10]["w"])
    local = os.path.join(server.root, "user/ml/ckpts", ck.checkpoint_name(10), ck.STATE)
    with open(local, "r+b") as fh:  # bit rot on the "cluster"
        fh.seek(64)
        fh.write(b"\xff\xfe")
    assert [i.status for i in ck.scan(root)] == ["corrupt"] and ck.restore_latest(root) is None


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_training_stream_staged_from_webhdfs_equals_the_local_one(server, tmp_path, compression):
    layout = Layout(n_per_split=48, shards_per_split=4, compression=compression)
    m = make_text_dataset(os.path.join(server.root, "data", "ds"), TextSpec(layout=layout, max_length=6))
    remote = dataclasses.replace(m, location=server.uri("/data/ds/manifest.json"))
    stage = tmp_path / "stage"
    stage.mkdir()
    staged = data.train_dataset(remote, data.TrainStream(rank=0, size=1, batch_size=8, shuffle_buffer=4, seed=5,
                                                         cycle_length=2), stage_dir=str(stage))
    local = data.train_dataset(m, data.TrainStream(rank=0, size=1, batch_size=8, shuffle_buffer=4, seed=5,
                                                   cycle_length=2))
    got = [b["key"].numpy().tolist() for b in staged.take(12)]  # two passes
    want = [b["key"].numpy().tolist() for b in local.take(12)]
    assert got == want
    assert server.ops().count("dn:OPEN") >= 4
    staged_copy = tmp_path / "copy"
    first = m.shard_uri(m.split("train").shards[0])
    fs.copy_to_local(remote.shard_uri(m.split("train").shards[0]), str(staged_copy))
    assert staged_copy.read_bytes() == open(first, "rb").read()  # .tfrecord.gz staged as stored, not decompressed


@pytest.mark.spark
def test_etl_publishes_to_webhdfs_byte_identical_to_a_local_run(server, tmp_path):
    from etl import job as etl_job
    from etl import session
    from hvdtrain import config, manifest

    base = {"name": "webhdfs-etl", "workdir": str(tmp_path / "work"),
            "source": {"path": str(tmp_path / "src.json"), "format": "json"},
            "etl": {"max_length": 16, "vocab_size": 200, "min_shards_per_split": 2, "min_shard_mb": 0}}
    with open(tmp_path / "src.json", "w") as fh:
        for i in range(300):
            fh.write(f'{{"id": "r{i}", "text": "words for row {i} about {["cats", "dogs", "birds"][i % 3]}", '
                     f'"label": "{["a", "b", "c"][i % 3]}"}}\n')
    spark = session.get_session(config.from_dict(base, base_dir=str(tmp_path)), "local[2]")
    try:
        reports = {}
        for where, out in (("local", str(tmp_path / "local-out")), ("webhdfs", server.uri("/warehouse/ds"))):
            cfg = config.from_dict({**base, "etl": {**base["etl"], "output": out}}, base_dir=str(tmp_path))
            reports[where] = etl_job.run(spark, cfg)
    finally:
        spark.stop()
    remote = manifest.read(server.uri("/warehouse/ds"))
    here = manifest.read(str(tmp_path / "local-out"))
    assert reports["webhdfs"]["rows_written"] == reports["local"]["rows_written"] == 300
    assert [(s.path, s.records, s.sha256) for sp in remote.splits for s in remote.split(sp).shards] == \
        [(s.path, s.records, s.sha256) for sp in here.splits for s in here.split(sp).shards]
    for sp in remote.splits:
        for s in remote.split(sp).shards:
            on_server = os.path.join(server.root, "warehouse", "ds", s.path)
            assert open(on_server, "rb").read() == open(here.shard_uri(s), "rb").read()
    staging = fs.join(server.uri("/warehouse/ds"), "_staging")
    assert not fs.exists(staging)
