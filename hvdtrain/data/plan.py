"""Which records each rank reads, and in which order (pure: no TensorFlow, no I/O).

Every rank runs the same number of optimizer steps per epoch
(:func:`steps_per_epoch`). Each rank reads a contiguous, equal share of the
split's records (:func:`share`): the split's records in manifest order are cut
into ``size`` runs whose lengths differ by at most one, so a shard may be split
between two ranks and is then read at record granularity. A rank opens only
the shards its share touches (with shards of equal size, at most
``ceil(shards / size) + 1``), whatever the number of shards: with fewer shards
than ranks, ranks share a shard instead of every rank reading every shard.

Training takes ``steps_per_epoch * batch_size * grad_accum_steps`` records of
its share per epoch, from a pass over the share shuffled anew each epoch: a
record is read at most once per epoch, fewer than ``size * batch_size *
grad_accum_steps`` records are left out, and which ones rotates with the
shuffle. A rank's stream is a pure function of the seed and the records it has
read, so it can be resumed exactly (:func:`resume_point`).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

from hvdtrain.core.config import TrainConfig
from hvdtrain.core.errors import DataError
from hvdtrain.data.manifest import Manifest


@dataclass(frozen=True)
class ShardRange:
    """Records ``first .. first + count - 1`` of shard ``shard`` (0-based, in file order)."""

    shard: int
    first: int
    count: int


@dataclass(frozen=True)
class Share:
    """One rank's contiguous share of a split, as record ranges of consecutive shards."""

    ranges: tuple[ShardRange, ...]

    @property
    def records(self) -> int:
        return sum(r.count for r in self.ranges)

    @property
    def shards(self) -> tuple[int, ...]:
        return tuple(r.shard for r in self.ranges)


def share_bounds(total: int, rank: int, size: int) -> tuple[int, int]:
    """[start, end) of rank ``rank``'s share of ``total`` records; the first ``total % size`` ranks get one more."""
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"rank {rank} of size {size} is not a rank")
    base, extra = divmod(total, size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def share(shard_records: Sequence[int], rank: int, size: int) -> Share:
    """Rank ``rank``'s contiguous share of a split whose shards hold ``shard_records`` records."""
    start, end = share_bounds(sum(shard_records), rank, size)
    ranges, offset = [], 0
    for index, n in enumerate(shard_records):
        lo, hi = max(start, offset), min(end, offset + n)
        if lo < hi:
            ranges.append(ShardRange(index, lo - offset, hi - lo))
        offset += n
    return Share(tuple(ranges))


def shard_warning(split: str, shards: int, size: int) -> Optional[str]:
    """The warning training gives when a split has fewer shards than ranks (None when it has enough).

    Ranks then share shards, which works but reads less in parallel; the fix is the ETL's setting.
    """
    if shards >= size:
        return None
    return (f"the {split} split has {shards} shard{'s' if shards != 1 else ''} for {size} ranks: ranks share shards "
            f"and read less in parallel; rerun the ETL with etl.min_shards_per_split >= {size} (a split too small "
            f"for {size} shards of etl.min_shard_mb each gets fewer: lower etl.min_shard_mb to split it anyway)")


# train.epochs: auto. Epochs fall with the square root of the train split's records (an epoch of a larger table is
# more steps, and it needs fewer of them): ceil(AUTO_EPOCHS_SCALE / sqrt(records)), at most AUTO_EPOCHS_MAX. The
# scale gives the epochs the quality tables were found to want (8 for flights' 269,000 train records, 20 for
# diamonds' 43,000); measured against a fixed 3 in docs/models.md ("How many epochs").
AUTO_EPOCHS_SCALE = 4000
AUTO_EPOCHS_MAX = 100


def auto_epochs(train_records: int) -> int:
    """``train.epochs: auto`` for a train split of ``train_records`` records (pure): at least 1, at most 100."""
    return max(1, min(AUTO_EPOCHS_MAX, math.ceil(AUTO_EPOCHS_SCALE / math.sqrt(max(train_records, 1)))))


def with_epochs(train: TrainConfig, manifest: Manifest) -> TrainConfig:
    """``train`` with ``epochs`` a number: ``auto`` resolved by the train split's records (:func:`auto_epochs`).
    Every rank, and a tune study's driver, reads the same manifest, so they agree."""
    if train.epochs != "auto":
        return train
    return dataclasses.replace(train, epochs=auto_epochs(manifest.split("train").records))


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


# The most bytes of parsed records one shuffle window may hold: a window is assembled while the one before it is
# being read, so a rank holds about two. 128 MB fits the default window of 262,144 records of any tabular dataset
# and of text up to max_length ~250; longer records get a window of fewer records (shuffle_window).
WINDOW_BYTES = 128 << 20


def shuffle_window(shuffle_buffer: int, per_pass: int, record_bytes: int, batch_size: int) -> int:
    """Records per shuffle window (pure): ``train.shuffle_buffer``, but no more than the pass holds and no more
    than :data:`WINDOW_BYTES` of records of ``record_bytes`` each (never fewer than one batch)."""
    by_memory = max(batch_size, WINDOW_BYTES // max(1, record_bytes))
    return max(1, min(shuffle_buffer, per_pass, by_memory))


def resume_point(consumed: int, per_pass: int) -> tuple[int, int]:
    """(pass, records to skip in it) after a rank has read ``consumed`` records (pure)."""
    if per_pass < 1:
        raise ValueError(f"a pass must hold at least one record (got {per_pass})")
    return divmod(consumed, per_pass)


def shuffle_seed(seed: int, rank: int) -> int:
    """Base of a rank's per-pass shuffle seeds (pass ``p`` folds ``p`` into ``(shuffle_seed, 0)``)."""
    return seed + 104729 * (rank + 1)


def file_seed(seed: int, rank: int) -> int:
    """Seed of a rank's per-pass order of its share's ranges."""
    return seed + 7919 * (rank + 1)


def pass_order(n: int, seed: int, pass_index: int) -> list[int]:
    """The order in which a rank visits its ``n`` ranges in pass ``pass_index``."""
    import numpy as np

    return np.random.default_rng([seed, pass_index]).permutation(n).tolist()


def range_stream(n: int, seed: int, passes: Optional[int] = None, start: int = 0) -> Iterator[int]:
    """Indices of a share's ranges in reading order: pass after pass from pass ``start`` (forever when
    ``passes`` is None)."""
    p = start
    while passes is None or p < start + passes:
        yield from pass_order(n, seed, p)
        p += 1
