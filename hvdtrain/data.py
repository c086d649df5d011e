"""Input pipelines: which rank reads what, and the tf.data graphs that read it.

Planning is pure (shard assignment, steps per epoch, read plans) and tested
without TensorFlow; the dataset builders are thin and import TensorFlow lazily.

Training reads an endless stream per rank. Rules:

* Every rank runs the same number of steps per epoch,
  ``floor(train_records / (batch_size * size))``, computed from the manifest,
  so no rank waits in an all-reduce that another rank never joins.
* Each rank reads its inputs as ONE stream of passes that repeats forever;
  pass ``p`` visits the rank's files in an order drawn from the seed
  ``(seed, p)`` and shuffles its records in windows seeded by rank and ``p``
  (:func:`shuffled_windows`). Epoch ``e`` is simply the next
  ``steps_per_epoch`` batches of that stream, so a record left over at the end
  of one epoch starts the next: no record is skipped systematically, however
  records and batches divide.
* Because a pass depends only on ``(seed, rank, p)``, the stream can be
  resumed exactly: after ``n`` records a rank is in pass
  ``n // records_per_pass`` at offset ``n % records_per_pass``
  (:func:`resume_point`); ``train_dataset(start_record=n)`` starts that pass
  and skips the offset, giving the same records an uninterrupted run reads.
* Shards go to ranks whole, balanced by record count (:func:`assign_shards`).
  When that is impossible or lopsided (fewer shards than ranks, or the lightest
  rank would hold less than ``1 / MAX_LOAD_RATIO`` of the heaviest) every rank
  reads every shard in the same order and keeps every ``size``-th record
  (record-level sharding): more reading, but each rank sees its fair share.
  Within the ratio, a lighter rank's records come round more often (at most
  ``MAX_LOAD_RATIO`` times as often as the heaviest rank's).

Pipeline: files read in chunks of ``CHUNK`` records, interleaved chunk by
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

Remote shards (``hdfs://``, ``webhdfs://``) are staged to local disk by a
background thread a few shards ahead of the reader and deleted behind it
(:mod:`hvdtrain.staging`): tf.data has no HDFS reader with TF 2.21
(tensorflow-io does not load). Local shards are read in place.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence

from hvdtrain import fs
from hvdtrain.config import ModelConfig
from hvdtrain.errors import DataError
from hvdtrain.manifest import FeatureSpec, Manifest

if TYPE_CHECKING:
    import tensorflow as tf

# The features each model kind reads. A transformer needs both; an MLP reads
# whichever of its features the dataset has (at least one).
MODEL_INPUTS: dict[str, tuple[str, ...]] = {
    "transformer": ("input_ids", "attention_mask"),
    "mlp": ("numeric", "categorical"),
}
MAX_LOAD_RATIO = 2.0
INPUT_ORDER = 2  # version of the record order for a given seed; 2: shuffle windows (checkpoints record it)
STAGE_AHEAD = 3  # remote shards staged in front of the reader
_TF_DTYPES = {"int64": "int64", "float32": "float32", "bytes": "string"}


# -- the contract between manifest and model ---------------------------------------

@dataclass(frozen=True)
class InputShape:
    """What the model builder needs to know about the data.

    Text datasets fill ``max_length`` and ``vocab_size``; tabular ones
    ``numeric_features`` (width of ``numeric``) and ``cardinalities`` (one per
    ``categorical`` column, unknown bucket included). ``inputs`` are the
    features the model reads, in order.
    """

    max_length: int
    vocab_size: int
    num_classes: int
    label_feature: str
    kind: str = "transformer"
    inputs: tuple[str, ...] = MODEL_INPUTS["transformer"]
    numeric_features: int = 0
    cardinalities: tuple[int, ...] = ()

    def input_specs(self) -> dict[str, tuple[str, list[int]]]:
        """(dtype, shape without the batch axis) of each model input."""
        specs = {"input_ids": ("int64", [self.max_length]), "attention_mask": ("int64", [self.max_length]),
                 "numeric": ("float32", [self.numeric_features]),
                 "categorical": ("int64", [len(self.cardinalities)])}
        return {name: specs[name] for name in self.inputs}


def model_inputs(kind: str, features: Sequence[str]) -> tuple[str, ...]:
    """The features a model of ``kind`` reads from a dataset with ``features`` (pure)."""
    if kind not in MODEL_INPUTS:
        raise DataError(f"model.kind {kind!r} has no input contract; use one of {', '.join(MODEL_INPUTS)}")
    if kind == "mlp":
        return tuple(name for name in MODEL_INPUTS[kind] if name in features)
    return MODEL_INPUTS[kind]


def required_features(model_cfg: ModelConfig, label_feature: str, max_length: int,
                      features: Sequence[str] = ()) -> dict[str, FeatureSpec]:
    """Features (dtype, shape) a model of this kind reads (pure); a wanted length of 0 means any."""
    wanted = {"input_ids": FeatureSpec("int64", [max_length]), "attention_mask": FeatureSpec("int64", [max_length]),
              "numeric": FeatureSpec("float32", [0]), "categorical": FeatureSpec("int64", [0])}
    inputs = model_inputs(model_cfg.kind, features)
    if not inputs:
        raise DataError(f"model.kind={model_cfg.kind} needs feature 'numeric' {_describe(wanted['numeric'])} "
                        f"and/or 'categorical' {_describe(wanted['categorical'])}, but the dataset has neither "
                        f"(it has {', '.join(features) or 'none'}): use model.kind=transformer for a text "
                        "dataset, or set source.numeric_columns/categorical_columns and rerun the ETL")
    return {**{name: wanted[name] for name in inputs}, label_feature: FeatureSpec("int64", [])}


def _fits(have: FeatureSpec, want: FeatureSpec) -> bool:
    """Same dtype and shape; a wanted length of 0 means "any positive length"."""
    if have.dtype != want.dtype or len(have.shape) != len(want.shape):
        return False
    return all(w == h if w else h > 0 for h, w in zip(have.shape, want.shape))


def _describe(spec: FeatureSpec, name: str = "") -> str:
    """``int64[12]``; a wanted length of 0 shows as ``max_length`` (text) or ``n`` (any width)."""
    free = "max_length" if name in MODEL_INPUTS["transformer"] else "n"
    return f"{spec.dtype}[{', '.join(str(d) if d else free for d in spec.shape)}]"


def _missing_fix(kind: str, features: Sequence[str]) -> str:
    """What to do about a missing model input: another model kind, or a newer ETL."""
    for other, names in MODEL_INPUTS.items():
        if other != kind and any(n in features for n in names):
            return f"the dataset has {other} inputs: set model.kind={other}, or rerun the ETL for {kind} features"
    return "rerun the ETL with this hvdtrain version"


def _check_features(manifest: Manifest, model_cfg: ModelConfig, wanted: dict[str, FeatureSpec]) -> None:
    where = manifest.location or "manifest"
    for name, want in wanted.items():
        have = manifest.features.get(name)
        if have is None:
            has = ", ".join(f"{k} {_describe(v)}" for k, v in manifest.features.items()) or "none"
            raise DataError(f"{where}: feature {name!r} is missing (the dataset has: {has}) but "
                            f"model.kind={model_cfg.kind} needs {name} {_describe(want, name)}; "
                            f"{_missing_fix(model_cfg.kind, list(manifest.features))}")
        if not _fits(have, want):
            raise DataError(f"{where}: feature {name!r} is {_describe(have)} in the dataset but "
                            f"model.kind={model_cfg.kind} needs {_describe(want, name)}; "
                            "rerun the ETL, or fix the feature spec it writes")


def check_manifest(manifest: Manifest, model_cfg: ModelConfig) -> InputShape:
    """Fail before training when the dataset cannot feed the model.

    Raises:
        DataError: naming the feature, the dataset's spec and the spec the model needs.
    """
    where = manifest.location or "manifest"
    ids = manifest.features.get("input_ids")
    max_length = ids.shape[0] if ids is not None and len(ids.shape) == 1 and ids.shape[0] > 0 else 0
    wanted = required_features(model_cfg, manifest.label_feature, max_length, list(manifest.features))
    _check_features(manifest, model_cfg, wanted)
    if manifest.num_classes < 2:
        raise DataError(f"{where}: labels {manifest.labels!r} has {manifest.num_classes} class(es); "
                        "a classifier needs >= 2: check the source's label column")
    inputs = tuple(name for name in wanted if name != manifest.label_feature)
    if model_cfg.kind == "mlp":
        return _tabular_shape(manifest, inputs)
    vocab_size = manifest.vocab.get("size")
    if not isinstance(vocab_size, int) or vocab_size <= 0:
        raise DataError(f"{where}: vocab.size is {vocab_size!r}; the embedding needs a positive vocabulary size: "
                        "rerun the ETL so the manifest records its vocabulary")
    return InputShape(max_length, vocab_size, manifest.num_classes, manifest.label_feature)


def _tabular_shape(manifest: Manifest, inputs: tuple[str, ...]) -> InputShape:
    """Sizes of the tabular features; categorical ones need the ETL's cardinalities."""
    where = manifest.location or "manifest"
    numeric = manifest.features["numeric"].shape[0] if "numeric" in inputs else 0
    cards: tuple[int, ...] = ()
    if "categorical" in inputs:
        width = manifest.features["categorical"].shape[0]
        found = manifest.preprocessing.get("tabular", {}).get("cardinalities")
        if (not isinstance(found, list) or len(found) != width
                or not all(isinstance(c, int) and c >= 1 for c in found)):
            raise DataError(f"{where}: preprocessing.tabular.cardinalities is {found!r}, but feature 'categorical' "
                            f"is int64[{width}]: the embeddings need one size >= 1 per column (unknown bucket "
                            "included); rerun the ETL with this hvdtrain version")
        cards = tuple(found)
    return InputShape(0, 0, manifest.num_classes, manifest.label_feature, kind="mlp", inputs=inputs,
                      numeric_features=numeric, cardinalities=cards)


