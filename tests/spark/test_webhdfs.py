"""``webhdfs://`` faults a real NameNode cannot be made to show on demand, on the stand-in server.

Everything else over WebHDFS runs against the real NameNode and DataNode of the minicluster
(tests/hadoop/test_webhdfs_namenode.py). The server (tests/support/webhdfs_server.py) speaks the
NameNode/DataNode HTTP protocol over a local folder; hvdtrain's pyarrow handler and the ``hdfs``
client are the real ones. Each test says why it needs the stand-in.
"""
from __future__ import annotations

import logging

import pytest

from hvdtrain.core.errors import DataError
from hvdtrain.hadoop import fs


def test_a_denied_path_is_a_permission_error_naming_it_and_not_retried(server):
    """Stand-in: the minicluster runs with HDFS permissions off and the test user is its superuser, whom a
    NameNode never denies; the stand-in denies a path on demand."""
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
    """Stand-in: exactly N answers of ``RetriableException`` (what an HA NameNode in startup safe mode sends), then
    success or a give-up; a real NameNode cannot be made to do that on demand. Manual safe mode (SafeModeException)
    runs on the real NameNode (tests/hadoop/test_hadoop_cluster.py)."""
    uri = server.uri("/data/x.bin")
    fs.write_bytes_atomic(uri, b"payload")
    server.fail_next(2)
    with caplog.at_level(logging.WARNING):
        assert fs.read_bytes(uri) == b"payload"
    assert caplog.text.count("transient error") == 2 and "safe mode" in caplog.text
    server.fail_next(100)
    with pytest.raises(DataError, match=r"read webhdfs://.*/data/x.bin: failed after 5 attempts.*safe mode"):
        fs.read_bytes(uri)
