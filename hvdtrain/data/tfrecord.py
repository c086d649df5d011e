"""TFRecord files of ``tf.train.Example`` records, written without TensorFlow.

Spark executors write shards with this module, so a Python worker never
imports TensorFlow (seconds of start-up and hundreds of MB per worker). The
encoding is the protobuf wire format of ``tf.train.Example`` for the three
feature kinds, laid out with NumPy over a batch of rows; the framing is
TFRecord's (length, masked CRC32C of the length, data, masked CRC32C of the
data). The per-value loops (varints, copying each row's pieces together, the
CRCs) run compiled in ``hvdtrain_native`` (native/, installed beside this
package) when it is installed, else in NumPy: the same bytes, 5x slower (1,024 rows of 128 ids).
Tests check every record against ``tf.io.parse_example`` and the independent
``tfrecord`` package, and the two paths against each other.
"""
from __future__ import annotations

import functools
import hashlib
import operator
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Iterator, Mapping, Sequence

import google_crc32c
import numpy as np

from hvdtrain.core.errors import DataError
from hvdtrain.data.manifest import ENCODINGS

try:
    import hvdtrain_native as _native
except ImportError:  # not installed (pip install ./native): the NumPy loops, same bytes
    _native = None


def encoder_kind() -> str:
    """Which loops encode records here: ``native`` (hvdtrain_native) or ``numpy``."""
    return "native" if _native is not None else "numpy"

INT64 = "int64"
FLOAT = "float32"
BYTES = "bytes"
_MASK_DELTA = 0xA282EAD8


def masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Varint-encode a 2-D int array row by row.

    Returns (the concatenated bytes of all values, the byte length of each row).
    Negative int64 values encode as their 64-bit two's complement, as protobuf does.
    """
    if _native is None or values.size == 0:
        return _varints_numpy(values)
    v = np.ascontiguousarray(values.astype(np.int64, copy=False)).reshape(values.shape[0], -1)
    data, lengths = _native.varints(v, v.shape[1])
    return np.frombuffer(data, np.uint8), np.frombuffer(lengths, np.int64)


def _varints_numpy(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    v = values.astype(np.int64, copy=False).view(np.uint64).reshape(values.shape[0], -1)
    flat = v.ravel()
    if flat.size == 0:
        return np.empty(0, np.uint8), np.zeros(v.shape[0], np.int64)
    top = int(flat.max())
    if top < 0x80:  # one byte each (masks, labels, small ids)
        return flat.astype(np.uint8), np.full(v.shape[0], v.shape[1], np.int64)
    width = (top.bit_length() + 6) // 7
    f = flat.astype(np.uint32) if top < (1 << 32) else flat
    nbytes = np.ones(flat.shape, np.uint8)
    for k in range(1, width):
        nbytes += f >= (1 << (7 * k))
    groups = np.empty((flat.size, width), np.uint8)
    for k in range(width):
        groups[:, k] = (f >> (7 * k)) & 0x7F
        if k < width - 1:
            groups[:, k] |= (nbytes > k + 1).view(np.uint8) << 7
    data = groups[np.arange(width, dtype=np.uint8)[None, :] < nbytes[:, None]]
    return data, nbytes.reshape(v.shape).sum(axis=1, dtype=np.int64)


def _len_delimited(field_number: int, payload: bytes) -> bytes:
    return _varint((field_number << 3) | 2) + _varint(len(payload)) + payload


# -- batches of byte strings, vectorized ---------------------------------------------
#
# A batch of n byte strings is held as one uint8 array and the length of each
# string (a "ragged" batch). Protobuf messages of a batch are built with whole-
# array operations: per-row Python work is limited to one CRC call per record.

@dataclass
class Ragged:
    """n byte strings: their concatenated bytes and each one's length."""

    data: np.ndarray  # uint8
    lengths: np.ndarray  # int64, one per row

    def __len__(self) -> int:
        return len(self.lengths)

    def to_list(self) -> list[bytes]:
        blob = self.data.tobytes()
        ends = np.cumsum(self.lengths).tolist()
        return [blob[a:b] for a, b in zip([0, *ends[:-1]], ends)]


