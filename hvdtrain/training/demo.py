"""What ``hvdtrain demo`` may delete between its runs: the checkpoints a previous demo run recorded, nothing else.

The demo starts a new training run on new data each time, so the previous demo run's checkpoints must go (a
resume from them would be refused or wrong). Before its training writes anything, the demo records in
``checkpoint.dir`` a ledger (:mod:`hvdtrain.hadoop.ledger`) naming what training writes there: the checkpoint folders
(``ckpt-<step>/``) and their local staging folders (``.staging-*``). A later demo deletes only the files that
ledger names; a file it does not name is kept, and a ``checkpoint.dir`` that holds files but no demo's ledger
(a user's folder, a ``hvdtrain train`` run's checkpoints) is refused with one line before anything is touched.

:func:`plan_reset` is the pure plan; :func:`check` and :func:`reset` act.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from hvdtrain.core.errors import DataError
from hvdtrain.hadoop import fs, lease, ledger

WRITER = "hvdtrain demo"
# What training writes into checkpoint.dir (hvdtrain.training.checkpoint): ckpt-<10 digits>/ and local .staging-<step>-*/.
CHECKPOINT_ENTRIES = ("ckpt-" + "[0-9]" * 10 + "/*", ".staging-*/*")


def checkpoint_ledger() -> ledger.Ledger:
    """The ledger the demo writes into ``checkpoint.dir`` before training (pure)."""
    return ledger.Ledger(WRITER, CHECKPOINT_ENTRIES)


@dataclass(frozen=True)
class Reset:
    """The files (relative to ``checkpoint.dir``) to delete, and the ledger to record before training."""

    delete: tuple[str, ...]
    ledger: ledger.Ledger


def plan_reset(folder: str, files: Sequence[str], recorded: Optional[ledger.Ledger]) -> Reset:
    """What to delete in ``folder`` (holding ``files``, with ledger ``recorded``) before a new demo run (pure);
    raises DataError, one line, when the folder holds files no demo run recorded writing."""
    fix = f"move them out of {folder}, or set checkpoint.dir to a new folder (e.g. hvdtrain demo checkpoint.dir=...)"
    if recorded is None:
        if files:
            raise DataError(f"checkpoint.dir {folder} holds files no demo run recorded writing "
                            f"({ledger.sample(list(files))}); the demo deletes only its own checkpoints: {fix}")
        return Reset((), checkpoint_ledger())
    if recorded.writer != WRITER:
        raise DataError(f"checkpoint.dir {folder} is where {recorded.writer} writes ({ledger.NAME}), not the "
                        f"demo's checkpoint folder; the demo deletes nothing there: {fix}")
    doomed = tuple(f for f in files if f != ledger.NAME and recorded.owns(f))
    return Reset(doomed, recorded.adding(*CHECKPOINT_ENTRIES))


def _plan(folder: str) -> Reset:
    exists = fs.exists(folder)
    files = [f for f in fs.walk(folder) if not lease.is_lease_file(f)] if exists else []  # this run's own lease
    return plan_reset(folder, files, ledger.read(folder) if exists else None)


def check(folder: str) -> None:
    """Refuse (DataError) before any work when the demo could not start a new run in ``folder``."""
    _plan(folder)


def reset(folder: str) -> list[str]:
    """Delete the previous demo run's checkpoints in ``folder`` and record the ledger before training writes
    there; returns the files deleted."""
    plan = _plan(folder)
    doomed = set(plan.delete)
    if doomed:
        ledger.delete_owned(folder, doomed.__contains__)
    fs.makedirs(folder)
    ledger.write(folder, plan.ledger)
    return sorted(doomed)
