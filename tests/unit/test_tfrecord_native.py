"""The compiled loops of the TFRecord writer (native/hvdtrain_native.c) against the NumPy encoder they replace,
byte for byte, and against google-crc32c; test_tfrecord.py holds both to protobuf and TensorFlow."""
import io
import zlib

import numpy as np
import pytest

from hvdtrain.data import tfrecord


@pytest.fixture
def native():
    """The compiled module. make env installs native/ (scripts/bootstrap.sh); without it every shard is written
    by the NumPy loops, and these tests fail (not skip): the environment is incomplete."""
    if tfrecord.encoder_kind() != "native":
        pytest.fail("hvdtrain_native is not installed: run make env (or pip install ./native)")
    import hvdtrain_native

    return hvdtrain_native


def test_the_project_environment_has_it(native):
    assert native.__name__ == "hvdtrain_native"


def keys(values):
    data = b"".join(values)
    return tfrecord.Ragged(np.frombuffer(data, np.uint8).copy(), np.array([len(v) for v in values], np.int64))


def batch(n, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 40_000, (n, 64))
    if n:
        edges = np.array([0, 1, 127, 128, 16383, 16384, 2 ** 21, 2 ** 31 - 1, 2 ** 32, 2 ** 56, 2 ** 63 - 1, -1,
                          -2 ** 63, -300], np.int64)
        ids[0, :len(edges)] = edges
    return {
        "input_ids": (tfrecord.INT64, ids),
        "mask": tfrecord.int_column(rng.integers(0, 2, (n, 64)), "u8"),
        "label": (tfrecord.INT64, rng.integers(0, 5, n)),
        "numeric": (tfrecord.FLOAT, rng.normal(size=(n, 3)).astype(np.float32)),
        "empty": (tfrecord.INT64, np.zeros((n, 0), np.int64)),
        "key": (tfrecord.BYTES, keys([("é\x00" * (i % 3) + str(i)).encode() if i % 5 else b"" for i in range(n)])),
        "tags": (tfrecord.BYTES, [[b"a", b""] if i % 2 else [b"x" * 200] for i in range(n)]),
    }


def numpy_only(monkeypatch, fn, *args):
    with monkeypatch.context() as m:
        m.setattr(tfrecord, "_native", None)
        assert tfrecord.encoder_kind() == "numpy"
        return fn(*args)


@pytest.mark.parametrize("n,seed", [(1, 1), (7, 2), (1024, 3)])
def test_records_are_the_bytes_the_numpy_encoder_writes(native, monkeypatch, n, seed):
    cols = batch(n, seed)
    framed = tfrecord.encode_framed(cols)
    assert framed == numpy_only(monkeypatch, tfrecord.encode_framed, cols)
    records = tfrecord.encode_batch(cols)
    reference = numpy_only(monkeypatch, tfrecord.encode_batch, cols)
    assert records.data.tobytes() == reference.data.tobytes()
    assert records.lengths.tolist() == reference.lengths.tolist()
    assert tfrecord.frame_batch(records) == numpy_only(monkeypatch, tfrecord.frame_batch, records) == framed[0]
    assert list(tfrecord.iter_records(io.BytesIO(framed[0]))) == records.to_list()


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_a_file_is_the_file_the_numpy_encoder_writes(native, monkeypatch, compression):
    def write(cols_list):
        stream = io.BytesIO()
        writer = tfrecord.TFRecordWriter(stream, compression)
        for cols in cols_list:
            writer.write_columns(cols)
        return writer.finish(), stream.getvalue()

    batches = [batch(300, s) for s in range(3)]
    stats, data = write(batches)
    ref_stats, ref_data = numpy_only(monkeypatch, write, batches)
    assert data == ref_data and stats == ref_stats and stats.records == 900
    if compression == "gzip":
        data = zlib.decompress(data, 31)
    assert len(list(tfrecord.iter_records(io.BytesIO(data)))) == 900


def test_varints_of_every_width_and_sign(native):
    values = np.array([[(1 << k) - 1, 1 << k, -(1 << k)] for k in range(63)], np.int64)
    data, lengths = tfrecord._varints(values)
    expected = [b"".join(tfrecord._varint(int(x) & (2 ** 64 - 1)) for x in row) for row in values]
    assert data.tobytes() == b"".join(expected)
    assert lengths.tolist() == [len(e) for e in expected]


@pytest.mark.parametrize("software", [False, True])
def test_masked_crc_is_google_crc32c_masked(native, software):
    rng = np.random.default_rng(0)
    for length in list(range(0, 40)) + [255, 256, 1000, 4099]:
        data = rng.integers(0, 256, length, np.uint8).tobytes()
        assert native.masked_crc32c(data, software) == tfrecord.masked_crc(data), length


def test_pieces_that_do_not_add_up_are_refused(native):
    data = np.arange(6, dtype=np.uint8)
    with pytest.raises(ValueError, match="add up to 5 bytes, its data has 6"):
        native.assemble([(data, np.array([2, 3], np.int64))], 2, True)
    with pytest.raises(ValueError, match="8 bytes of lengths for 2 rows"):
        native.assemble([(data, np.array([6], np.int64))], 2, True)
    with pytest.raises(ValueError, match="row 0 has length -1"):
        native.assemble([b"ab", (data, np.array([-1, 7], np.int64))], 2, False)
    with pytest.raises(ValueError, match="not rows of 3 int64"):
        native.varints(np.arange(4, dtype=np.int64), 3)
    assert native.assemble([b"ab", (data, np.array([1, 5], np.int64))], 2, False) == b"ab\x00ab\x01\x02\x03\x04\x05"
