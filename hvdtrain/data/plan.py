"""Which records each rank reads, and in which order (pure: no TensorFlow, no I/O).

Every rank runs the same number of optimizer steps per epoch
(:func:`steps_per_epoch`). Shards go to ranks whole, balanced by record count
(:func:`assign_shards`); when that is impossible or lopsided, every rank reads
every shard and keeps every ``size``-th record (record-level sharding,
:class:`ReadPlan`). A rank's stream is a pure function of the seed and the
records it has read, so it can be resumed exactly (:func:`resume_point`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

from hvdtrain.errors import DataError

MAX_LOAD_RATIO = 2.0


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
