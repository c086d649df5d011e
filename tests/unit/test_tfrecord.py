import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from hvdtrain.core.errors import DataError
from hvdtrain.data import tfrecord


def records(n=50, length=16, seed=0):
    rng = np.random.RandomState(seed)
    ids = rng.randint(0, 40000, size=(n, length)).astype(np.int64)
    ids[0, 0] = -3  # negative int64s encode as 10-byte two's complement
    ids[1, 1] = 2 ** 62
    cols = {
        "input_ids": (tfrecord.INT64, ids),
        "label": (tfrecord.INT64, np.arange(n) % 3),
        "weight": (tfrecord.FLOAT, rng.rand(n, 2).astype(np.float32)),
        "key": (tfrecord.BYTES, [f"k{i}".encode() for i in range(n)]),
    }
    return cols, tfrecord.encode_examples(cols)


def test_encoding_matches_tensorflow_parse_example():
    import tensorflow as tf
    cols, recs = records()
    spec = {"input_ids": tf.io.FixedLenFeature([16], tf.int64), "label": tf.io.FixedLenFeature([], tf.int64),
            "weight": tf.io.FixedLenFeature([2], tf.float32), "key": tf.io.FixedLenFeature([], tf.string)}
    parsed = tf.io.parse_example(tf.constant(recs), spec)
    np.testing.assert_array_equal(parsed["input_ids"].numpy(), cols["input_ids"][1])
    np.testing.assert_array_equal(parsed["label"].numpy(), cols["label"][1])
    np.testing.assert_allclose(parsed["weight"].numpy(), cols["weight"][1])
    assert [k.decode() for k in parsed["key"].numpy()] == [f"k{i}" for i in range(50)]


def test_encoding_is_byte_identical_to_protobuf_and_framing_to_the_record_at_a_time_path():
    from tensorflow.core.example import example_pb2
    cols, recs = records()
    for i in (0, 1, 7):  # negatives, 2**62 and ordinary rows: what protobuf itself writes, byte for byte
        ex = example_pb2.Example()
        ex.features.feature["input_ids"].int64_list.value.extend(cols["input_ids"][1][i].tolist())
        ex.features.feature["label"].int64_list.value.append(int(cols["label"][1][i]))
        ex.features.feature["weight"].float_list.value.extend(cols["weight"][1][i].tolist())
        ex.features.feature["key"].bytes_list.value.append(cols["key"][1][i])
        assert example_pb2.Example.FromString(recs[i]) == ex
        assert recs[i] == ex.SerializeToString(deterministic=True)
    framed, count = tfrecord.encode_framed(cols)  # the batch path the ETL uses
    assert count == 50 and framed == b"".join(tfrecord.frame(r) for r in recs)
    assert list(tfrecord.iter_records(io.BytesIO(framed))) == recs
    values = np.array([[0, 1, 127, 128, 300, 16383, 16384, 2 ** 31 - 1, 2 ** 32, 2 ** 40, -1, -2 ** 63]], np.int64)
    data, lengths = tfrecord._varints(values)
    expected = b"".join(tfrecord._varint(int(x) & (2 ** 64 - 1)) for x in values[0])
    assert data.tobytes() == expected and lengths.tolist() == [len(expected)]


def test_packed_columns_decode_to_the_values_and_refuse_what_does_not_fit():
    import tensorflow as tf
    ids = np.array([[0, 1, 65535, 300], [7, 0, 0, 0]], np.int64)
    recs = tfrecord.encode_examples({"input_ids": tfrecord.int_column(ids, "u16le"),
                                     "wide": tfrecord.int_column(ids * 30000, "i32le"),
                                     "plain": tfrecord.int_column(ids)})
    parsed = tf.io.parse_example(tf.constant(recs), {"input_ids": tf.io.FixedLenFeature([], tf.string),
                                                      "wide": tf.io.FixedLenFeature([], tf.string),
                                                      "plain": tf.io.FixedLenFeature([4], tf.int64)})
    assert parsed["input_ids"].numpy().tolist() == [r.astype("<u2").tobytes() for r in ids]
    np.testing.assert_array_equal(tf.io.decode_raw(parsed["wide"], tf.int32).numpy(), ids * 30000)
    np.testing.assert_array_equal(parsed["plain"].numpy(), ids)
    with pytest.raises(ValueError, match="do not fit packed encoding u8"):
        tfrecord.pack(np.array([[1, 256]]), "u8")
    with pytest.raises(ValueError, match="-1..3"):
        tfrecord.pack(np.array([[-1, 3]]), "u16le")


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_files_read_back_with_tf_and_the_independent_tfrecord_package(tmp_path, compression):
    import tensorflow as tf
    cols, recs = records()
    path = tmp_path / "shard.tfrecord"
    with open(path, "wb") as fh:
        w = tfrecord.TFRecordWriter(fh, compression)
        w.write_many(recs[:20])
        w.write_columns({name: (kind, values[20:]) for name, (kind, values) in cols.items()})
        w.count_labels(cols["label"][1])
        stats = w.finish()
    assert stats.records == 50 and stats.bytes == path.stat().st_size
    assert stats.class_counts == {0: 17, 1: 17, 2: 16}
    ds = tf.data.TFRecordDataset(str(path), compression_type="GZIP" if compression == "gzip" else "")
    assert [r.numpy() for r in ds] == recs
    got = read_with_tfrecord_package(path, compression)
    assert got["keys"] == [f"k{i}" for i in range(50)]
    np.testing.assert_array_equal(np.array(got["input_ids"]), cols["input_ids"][1])