def ragged_of(array: Any) -> Ragged:
    """One byte string per row from an Arrow binary or string array without nulls (its buffers, no per-row Python).

    Raises:
        ValueError: when a row is null.
    """
    import pyarrow as pa

    if array.null_count:
        raise ValueError(f"{array.null_count} null value(s) where every row needs one")
    array = array.cast(pa.large_binary())  # 64-bit offsets whatever the input type
    offsets = np.frombuffer(array.buffers()[1], np.int64)[array.offset:array.offset + len(array) + 1]
    data = np.frombuffer(array.buffers()[2], np.uint8) if len(array) and offsets[-1] > offsets[0] \
        else np.empty(0, np.uint8)
    return Ragged(data[offsets[0]:offsets[-1]], np.diff(offsets))


class Const:
    """The same bytes in each of n rows, laid out (as a :class:`Ragged`) only when the NumPy loops need them."""

    def __init__(self, value: bytes, n: int):
        self.value = value
        self.n = n

    @property
    def lengths(self) -> np.ndarray:
        return np.full(self.n, len(self.value), np.int64)

    @property
    def data(self) -> np.ndarray:
        return np.tile(np.frombuffer(self.value, np.uint8), self.n)


def _assemble(parts: Sequence[Ragged | Const], n: int, framed: bool) -> bytes:
    """Row i of every part, in order, for each row, framed as TFRecords when ``framed`` (compiled loops)."""
    assert _native is not None
    pieces = [p.value if isinstance(p, Const) else (np.ascontiguousarray(p.data, np.uint8),
                                                    np.ascontiguousarray(p.lengths, np.int64)) for p in parts]
    return _native.assemble(pieces, n, framed)


def _concat(parts: Sequence[Ragged | Const]) -> Ragged:
    """Row by row: row i of the result is row i of every part, in order."""
    lens = np.stack([p.lengths for p in parts], axis=1)
    row_total = lens.sum(axis=1)
    row_start = np.cumsum(row_total) - row_total
    within = np.cumsum(lens, axis=1) - lens
    out = np.empty(int(row_total.sum()), np.uint8)
    for j, part in enumerate(parts):
        if part.data.size == 0:
            continue
        src_start = np.cumsum(part.lengths) - part.lengths
        shift = np.repeat(row_start + within[:, j] - src_start, part.lengths)
        out[np.arange(part.data.size) + shift] = part.data
    return Ragged(out, row_total)


@dataclass
class _Message:
    """A batch of messages not yet assembled: pieces laid end to end per row, and each row's total length.

    Wrapping a message in a field only prepends two small pieces (tag, varint
    length), so nested messages are built without copying their payloads; the
    bytes are copied once, by :func:`_concat`.
    """

    pieces: list[Ragged | Const]
    lengths: np.ndarray


def _raw(ragged: Ragged | Const) -> _Message:
    return _Message([ragged], ragged.lengths)


def _join(messages: Sequence[_Message]) -> _Message:
    return _Message([p for m in messages for p in m.pieces], functools.reduce(operator.add, (m.lengths for m in messages)))


def _delimited(field_number: int, inner: _Message) -> _Message:
    """Each row wrapped as a length-delimited protobuf field (tag, varint length, bytes)."""
    sizes, size_lengths = _varints(inner.lengths.reshape(-1, 1))
    return _Message([Const(bytes([(field_number << 3) | 2]), len(inner.lengths)), Ragged(sizes, size_lengths),
                     *inner.pieces], inner.lengths + size_lengths + 1)


def _feature(kind: str, values: np.ndarray | Ragged | Sequence) -> _Message:
    """Serialized ``Feature`` messages, one per row."""
    if kind == INT64:
        arr = np.asarray(values)
        data, lengths = _varints(arr.reshape(arr.shape[0], -1))
        return _delimited(3, _delimited(1, _raw(Ragged(data, lengths))))
    if kind == FLOAT:
        arr = np.ascontiguousarray(np.asarray(values, dtype="<f4").reshape(len(values), -1))
        packed = Ragged(arr.view(np.uint8).reshape(-1), np.full(arr.shape[0], arr.shape[1] * 4, np.int64))
        return _delimited(2, _delimited(1, _raw(packed)))
    if isinstance(values, Ragged):  # one bytes value per row, already laid end to end (:func:`ragged_of`)
        if kind != BYTES:
            raise ValueError(f"byte strings given for a {kind} feature; they make a bytes feature")
        return _delimited(1, _delimited(1, _raw(values)))
    if kind == BYTES and isinstance(values, np.ndarray) and values.ndim == 2 and values.dtype == np.uint8:
        # One bytes value per row: the row's bytes (a packed feature, see :func:`pack`), without a Python loop.
        arr = np.ascontiguousarray(values)
        packed = Ragged(arr.reshape(-1), np.full(arr.shape[0], arr.shape[1], np.int64))
        return _delimited(1, _delimited(1, _raw(packed)))
    if kind == BYTES:
        rows = [[row] if isinstance(row, (bytes, str)) else list(row) for row in values]
        items = [x.encode() if isinstance(x, str) else bytes(x) for row in rows for x in row]
        item_lengths = np.fromiter((len(x) for x in items), np.int64, len(items))
        entries = _concat(_delimited(1, _raw(Ragged(np.frombuffer(b"".join(items), np.uint8), item_lengths))).pieces)
        owner = np.repeat(np.arange(len(rows)), [len(r) for r in rows])
        per_row = np.bincount(owner, weights=entries.lengths, minlength=len(rows)).astype(np.int64)
        return _delimited(1, _raw(Ragged(entries.data, per_row)))
    raise ValueError(f"unknown feature kind {kind!r}; use int64, float32 or bytes")


