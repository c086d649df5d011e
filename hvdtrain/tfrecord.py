"""TFRecord files of ``tf.train.Example`` records, written without TensorFlow.

Spark executors write shards with this module, so a Python worker never
imports TensorFlow (seconds of start-up and hundreds of MB per worker). The
encoding is the protobuf wire format of ``tf.train.Example`` for the three
feature kinds, vectorized with NumPy over a batch of rows; the framing is
TFRecord's (length, masked CRC32C of the length, data, masked CRC32C of the
data). Tests check every record against ``tf.io.parse_example`` and the
independent ``tfrecord`` package.
"""
from __future__ import annotations

import hashlib
import struct
import zlib
from dataclasses import dataclass, field
from typing import BinaryIO, Iterator, Mapping, Sequence

import google_crc32c
import numpy as np

from hvdtrain.errors import DataError

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
    v = values.astype(np.int64, copy=False).view(np.uint64).reshape(values.shape[0], -1)
    flat = v.ravel()
    nbytes = np.ones(flat.shape, dtype=np.int64)
    for k in range(1, 10):
        nbytes += flat >= np.uint64(1 << (7 * k))
    width = int(nbytes.max()) if flat.size else 1
    shifts = (np.arange(width, dtype=np.uint64) * np.uint64(7))[None, :]
    groups = ((flat[:, None] >> shifts) & np.uint64(0x7F)).astype(np.uint8)
    pos = np.arange(width)[None, :]
    groups |= np.where(pos < (nbytes[:, None] - 1), 0x80, 0).astype(np.uint8)
    data = groups[pos < nbytes[:, None]]
    return data, nbytes.reshape(v.shape).sum(axis=1)


def _len_delimited(field_number: int, payload: bytes) -> bytes:
    return _varint((field_number << 3) | 2) + _varint(len(payload)) + payload


def _feature_payloads(kind: str, values: np.ndarray | Sequence) -> list[bytes]:
    """Serialized ``Feature`` messages, one per row."""
    if kind == INT64:
        arr = np.asarray(values)
        arr = arr.reshape(arr.shape[0], -1)
        data, lengths = _varints(arr)
        data = data.tobytes()
        out, start = [], 0
        for n in lengths.tolist():
            packed = data[start:start + n]
            start += n
            out.append(_len_delimited(3, _len_delimited(1, packed)))
        return out
    if kind == FLOAT:
        arr = np.asarray(values, dtype="<f4")
        arr = arr.reshape(arr.shape[0], -1)
        return [_len_delimited(2, _len_delimited(1, row.tobytes())) for row in arr]
    if kind == BYTES:
        out = []
        for row in values:
            items = [row] if isinstance(row, (bytes, str)) else list(row)
            body = b"".join(_len_delimited(1, x.encode() if isinstance(x, str) else bytes(x)) for x in items)
            out.append(_len_delimited(1, body))
        return out
    raise ValueError(f"unknown feature kind {kind!r}; use int64, float32 or bytes")


def encode_examples(columns: Mapping[str, tuple[str, np.ndarray | Sequence]]) -> list[bytes]:
    """Serialize rows as ``tf.train.Example`` protos.

    Args:
        columns: feature name -> (kind, values), where values has one entry per
            row (a scalar or a fixed-length vector).
    """
    per_feature = []
    for name, (kind, values) in columns.items():
        key = _len_delimited(1, name.encode())
        per_feature.append([_len_delimited(1, key + _len_delimited(2, f)) for f in _feature_payloads(kind, values)])
    rows = zip(*per_feature)
    return [_len_delimited(1, b"".join(entries)) for entries in rows]


def frame(record: bytes) -> bytes:
    header = struct.pack("<Q", len(record))
    return header + struct.pack("<I", masked_crc(header)) + record + struct.pack("<I", masked_crc(record))


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

    def write_many(self, records: Sequence[bytes]) -> None:
        blob = b"".join(frame(r) for r in records)
        self._put(self._zip.compress(blob) if self._zip else blob)
        self.stats.records += len(records)

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
