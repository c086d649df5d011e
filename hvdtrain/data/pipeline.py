"""The tf.data graphs that read a rank's records: endless shuffled training batches, and
evaluation batches that read each record of a split exactly once across ranks.

chunk (sequential, deterministic order) -> one vectorized ``tf.io.parse_example``
per chunk (in parallel, in order), with a spec built from the manifest's
features only; packed features decoded to their narrow stored type ->
shuffle windows of ``shuffle_buffer`` parsed records, each permuted uniformly,
with boundaries that move from pass to pass -> batch -> packed features cast
to int64 -> prefetch. Every step handles whole tensors: tf.data's cost per
element is paid per chunk or window, and the shuffle moves parsed rows, not
serialized strings (``make bench``: input_pipeline).

Evaluation reads each record of a split exactly once across ranks (whole
shards per rank, or record-level when there are fewer shards than ranks), in
manifest order, without repeat, keeping the final partial batch.

TensorFlow is imported inside the functions, so importing this module stays cheap.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Optional, Sequence

from hvdtrain.data.plan import (file_seed, plan_eval_reads, plan_train_reads, records_per_pass, resume_point,
                                shard_stream, shuffle_seed)
from hvdtrain.data.staging import FileSource, check_local_shards, file_paths
from hvdtrain.errors import DataError
from hvdtrain.manifest import Manifest

if TYPE_CHECKING:
    import tensorflow as tf

INPUT_ORDER = 2  # version of the record order for a given seed; 2: shuffle windows (checkpoints record it)

_TF_DTYPES = {"int64": "int64", "float32": "float32", "bytes": "string"}



class Parser:
    """Serialized records -> tensors of some (default: all) manifest features, as the manifest describes them.

    Plain features come straight out of ``tf.io.parse_example``; packed ones
    (``FeatureSpec.encoding``) are parsed as one bytes value per record and
    decoded for the whole batch at once, to int64 of the feature's shape.
    """

    def __init__(self, manifest: Manifest, names: Optional[Sequence[str]] = None):
        import numpy as np
        import tensorflow as tf

        from hvdtrain.manifest import ENCODINGS

        self.spec: dict[str, Any] = {}
        self.packed: dict[str, tuple[Any, list[int]]] = {}
        for name in names if names is not None else list(manifest.features):
            feature = manifest.features.get(name)
            if feature is None:
                raise DataError(f"feature {name!r} is not in the dataset (it has {', '.join(manifest.features)})")
            if feature.dtype not in _TF_DTYPES:
                raise DataError(f"feature {name!r} has dtype {feature.dtype!r}; readers know {', '.join(_TF_DTYPES)}")
            if feature.encoding:
                self.spec[name] = tf.io.FixedLenFeature([], tf.string)
                self.packed[name] = (tf.dtypes.as_dtype(np.dtype(ENCODINGS[feature.encoding])), list(feature.shape))
            else:
                self.spec[name] = tf.io.FixedLenFeature(feature.shape, getattr(tf, _TF_DTYPES[feature.dtype]))

    def _unpack(self, parsed: dict[str, Any], lead: list[int]) -> dict[str, Any]:
        import tensorflow as tf

        for name, (dtype, shape) in self.packed.items():
            values = tf.io.decode_raw(parsed[name], dtype, little_endian=True)  # a wrong width fails the reshape
            parsed[name] = tf.reshape(values, [*lead, *shape])
        return parsed

    def narrow(self, serialized: Any) -> dict[str, Any]:
        """A 1-D batch of serialized records, with packed features decoded to their narrow stored type
        (shape ``[n, *shape]``): what shuffling and batching move around, 2-8x fewer bytes than int64."""
        import tensorflow as tf

        return self._unpack(tf.io.parse_example(serialized, self.spec), [tf.shape(serialized)[0]])

    def widen(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Packed features of a :meth:`narrow` batch as int64, the dtype the manifest declares."""
        import tensorflow as tf

        return {k: tf.cast(v, tf.int64) if k in self.packed else v for k, v in batch.items()}

    def batch(self, serialized: Any) -> dict[str, Any]:
        """A 1-D batch of serialized records, every feature as the manifest declares it."""
        return self.widen(self.narrow(serialized))

    def single(self, serialized: Any) -> dict[str, Any]:
        """One serialized record, every feature as the manifest declares it."""
        import tensorflow as tf

        return self.widen(self._unpack(tf.io.parse_single_example(serialized, self.spec), []))


CHUNK = 256  # records a reader hands on at once: tf.data's per-element cost is paid per chunk, not per record