def read_with_tfrecord_package(paths, compression, description=None):
    """Decode files, in order, with the independent `tfrecord` package, in its own process:
    its example_pb2 clashes with TensorFlow's protos in one interpreter. Returns
    {feature: [value per record]} (ints and floats as lists, bytes decoded; kind "raw": bytes as hex)."""
    description = description or {"input_ids": "int", "key": "byte"}
    code = (
        "import json, sys\n"
        "from tfrecord.reader import tfrecord_loader\n"
        "desc = json.loads(sys.argv[2])\n"
        "out = {k: [] for k in desc}\n"
        "load = {k: 'byte' if kind == 'raw' else kind for k, kind in desc.items()}\n"
        "for path in sys.argv[3:]:\n"
        "    for r in tfrecord_loader(path, None, load, compression_type=sys.argv[1] or None):\n"
        "        for k, kind in desc.items():\n"
        "            v = r[k]\n"
        "            out[k].append(bytes(v).hex() if kind == 'raw' else bytes(v).decode() if kind == 'byte' "
        "else v.tolist())\n"
        "print(json.dumps(out))\n"
    )
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    out = subprocess.run([sys.executable, "-c", code, "gzip" if compression == "gzip" else "",
                          json.dumps(description), *map(str, paths)], capture_output=True, text=True, check=True)
    got = json.loads(out.stdout)
    if "key" in got:
        got["keys"] = got["key"]
    return got


def test_iter_records_checks_crcs_and_names_the_file():
    _, recs = records(5)
    buf = io.BytesIO()
    w = tfrecord.TFRecordWriter(buf)
    w.write_many(recs)
    w.finish()
    data = bytearray(buf.getvalue())
    assert list(tfrecord.iter_records(io.BytesIO(bytes(data)))) == recs
    data[30] ^= 0xFF
    with pytest.raises(DataError, match="shard-7: bad data checksum"):
        list(tfrecord.iter_records(io.BytesIO(bytes(data)), "shard-7"))
    with pytest.raises(DataError, match="truncated"):
        list(tfrecord.iter_records(io.BytesIO(bytes(buf.getvalue()[:-3])), "x"))


def test_byte_strings_from_arrow_buffers_encode_as_the_list_of_them():
    """The shard writer hands the key column over as Arrow's buffers (``ragged_of``): the same records as the
    list of byte strings, for sliced arrays (a batch's piece), 64-bit offsets, empty and non-ASCII values."""
    import pyarrow as pa

    keys = ["r1", "", "café", "東京", "x" * 300, "k"]
    arr = pa.array(keys)
    for piece in (arr, arr.slice(1, 4), arr.slice(5), pa.array(keys, pa.large_string()).slice(2, 3),
                  pa.array([k.encode() for k in keys], pa.binary()).slice(3)):
        got = tfrecord.encode_examples({"key": (tfrecord.BYTES, tfrecord.ragged_of(piece)),
                                        "n": (tfrecord.INT64, np.arange(len(piece)))})
        want = tfrecord.encode_examples({"key": (tfrecord.BYTES, piece.cast(pa.binary()).to_pylist()),
                                         "n": (tfrecord.INT64, np.arange(len(piece)))})
        assert got == want and len(got) == len(piece)
    with pytest.raises(ValueError, match="1 null value"):
        tfrecord.ragged_of(pa.array(["a", None]))
