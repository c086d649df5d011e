"""A same-size corrupt shard is a DataError (exit 3), not a crash that restarts (#28 item 12)."""
from __future__ import annotations

import tensorflow as tf

from hvdtrain.core import errors
from hvdtrain.runtime import supervise
from hvdtrain.training import runtime


def test_a_flipped_byte_in_a_shard_is_a_data_error(tmp_path):
    path = str(tmp_path / "part-0.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for i in range(5):
            writer.write(f"record {i} ".encode() * 20)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF  # same size, other bytes
    open(path, "wb").write(bytes(data))
    try:
        list(tf.data.TFRecordDataset(path))
    except runtime.CORRUPT_DATA as exc:
        error = runtime.corrupt_data_error(exc)
    else:
        raise AssertionError("TensorFlow read a corrupt shard without DataLossError")
    assert errors.exit_code(error) == 3 and "shard is corrupt" in str(error) and "rerun the ETL" in str(error)
    assert not supervise.classify(1, "Process 0 exit with status code 3.\nProcess name: 0\nExit code: 3\n").restartable