def _chunks(manifest: Manifest, source: FileSource, cycle_length: int,
            files: Optional["tf.data.Dataset"] = None, chunk: int = CHUNK) -> "tf.data.Dataset":
    """Records of the source's files (or of ``files``, paths from it) as chunks: 1-D string tensors of
    up to ``chunk`` consecutive records of one file, interleaved chunk by chunk in a deterministic order."""
    import tensorflow as tf

    compression = "GZIP" if manifest.compression == "gzip" else ""
    if files is None:
        files = tf.data.Dataset.from_generator(source.paths, output_signature=tf.TensorSpec((), tf.string))

    def read(path: tf.Tensor) -> tf.data.Dataset:
        chunks = tf.data.TFRecordDataset(path, compression_type=compression).batch(chunk)
        if source.release is None:
            return chunks
        # After the file's last record: release (delete) the staged copy; the marker itself is dropped.
        done = tf.data.Dataset.from_tensors(path).map(
            lambda p: tf.py_function(lambda q: source.release(q.numpy().decode()) or q, [p], tf.string))
        return chunks.concatenate(done.map(lambda p: tf.reshape(p, [1])).filter(lambda _: False))

    # Sequential interleave: every file read here is on local disk (in place or staged), and a parallel
    # interleave's hand-off between threads costs more than the reads on 2 cores.
    return files.interleave(read, cycle_length=max(1, cycle_length), block_length=1)


def _strided(chunks: "tf.data.Dataset", stride: int, offset: int) -> "tf.data.Dataset":
    """Record-level sharding of a chunk stream: the records whose position is ``offset`` mod ``stride``."""
    import tensorflow as tf

    if stride == 1:
        return chunks

    def keep(seen: tf.Tensor, chunk: tf.Tensor):
        start = tf.math.floormod(offset - seen, stride)
        return seen + tf.shape(chunk, out_type=tf.int64)[0], chunk[start::stride]

    return chunks.scan(tf.constant(0, tf.int64), keep).filter(lambda c: tf.size(c) > 0)


