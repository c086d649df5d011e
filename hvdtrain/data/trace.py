"""Auditing the data order: which record keys each rank's batches held, batch by batch."""
from __future__ import annotations

import os
from typing import Any, Iterator

from hvdtrain.data.contract import KEY_FEATURE


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