def pack(values: np.ndarray, encoding: str) -> np.ndarray:
    """Rows of integers as the rows of bytes of a packed feature (``manifest.ENCODINGS``), a 2-D uint8 array.

    Raises:
        ValueError: when a value does not fit the encoding.
    """
    dtype = np.dtype(ENCODINGS[encoding])
    arr = np.asarray(values)
    arr = arr.reshape(arr.shape[0], -1)
    if arr.size:
        info = np.iinfo(dtype)
        low, high = int(arr.min()), int(arr.max())
        if low < info.min or high > info.max:
            raise ValueError(f"values {low}..{high} do not fit packed encoding {encoding} ({info.min}..{info.max})")
    return np.ascontiguousarray(arr.astype(dtype)).view(np.uint8)


def int_column(values: np.ndarray, encoding: str = "") -> tuple[str, np.ndarray]:
    """An int64 feature as a ``write_columns`` column: an int64_list, or packed bytes (``FeatureSpec.encoding``)."""
    return (BYTES, pack(values, encoding)) if encoding else (INT64, values)


def _examples(columns: Mapping[str, tuple[str, np.ndarray | Sequence]]) -> _Message:
    entries = []
    for name in sorted(columns):  # map entries in key order, as protobuf's deterministic serialization writes them
        kind, values = columns[name]
        feature = _feature(kind, values)
        key = _raw(Const(_len_delimited(1, name.encode()), len(feature.lengths)))
        entries.append(_delimited(1, _join([key, _delimited(2, feature)])))
    return _delimited(1, _join(entries))


def encode_batch(columns: Mapping[str, tuple[str, np.ndarray | Sequence]]) -> Ragged:
    """Serialize rows as ``tf.train.Example`` protos, as one ragged batch.

    Args:
        columns: feature name -> (kind, values), where values has one entry per
            row (a scalar or a fixed-length vector).
    """
    message = _examples(columns)
    if _native is None:
        return _concat(message.pieces)
    return Ragged(np.frombuffer(_assemble(message.pieces, len(message.lengths), False), np.uint8), message.lengths)


def encode_examples(columns: Mapping[str, tuple[str, np.ndarray | Sequence]]) -> list[bytes]:
    """Serialize rows as ``tf.train.Example`` protos, one ``bytes`` per row (see :func:`encode_batch`)."""
    return encode_batch(columns).to_list()


def encode_framed(columns: Mapping[str, tuple[str, np.ndarray | Sequence]]) -> tuple[bytes, int]:
    """Rows as framed TFRecords ready to append to a file, and how many (one copy of the bytes)."""
    message = _examples(columns)
    return _frame(message), len(message.lengths)


def frame(record: bytes) -> bytes:
    header = struct.pack("<Q", len(record))
    return header + struct.pack("<I", masked_crc(header)) + record + struct.pack("<I", masked_crc(record))


def frame_batch(records: Ragged) -> bytes:
    """Every record framed (length, its masked CRC, data, the data's masked CRC), concatenated."""
    return _frame(_raw(records))