def _parsed(chunks: "tf.data.Dataset", parser: Parser) -> "tf.data.Dataset":
    """Chunks of serialized records -> dicts of tensors (packed features still narrow), one vectorized
    ``parse_example`` per chunk, in parallel and in order."""
    import tensorflow as tf

    return chunks.map(parser.narrow, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def _batches(records: "tf.data.Dataset", parser: Parser, batch_size: int,
             drop_remainder: bool) -> "tf.data.Dataset":
    """Parsed records (dicts of tensors with a leading record axis) -> batches as the model reads them."""
    import tensorflow as tf

    return (records.rebatch(batch_size, drop_remainder=drop_remainder)
            .map(parser.widen, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
            .prefetch(tf.data.AUTOTUNE))


def _length(records: Any) -> Any:
    """Records in a dict of tensors with a leading record axis."""
    import tensorflow as tf

    return tf.shape(tf.nest.flatten(records)[0], out_type=tf.int64)[0]


def window_sizes(per_pass: int, window: int, first: Any) -> Any:
    """Sizes of a pass's shuffle windows: ``first`` records, then ``window`` each.

    Enough entries to cover the pass (``rebatch`` cycles through them); the
    last window of a pass is whatever remains.
    """
    import tensorflow as tf

    rest = tf.fill([per_pass // window + 1], tf.constant(window, tf.int64))
    return tf.concat([tf.reshape(tf.cast(first, tf.int64), [1]), rest], 0)


def shuffled_windows(chunks: "tf.data.Dataset", *, per_pass: int, window: int, seed: Any,
                     skip: Any = 0) -> "tf.data.Dataset":
    """One pass of parsed chunks (:func:`_parsed`) as shuffled windows (dicts of tensors).

    The pass is cut into windows of ``window`` records, except the first,
    whose size is drawn in ``[1, window]`` so that window boundaries move from
    pass to pass (no two records are kept apart for good). Each window is
    permuted uniformly. ``seed`` is this pass's shape-[2] int64 seed; the first
    window's size and each window's permutation fold a distinct index into it.
    The first ``skip`` records of the shuffled pass are dropped (resuming
    mid-pass). Everything is a whole-tensor op on parsed, packed rows, so the
    cost per record is a few memcpy-like copies rather than a trip through a
    record-by-record shuffle buffer of serialized strings (2-4x faster on 2
    cores).
    """
    import tensorflow as tf

    fold = tf.random.experimental.stateless_fold_in
    first = 1 + tf.random.stateless_uniform([], seed=fold(seed, 0), maxval=window, dtype=tf.int64)
    windows = chunks.rebatch(window_sizes(per_pass, window, first))
    skip = tf.cast(skip, tf.int64)

    def shuffle(k: tf.Tensor, w: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        n = _length(w)
        order = tf.random.experimental.stateless_shuffle(tf.range(n), seed=fold(seed, k + 1))
        start = tf.where(tf.equal(k, 0), tf.constant(0, tf.int64), first + (k - 1) * window)
        order = order[tf.clip_by_value(skip - start, 0, n):]
        return {name: tf.gather(t, order) for name, t in w.items()}

    return windows.enumerate().map(shuffle).filter(lambda w: _length(w) > 0)


@dataclass(frozen=True)
class TrainStream:
    """Whose training stream: rank ``rank`` of ``size``, in batches of ``batch_size``, shuffled in windows of
    ``shuffle_buffer`` records from ``seed``, interleaving ``cycle_length`` files."""

    rank: int
    size: int
    batch_size: int
    shuffle_buffer: int
    seed: int
    cycle_length: int = 4


def train_dataset(manifest: Manifest, stream: TrainStream, *, features: Optional[Sequence[str]] = None,
                  stage_dir: Optional[str] = None, split: str = "train", force_staging: bool = False,
                  start_record: int = 0) -> "tf.data.Dataset":
    """An endless stream of parsed batches (dicts of tensors) for one rank; see the package rules.

    ``stream.shuffle_buffer`` is the size of a shuffle window (:func:`shuffled_windows`).
    ``start_record`` resumes the stream after that many of this rank's records
    (a multiple of ``batch_size`` keeps batches aligned with an uninterrupted run).
    """
    import tensorflow as tf

    rank, size, seed = stream.rank, stream.size, stream.seed
    shard_records = [s.records for s in manifest.split(split).shards]
    plan = plan_train_reads(shard_records, rank, size)
    n = len(plan.shards)
    if n == 0:
        raise DataError(f"split {split!r} has no shards for rank {rank}; the dataset is empty: rerun the ETL")
    check_local_shards(manifest, split, plan.shards)
    per_pass = records_per_pass(plan, shard_records)
    first_pass, skip = resume_point(start_record, per_pass)
    order_seed = file_seed(seed, rank, plan)
    source = file_paths(manifest, split, lambda: shard_stream(plan.shards, order_seed, start=first_pass), stage_dir,
                        force_staging=force_staging)
    paths = _PassFiles(source, n, first_pass)
    base_seed = shuffle_seed(seed, rank)
    parser = Parser(manifest, features)
    # A window spans chunks of every file in the cycle, however small the window.
    cycles = min(n, stream.cycle_length)
    chunk = min(CHUNK, max(1, -(-stream.shuffle_buffer // cycles)))

    def one_pass(p: tf.Tensor) -> tf.data.Dataset:
        files = tf.data.Dataset.from_generator(paths, args=(p,), output_signature=tf.TensorSpec((), tf.string))
        chunks = _strided(_chunks(manifest, source, cycles, files, chunk), plan.stride, plan.offset)
        return shuffled_windows(_parsed(chunks, parser), per_pass=per_pass, window=stream.shuffle_buffer,
                                seed=tf.random.experimental.stateless_fold_in(
                                    tf.constant([base_seed, 0], tf.int64), p),
                                skip=tf.where(tf.equal(p, first_pass), skip, 0))

    windows = tf.data.Dataset.counter(first_pass).flat_map(one_pass)
    return _batches(windows, parser, stream.batch_size, drop_remainder=True)


def with_threads(dataset: "tf.data.Dataset", threads: int) -> "tf.data.Dataset":
    """The dataset on a private pool of ``threads`` threads (this rank's CPU budget); 0 keeps TF's default,
    which sizes the pool from the host's cores, not from a container's quota."""
    import tensorflow as tf

    if threads <= 0:
        return dataset
    options = tf.data.Options()
    options.threading.private_threadpool_size = threads
    return dataset.with_options(options)


class _PassFiles:
    """The files of pass ``p``: the next ``n`` paths of the source's endless sequence.

    Passes are read one after another (``flat_map``), so one iterator over the
    sequence serves them all (a stager keeps copying across pass boundaries);
    asking for the first pass again starts a new iterator (a new iteration of the dataset).
    """

    def __init__(self, source: FileSource, n: int, first_pass: int):
        self._source, self._n, self._first = source, n, first_pass
        self._it: Optional[Iterator[str]] = None

    def __call__(self, p: Any) -> Iterator[str]:
        if self._it is None or int(p) == self._first:
            if self._it is not None and hasattr(self._it, "close"):
                self._it.close()  # type: ignore[attr-defined]
            self._it = self._source.paths()
        for _ in range(self._n):
            yield next(self._it)


def eval_dataset(manifest: Manifest, split: str, *, rank: int, size: int, batch_size: int,
                 features: Optional[Sequence[str]] = None, stage_dir: Optional[str] = None) -> "tf.data.Dataset":
    """Parsed batches of this rank's part of a split; across ranks, every record exactly once."""
    import tensorflow as tf

    entries = manifest.split(split).shards
    plan = plan_eval_reads(len(entries), [s.records for s in entries], rank, size)
    check_local_shards(manifest, split, plan.shards)
    source = file_paths(manifest, split, lambda: iter(plan.shards), stage_dir)
    chunks = _chunks(manifest, source, cycle_length=1)  # manifest order: the same sequence on every rank
    parser = Parser(manifest, features)
    return _batches(_parsed(_strided(chunks, plan.stride, plan.offset), parser), parser, batch_size,
                    drop_remainder=False)