# -- planning (pure) ------------------------------------------------------------------

def assign_shards(shard_records: Sequence[int], size: int) -> list[list[int]]:
    """Shard indices per rank, balanced by record count.

    Greedy largest-first: shards by descending records (ties by index) each go
    to the rank with the fewest records so far (ties by lowest rank). The same
    input always gives the same answer on every rank. Each rank's list is sorted.
    """
    if size < 1:
        raise ValueError(f"size must be >= 1 (got {size})")
    loads = [0] * size
    out: list[list[int]] = [[] for _ in range(size)]
    for index in sorted(range(len(shard_records)), key=lambda i: (-shard_records[i], i)):
        rank = min(range(size), key=lambda r: (loads[r], r))
        out[rank].append(index)
        loads[rank] += shard_records[index]
    return [sorted(x) for x in out]


def steps_per_epoch(total_records: int, batch_size: int, size: int, accum_steps: int = 1) -> int:
    """Optimizer steps every rank runs per epoch: whole global batches in one pass of the data.

    With gradient accumulation one optimizer step consumes ``accum_steps``
    batches on each rank, so the global batch is ``batch_size * accum_steps * size``.

    Raises:
        DataError: when the split does not fill one global batch.
    """
    global_batch = batch_size * accum_steps * size
    steps = total_records // global_batch
    if steps < 1:
        accum = f" x train.grad_accum_steps {accum_steps}" if accum_steps > 1 else ""
        raise DataError(f"the train split has {total_records} records, fewer than one global batch "
                        f"(train.batch_size {batch_size}{accum} x {size} ranks = {global_batch}); "
                        "lower train.batch_size or train.grad_accum_steps, use fewer ranks, or produce more data")
    return steps


