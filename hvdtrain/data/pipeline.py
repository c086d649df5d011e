"""The tf.data graphs that read a rank's records: endless shuffled training batches, and
evaluation batches that read each record of a split exactly once across ranks.

chunk (sequential, deterministic order) -> one vectorized ``tf.io.parse_example``
per chunk (in parallel, in order), with a spec built from the manifest's
features only; packed features decoded to their narrow stored type ->
shuffle windows of ``shuffle_buffer`` parsed records (262,144 by default, fewer for long
records: :func:`hvdtrain.data.plan.shuffle_window`), each permuted uniformly,
with boundaries that move from pass to pass; the next window is assembled while
one is read -> batch -> packed features cast
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

from hvdtrain.core.errors import DataError
from hvdtrain.data.manifest import ENCODINGS, Manifest
from hvdtrain.data.plan import Share, file_seed, range_stream, resume_point, share, shuffle_seed, shuffle_window
from hvdtrain.data.staging import FileSource, check_local_shards, file_paths

if TYPE_CHECKING:
    import tensorflow as tf

INPUT_ORDER = 5  # version of the record order for a given seed (checkpoints record it): 2 shuffle windows,
# 3 contiguous shares, 4 chunks aligned to the file (a range's first and last chunks are short), 5 windows capped
# by the pass and by memory (plan.shuffle_window), a pass that fits one window shuffled whole

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


def as_written(fn: Any) -> Any:
    """A tf.data function traced as written, without AutoGraph's source conversion: these functions have no
    Python control flow on tensors, and the conversion cost each process most of a second of start-up."""
    import tensorflow as tf

    return tf.autograph.experimental.do_not_convert(fn)


def _ranges(source: FileSource, mine: Share, order: Iterator[int]) -> Iterator[tuple[str, int, int]]:
    """(local path, first record, record count) of each of ``mine``'s ranges in ``order``; the source yields
    the paths of the same shards in the same order."""
    paths = source.paths()
    for i in order:
        r = mine.ranges[i]
        yield next(paths), r.first, r.count


def _range_spec() -> Any:
    import tensorflow as tf

    return (tf.TensorSpec((), tf.string), tf.TensorSpec((), tf.int64), tf.TensorSpec((), tf.int64))


def _chunks(manifest: Manifest, source: FileSource, cycle_length: int, files: "tf.data.Dataset",
            chunk: int = CHUNK) -> "tf.data.Dataset":
    """Records of ``files`` ((path, first, count) ranges) as chunks, interleaved chunk by chunk in a
    deterministic order: ``(records, lo, hi)``, a 1-D string tensor of up to ``chunk`` consecutive records of
    one file, of which positions ``lo .. hi - 1`` belong to the range (:func:`_parsed` cuts them).

    The cut is per chunk, not per record: a ``skip``/``take`` on the record stream costs two tf.data steps
    for every record of every range (about 8% of the pipeline's CPU, ``make bench``: input_pipeline), though
    only a share's first and last ranges start or end inside a shard. Whole chunks before the range are
    still read (a TFRecord file has no index) but never parsed.
    """
    import tensorflow as tf

    compression = "GZIP" if manifest.compression == "gzip" else ""

    def read(path: tf.Tensor, first: tf.Tensor, count: tf.Tensor) -> tf.data.Dataset:
        skipped = first // chunk
        n = (first + count + chunk - 1) // chunk - skipped  # chunks the range touches
        index = tf.range(n)
        lo = tf.where(tf.equal(index, 0), first - skipped * chunk, 0)
        hi = tf.where(tf.equal(index, n - 1), first + count - (skipped + n - 1) * chunk, chunk)
        records = tf.data.TFRecordDataset(path, compression_type=compression).batch(chunk).skip(skipped).take(n)
        chunks = tf.data.Dataset.zip((records, tf.data.Dataset.from_tensor_slices(lo),
                                      tf.data.Dataset.from_tensor_slices(hi)))
        if source.release is None:
            return chunks
        # After the range's last record: release (delete) the staged copy; the marker itself is dropped.
        done = tf.data.Dataset.from_tensors(path).map(as_written(
            lambda p: tf.py_function(lambda q: source.release(q.numpy().decode()) or q, [p], tf.string)))
        zero = tf.constant(0, tf.int64)
        return chunks.concatenate(done.map(as_written(lambda p: (tf.reshape(p, [1]), zero, zero)))
                                  .filter(as_written(lambda *_: False)))

    # Sequential interleave: every file read here is on local disk (in place or staged), and a parallel
    # interleave's hand-off between threads costs more than the reads on 2 cores.
    return files.interleave(as_written(read), cycle_length=max(1, cycle_length), block_length=1)


def _parsed(chunks: "tf.data.Dataset", parser: Parser) -> "tf.data.Dataset":
    """Chunks of serialized records (:func:`_chunks`) -> dicts of tensors (packed features still narrow): the
    range's part of each chunk in one vectorized ``parse_example``, in parallel and in order."""
    import tensorflow as tf

    return chunks.map(as_written(lambda records, lo, hi: parser.narrow(records[lo:hi])), num_parallel_calls=tf.data.AUTOTUNE,
                      deterministic=True)


def _batches(records: "tf.data.Dataset", parser: Parser, batch_size: int,
             drop_remainder: bool) -> "tf.data.Dataset":
    """Parsed records (dicts of tensors with a leading record axis) -> batches as the model reads them."""
    import tensorflow as tf

    return (records.rebatch(batch_size, drop_remainder=drop_remainder)
            .map(as_written(parser.widen), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
            .prefetch(tf.data.AUTOTUNE))


# Bytes a parsed bytes value holds beyond its contents (tf.string's tstring header), and the contents assumed for
# one (the record key: IDs and timestamps are short).
_STRING_BYTES = 24 + 24


def record_bytes(manifest: Manifest, features: Optional[Sequence[str]] = None) -> int:
    """Bytes of one parsed record as a shuffle window holds it (packed features narrow), estimated from the
    manifest's feature specs."""
    import numpy as np

    total = 0
    for name in features if features is not None else list(manifest.features):
        spec = manifest.features[name]
        values = int(np.prod(spec.shape)) if spec.shape else 1
        if spec.encoding:
            total += values * np.dtype(ENCODINGS[spec.encoding]).itemsize
        elif spec.dtype == "bytes":
            total += values * _STRING_BYTES
        else:
            total += values * (8 if spec.dtype == "int64" else 4)
    return max(1, total)


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
                     skip: Any = 0, limit: Optional[int] = None) -> "tf.data.Dataset":
    """One pass of parsed chunks (:func:`_parsed`) as shuffled windows (dicts of tensors).

    The pass is cut into windows of ``window`` records, except the first,
    whose size is drawn in ``[1, window]`` so that window boundaries move from
    pass to pass (no two records are kept apart for good); a pass that fits in
    one window is one window, shuffled whole. Each window is
    permuted uniformly. ``seed`` is this pass's shape-[2] int64 seed; the first
    window's size and each window's permutation fold a distinct index into it.
    Only positions ``skip .. limit - 1`` of the shuffled pass are kept
    (``skip``: resuming mid-pass; ``limit``: the records an epoch trains on). Everything is a whole-tensor op on parsed, packed rows, so the
    cost per record is a few memcpy-like copies rather than a trip through a
    record-by-record shuffle buffer of serialized strings (2-4x faster on 2
    cores).
    """
    import tensorflow as tf

    fold = tf.random.experimental.stateless_fold_in
    if window >= per_pass:
        first = tf.constant(per_pass, tf.int64)
    else:
        first = 1 + tf.random.stateless_uniform([], seed=fold(seed, 0), maxval=window, dtype=tf.int64)
    windows = chunks.rebatch(window_sizes(per_pass, window, first))
    skip = tf.cast(skip, tf.int64)
    limit = tf.constant(per_pass if limit is None else limit, tf.int64)

    def shuffle(k: tf.Tensor, w: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        n = _length(w)
        order = tf.random.experimental.stateless_shuffle(tf.range(n), seed=fold(seed, k + 1))
        start = tf.where(tf.equal(k, 0), tf.constant(0, tf.int64), first + (k - 1) * window)
        order = order[tf.clip_by_value(skip - start, 0, n):tf.clip_by_value(limit - start, 0, n)]
        return {name: tf.gather(t, order) for name, t in w.items()}

    # prefetch(1): the next window is parsed and shuffled while this one is read, so a large window costs memory
    # (plan.WINDOW_BYTES) rather than a pause at every window boundary.
    return windows.enumerate().map(as_written(shuffle)).filter(as_written(lambda w: _length(w) > 0)).prefetch(1)


@dataclass(frozen=True)
class TrainStream:
    """Whose training stream: rank ``rank`` of ``size``, in batches of ``batch_size``, shuffled in windows of
    ``shuffle_buffer`` records from ``seed``, interleaving ``cycle_length`` files; each epoch (one pass over
    the rank's share) yields ``records_per_epoch`` records (0: the whole share)."""

    rank: int
    size: int
    batch_size: int
    shuffle_buffer: int
    seed: int
    cycle_length: int = 4
    records_per_epoch: int = 0


def train_dataset(manifest: Manifest, stream: TrainStream, *, features: Optional[Sequence[str]] = None,
                  stage_dir: Optional[str] = None, split: str = "train", force_staging: bool = False,
                  start_record: int = 0) -> "tf.data.Dataset":
    """An endless stream of parsed batches (dicts of tensors) for one rank, epoch after epoch.

    Epoch ``e`` is one pass over the rank's share (:func:`hvdtrain.data.plan.share`): its ranges in an order,
    and its records in shuffle windows, drawn from ``(seed, rank, e)``, cut to ``records_per_epoch``.
    ``start_record`` resumes the stream after that many of this rank's records (a multiple of
    ``batch_size`` keeps batches aligned with an uninterrupted run).
    """
    import tensorflow as tf

    mine = share([s.records for s in manifest.split(split).shards], stream.rank, stream.size)
    per_pass = mine.records
    per_epoch = stream.records_per_epoch or per_pass
    if per_pass == 0 or per_epoch > per_pass:
        raise DataError(f"split {split!r}: rank {stream.rank} of {stream.size} has {per_pass} records but an epoch "
                        f"takes {per_epoch}; the dataset is too small for this many ranks: produce more data or "
                        "use fewer ranks")
    check_local_shards(manifest, split, mine.shards)
    first_pass, skip = resume_point(start_record, per_epoch)
    order_seed, n = file_seed(stream.seed, stream.rank), len(mine.ranges)
    source = file_paths(manifest, split,
                        lambda: (mine.ranges[i].shard for i in range_stream(n, order_seed, start=first_pass)),
                        stage_dir, force_staging=force_staging)
    files = _PassFiles(source, mine, order_seed, first_pass)
    base_seed = shuffle_seed(stream.seed, stream.rank)
    parser = Parser(manifest, features)
    # Sized by every feature the dataset has, not the ones read: the order must not change with what is read
    # (train.record_trace adds the keys).
    window = shuffle_window(stream.shuffle_buffer, per_pass, record_bytes(manifest), stream.batch_size)
    # A window spans chunks of every file in the cycle, however small the window.
    cycles = min(n, stream.cycle_length)
    chunk = min(CHUNK, max(1, -(-window // cycles)))

    def one_pass(p: tf.Tensor) -> tf.data.Dataset:
        ranges = tf.data.Dataset.from_generator(files, args=(p,), output_signature=_range_spec())
        return shuffled_windows(_parsed(_chunks(manifest, source, cycles, ranges, chunk), parser),
                                per_pass=per_pass, window=window,
                                seed=tf.random.experimental.stateless_fold_in(tf.constant([base_seed, 0], tf.int64), p),
                                skip=tf.where(tf.equal(p, first_pass), skip, 0), limit=per_epoch)

    windows = tf.data.Dataset.counter(first_pass).flat_map(as_written(one_pass))
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


def without_autotune(dataset: "tf.data.Dataset") -> "tf.data.Dataset":
    """The dataset without tf.data's autotuning model, for an iterator that is dropped while it runs (an elastic
    reset drops every stream, with Python's lock held). Deleting an iterator waits for an optimization pass of
    its model in progress, and the model grows with every pass ``train_dataset`` reads: 2.4 s and 7.9 s at
    times after 3,000 and 10,000 batches here, and 10-19 s for some survivors of the elastic drill, while every
    other rank waited in the reset. Without the model, the deletion took under 10 ms in 10 of 10 tries, at
    the same reading speed (``AUTOTUNE`` parallelism and prefetch then fall back to tf.data's defaults)."""
    import tensorflow as tf

    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


class _PassFiles:
    """The ranges of pass ``p``: the share's ranges in that pass's order, with the local path of each.

    Passes are read one after another (``flat_map``), so one iterator over the
    source's endless sequence of paths serves them all (a stager keeps copying
    across pass boundaries); asking for the first pass again starts a new
    iterator (a new iteration of the dataset).
    """

    def __init__(self, source: FileSource, mine: Share, seed: int, first_pass: int):
        self._source, self._share, self._seed, self._first = source, mine, seed, first_pass
        self._it: Optional[Iterator[tuple[str, int, int]]] = None

    def __call__(self, p: Any) -> Iterator[tuple[str, int, int]]:
        if self._it is None or int(p) == self._first:
            order = range_stream(len(self._share.ranges), self._seed, start=self._first)
            self._it = _ranges(self._source, self._share, order)
        for _ in range(len(self._share.ranges)):
            yield next(self._it)


def eval_dataset(manifest: Manifest, split: str, *, rank: int, size: int, batch_size: int,
                 features: Optional[Sequence[str]] = None, stage_dir: Optional[str] = None) -> "tf.data.Dataset":
    """Parsed batches of this rank's share of a split, in manifest order; across ranks, every record once."""
    import tensorflow as tf

    mine = share([s.records for s in manifest.split(split).shards], rank, size)
    check_local_shards(manifest, split, mine.shards)
    source = file_paths(manifest, split, lambda: iter(mine.shards), stage_dir)
    ranges = tf.data.Dataset.from_generator(lambda: _ranges(source, mine, iter(range(len(mine.ranges)))),
                                            output_signature=_range_spec())
    parser = Parser(manifest, features)
    return _batches(_parsed(_chunks(manifest, source, 1, ranges), parser), parser, batch_size, drop_remainder=False)
