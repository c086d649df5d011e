"""One training job per output: the leases on ``train.output`` and ``checkpoint.dir`` (:mod:`hvdtrain.hadoop.lease`).

Whoever supervises the ranks holds them, across every restart: ``hvdtrain train``, ``hvdtrain demo`` and the
YARN driver (:func:`hold`), which tell their ranks so through :data:`HELD_ENV`. Ranks started some other way (a
tuning trial, a user's own ``horovodrun``) take them on rank 0 (:func:`for_ranks`), and every rank fails with
the same one-line refusal when another job holds one.

``train.output`` is replaced whole by a folder swap (:func:`hvdtrain.training.publish.upload_dir`), so its
lease lies beside it (``.<name>._hvdtrain_lease.json``, next to the swap's ``.<name>.incoming-*`` folders);
``checkpoint.dir`` keeps its lease inside, where checkpoint listings skip it (only ``ckpt-*`` folders count).
"""
from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Callable, Iterator, Mapping, Optional

from hvdtrain.core.errors import ANY_ERROR, StorageError
from hvdtrain.hadoop import fs, lease

log = logging.getLogger(__name__)

HELD_ENV = "HVDTRAIN_OUTPUT_LEASES"  # set for the ranks by a launcher that holds the leases: the lease tokens


def output_lease(output: str) -> str:
    """Where ``train.output``'s lease lies: beside the folder, which a publish swaps whole (pure)."""
    trimmed = output.rstrip("/")
    parent, base = trimmed.rsplit("/", 1) if "/" in trimmed else (".", trimmed)
    return fs.join(parent, f".{base}.{lease.NAME}")


def targets(output: str, checkpoint_dir: Optional[str]) -> list[tuple[str, str, Optional[str]]]:
    """(folder, what, lease file or None for the default inside it) of each output a run writes (pure)."""
    out: list[tuple[str, str, Optional[str]]] = [(output, f"train.output {output}", output_lease(output))]
    if checkpoint_dir is not None:
        out.append((checkpoint_dir, f"checkpoint.dir {checkpoint_dir}", None))
    return out


class Held:
    """What a rank knows of the run's leases: :meth:`check` before publishing train.output."""

    def __init__(self, check: Callable[[], None] = lambda: None):
        self.check = check


@contextlib.contextmanager
def hold(output: str, checkpoint_dir: Optional[str]) -> Iterator[dict[str, str]]:
    """Hold the run's leases (``checkpoint_dir`` None: checkpoints off) until the block ends; yields the
    environment that tells the ranks they are held. Raises :class:`hvdtrain.hadoop.lease.LeaseHeld` (one
    line naming the holder) when another job holds either, having taken none."""
    with contextlib.ExitStack() as stack:
        tokens = [stack.enter_context(lease.acquire(folder, what, uri=uri)).holder.token
                  for folder, what, uri in targets(output, checkpoint_dir)]
        yield {HELD_ENV: ",".join(tokens)}


@contextlib.contextmanager
def for_ranks(output: str, checkpoint_dir: Optional[str], is_chief: bool,
              broadcast: Callable[[Any], Any], env: Mapping[str, str] = os.environ) -> Iterator[Held]:
    """Inside the ranks: nothing when the launcher holds the leases (:data:`HELD_ENV`); else rank 0 holds them
    until the block ends, and every rank raises the same refusal when it could not (``broadcast``: rank 0's
    object on every rank, a collective every rank calls). Yields rank 0's :class:`Held`, whose ``check`` raises
    :class:`hvdtrain.hadoop.lease.LeaseLost` when train.output's lease is no longer this run's."""
    if env.get(HELD_ENV):
        token = env[HELD_ENV].split(",")[0]  # train.output's (targets() order)
        what = f"train.output {output}"
        yield Held(lambda: lease.verify(output_lease(output), token, what) if is_chief else None)
        return
    with contextlib.ExitStack() as stack:
        refused: Optional[tuple[bool, str]] = None  # (held by another job, the line); any failure is shared
        held = Held()
        if is_chief:
            try:
                tokens = stack.enter_context(hold(output, checkpoint_dir))[HELD_ENV].split(",")
                held = Held(lambda: lease.verify(output_lease(output), tokens[0], f"train.output {output}"))
            except lease.LeaseHeld as exc:
                refused = (True, str(exc))
            except ANY_ERROR as exc:  # the storage: the other ranks must not wait for rank 0 in vain
                refused = (False, f"taking the leases of train.output {output} failed ({type(exc).__name__}: {exc})"
                                  "; check the storage and rerun")
        refused = broadcast(refused)
        if refused is not None:
            raise (lease.LeaseHeld if refused[0] else StorageError)(refused[1])
        yield held