@dataclass(frozen=True)
class ReadPlan:
    """What one rank opens: these shards, then every ``stride``-th record from ``offset``."""

    shards: tuple[int, ...]
    stride: int = 1
    offset: int = 0

    @property
    def record_level(self) -> bool:
        return self.stride > 1


def plan_train_reads(shard_records: Sequence[int], rank: int, size: int,
                     max_load_ratio: float = MAX_LOAD_RATIO) -> ReadPlan:
    """Whole balanced shards per rank, or record-level sharding when that is lopsided."""
    assignment = assign_shards(shard_records, size)
    loads = [sum(shard_records[i] for i in shards) for shards in assignment]
    if size == 1 or (min(loads) > 0 and max(loads) <= max_load_ratio * min(loads)):
        return ReadPlan(tuple(assignment[rank]))
    return ReadPlan(tuple(range(len(shard_records))), stride=size, offset=rank)


def plan_eval_reads(num_shards: int, shard_records: Sequence[int], rank: int, size: int) -> ReadPlan:
    """Every record once across ranks: whole shards, or record-level with fewer shards than ranks."""
    if num_shards >= size:
        return ReadPlan(tuple(assign_shards(shard_records, size)[rank]))
    return ReadPlan(tuple(range(num_shards)), stride=size, offset=rank)