def _frame(message: _Message) -> bytes:
    """Assemble records with room for their frames, then fill in lengths and CRCs."""
    n = len(message.lengths)
    if n == 0:
        return b""
    if _native is not None:
        return _assemble(message.pieces, n, True)
    framed = _concat([Const(bytes(12), n), *message.pieces, Const(bytes(4), n)])
    buf, lengths = framed.data, message.lengths
    starts = np.cumsum(framed.lengths) - framed.lengths
    buf[starts[:, None] + np.arange(8)] = lengths.astype("<u8").view(np.uint8).reshape(n, 8)
    length_crcs = {x: masked_crc(struct.pack("<Q", x)) for x in np.unique(lengths).tolist()}
    crcs = np.array([length_crcs[x] for x in lengths.tolist()], "<u4")
    buf[starts[:, None] + 8 + np.arange(4)] = crcs.view(np.uint8).reshape(n, 4)
    blob = buf.tobytes()
    crcs = np.array([masked_crc(blob[a:a + length]) for a, length in zip((starts + 12).tolist(), lengths.tolist())],
                    "<u4")
    buf[(starts + 12 + lengths)[:, None] + np.arange(4)] = crcs.view(np.uint8).reshape(n, 4)
    return buf.tobytes()


@dataclass
class ShardStats:
    """What a writer put in one file: the manifest's per-shard record."""

    records: int = 0
    bytes: int = 0
    sha256: str = ""
    class_counts: dict[int, int] = field(default_factory=dict)


class TFRecordWriter:
    """Appends framed records to a binary stream and keeps counts and checksum.

    With ``compression="gzip"`` the file is one gzip stream, as TensorFlow's
    ``TFRecordDataset(compression_type="GZIP")`` reads it. Size and SHA-256 are
    of the bytes as stored, so a staged copy can be verified without decoding.
    """

    def __init__(self, stream: BinaryIO, compression: str = "none"):
        if compression not in ("none", "gzip"):
            raise ValueError(f"compression must be none or gzip, got {compression!r}")
        self._stream = stream
        self._sha = hashlib.sha256()
        self._zip = zlib.compressobj(6, zlib.DEFLATED, 31) if compression == "gzip" else None
        self.stats = ShardStats()

    def _put(self, data: bytes) -> None:
        if data:
            self._stream.write(data)
            self._sha.update(data)
            self.stats.bytes += len(data)

    def write_many(self, records: Sequence[bytes] | Ragged) -> None:
        """Append records: a list of serialized records, or a batch from :func:`encode_batch`."""
        blob = frame_batch(records) if isinstance(records, Ragged) else b"".join(frame(r) for r in records)
        self._write_framed(blob, len(records))

    def write_columns(self, columns: Mapping[str, tuple[str, np.ndarray | Sequence]]) -> None:
        """Append rows given as columns (see :func:`encode_batch`), encoded and framed in one pass."""
        self._write_framed(*encode_framed(columns))

    def _write_framed(self, blob: bytes, count: int) -> None:
        self._put(self._zip.compress(blob) if self._zip else blob)
        self.stats.records += count

    def count_labels(self, labels: np.ndarray) -> None:
        ids, counts = np.unique(np.asarray(labels), return_counts=True)
        for i, c in zip(ids.tolist(), counts.tolist()):
            self.stats.class_counts[i] = self.stats.class_counts.get(i, 0) + c

    def finish(self) -> ShardStats:
        """Flush compression and seal the stats; the caller closes the stream."""
        if self._zip is not None:
            self._put(self._zip.flush())
            self._zip = None
        self.stats.sha256 = self._sha.hexdigest()
        return self.stats


def iter_records(stream: BinaryIO, name: str = "<stream>") -> Iterator[bytes]:
    """Read framed records back, checking both CRCs; names the file on damage."""
    offset = 0
    while True:
        header = stream.read(12)
        if not header:
            return
        if len(header) < 12:
            raise DataError(f"{name}: truncated TFRecord header at byte {offset}; the shard is damaged, rerun the ETL")
        (length,) = struct.unpack("<Q", header[:8])
        if struct.unpack("<I", header[8:])[0] != masked_crc(header[:8]):
            raise DataError(f"{name}: bad length checksum at byte {offset}; the shard is damaged, rerun the ETL")
        body = stream.read(length + 4)
        if len(body) < length + 4:
            raise DataError(f"{name}: truncated record at byte {offset}; the shard is damaged, rerun the ETL")
        data = body[:length]
        if struct.unpack("<I", body[length:])[0] != masked_crc(data):
            raise DataError(f"{name}: bad data checksum at byte {offset}; the shard is damaged, rerun the ETL")
        offset += 12 + length + 4
        yield data