def records_per_pass(plan: ReadPlan, shard_records: Sequence[int]) -> int:
    """Records a rank reads in one pass over its plan (pure)."""
    total = sum(shard_records[i] for i in plan.shards)
    return len(range(plan.offset, total, plan.stride)) if plan.record_level else total


def resume_point(consumed: int, per_pass: int) -> tuple[int, int]:
    """(pass, records to skip in it) after a rank has read ``consumed`` records (pure)."""
    if per_pass < 1:
        raise ValueError(f"a pass must hold at least one record (got {per_pass})")
    return divmod(consumed, per_pass)


def shuffle_seed(seed: int, rank: int) -> int:
    """Base of a rank's per-pass shuffle seeds (pass ``p`` folds ``p`` into ``(shuffle_seed, 0)``)."""
    return seed + 104729 * (rank + 1)


def file_seed(seed: int, rank: int, plan: ReadPlan) -> int:
    """Seed of the per-pass file order: shared by all ranks under record-level
    sharding (they must walk the same global sequence), per rank otherwise."""
    return seed if plan.record_level else seed + 7919 * (rank + 1)


# -- side effects: staging and tf.data ------------------------------------------------

def pass_order(n: int, seed: int, pass_index: int) -> list[int]:
    """The order in which a rank visits its ``n`` files in pass ``pass_index``."""
    import numpy as np

    return np.random.default_rng([seed, pass_index]).permutation(n).tolist()


def shard_stream(shards: Sequence[int], seed: int, passes: Optional[int] = None, start: int = 0) -> Iterator[int]:
    """Shard indices in reading order: pass after pass from pass ``start`` (forever when ``passes`` is None)."""
    p = start
    while passes is None or p < start + passes:
        for i in pass_order(len(shards), seed, p):
            yield shards[i]
        p += 1


def check_local_shards(manifest: Manifest, split: str, shards: Sequence[int]) -> None:
    """Fail before reading when a local shard is missing, naming it."""
    entries = manifest.split(split).shards
    for index in shards:
        uri = manifest.shard_uri(entries[index])
        if fs.is_local(uri) and not os.path.exists(fs.local_path(uri)):
            raise DataError(f"shard {entries[index].path} of split {split!r} is missing at {uri}; "
                            "the dataset is incomplete: rerun the ETL")


@dataclass
class FileSource:
    """Local file paths in reading order, and what to call when a file has been read."""

    paths: Callable[[], Iterator[str]]
    release: Optional[Callable[[str], None]] = None  # set when files are staged copies


def file_paths(manifest: Manifest, split: str, order: Callable[[], Iterator[int]], stage_dir: Optional[str],
               force_staging: bool = False, ahead: int = STAGE_AHEAD,
               copy: Callable[[str, str], Any] = fs.copy_to_local) -> FileSource:
    """Where the reader finds each shard, in reading order.

    Local shards are read in place. Remote ones (or all, with ``force_staging``,
    which benchmarks use to measure the remote path on local data) go through a
    :class:`~hvdtrain.staging.ShardStager` that copies ``ahead`` shards in front
    of the reader; each staged copy is deleted when its last record is read.
    """
    from hvdtrain.staging import ShardStager

    entries = manifest.split(split).shards
    uris = [manifest.shard_uri(e) for e in entries]
    if not force_staging and all(fs.is_local(u) for u in uris):
        return FileSource(lambda: (fs.local_path(uris[j]) for j in order()))
    if stage_dir is None:
        raise DataError(f"split {split!r} has remote shards ({uris[0]}); pass a local stage_dir to stage them in")
    live: list[ShardStager] = []

    def staged() -> Iterator[str]:
        folder = tempfile.mkdtemp(prefix=f"{split}-", dir=stage_dir)
        items = ((uris[j], os.path.basename(entries[j].path)) for j in order())
        stager = ShardStager(items, folder, ahead=ahead, copy=copy)
        live.append(stager)
        try:
            yield from stager
        finally:
            stager.close()
            live.remove(stager)
            shutil.rmtree(folder, ignore_errors=True)

    def release(path: str) -> None:
        for stager in list(live):
            stager.release(path)

    return FileSource(staged, release)


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


def train_dataset(manifest: Manifest, *, rank: int, size: int, batch_size: int, shuffle_buffer: int, seed: int,
                  features: Optional[Sequence[str]] = None, stage_dir: Optional[str] = None,
                  split: str = "train", cycle_length: int = 4, force_staging: bool = False,
                  start_record: int = 0) -> "tf.data.Dataset":
    """An endless stream of parsed batches (dicts of tensors) for one rank; see the module rules.

    ``shuffle_buffer`` is the size of a shuffle window (:func:`shuffled_windows`).
    ``start_record`` resumes the stream after that many of this rank's records
    (a multiple of ``batch_size`` keeps batches aligned with an uninterrupted run).
    """
    import tensorflow as tf

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
    cycles = min(n, cycle_length)
    chunk = min(CHUNK, max(1, -(-shuffle_buffer // cycles)))

    def one_pass(p: tf.Tensor) -> tf.data.Dataset:
        files = tf.data.Dataset.from_generator(paths, args=(p,), output_signature=tf.TensorSpec((), tf.string))
        chunks = _strided(_chunks(manifest, source, cycles, files, chunk), plan.stride, plan.offset)
        return shuffled_windows(_parsed(chunks, parser), per_pass=per_pass, window=shuffle_buffer,
                                seed=tf.random.experimental.stateless_fold_in(
                                    tf.constant([base_seed, 0], tf.int64), p),
                                skip=tf.where(tf.equal(p, first_pass), skip, 0))

    windows = tf.data.Dataset.counter(first_pass).flat_map(one_pass)
    return _batches(windows, parser, batch_size, drop_remainder=True)


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


# -- auditing the data order ---------------------------------------------------------------

KEY_FEATURE = "key"


def trace_batches(batches: Iterator[dict[str, Any]], folder: str, rank: int, first_batch: int,
                  key_feature: str = KEY_FEATURE) -> Iterator[dict[str, Any]]:
    """Pass batches through, appending ``<batch number>\t<keys>`` lines to ``<folder>/rank<R>.keys``.

    Batch numbers count this rank's batches from the start of training (a
    resumed run starts at ``first_batch``), so the lines of an interrupted run
    and of its resumption can be laid side by side with an uninterrupted run's.
    The first line of each run is ``# pid <pid> from <first_batch>``.
    """
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"rank{rank}.keys"), "a", buffering=1) as out:
        out.write(f"# pid {os.getpid()} from {first_batch}\n")
        for number, batch in enumerate(batches, start=first_batch):
            keys = batch[key_feature].numpy()
            out.write(f"{number}\t{','.join(k.decode() for k in keys)}\n")
            yield batch


def read_trace(path: str) -> dict[int, list[str]]:
    """A trace file as {batch number: keys}; a later run's line for a batch replaces an earlier one's."""
    out: dict[int, list[str]] = {}
    with open(path) as fh:
        for line in fh:
            if line.startswith("#") or "\t" not in line:
                continue
            number, keys = line.rstrip("\n").split("\t", 1)
            out[int(number)] = keys.split(",")
    return out
