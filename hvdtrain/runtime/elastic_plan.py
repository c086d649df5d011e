"""Elastic training's plan (pure, no TensorFlow): virtual ranks, gradient scale, the elastic horovodrun command.

See :mod:`hvdtrain.training.elastic` for the rule these implement.
"""
from __future__ import annotations

import sys
from typing import Sequence

from hvdtrain.core.config import ElasticConfig
from hvdtrain.runtime.launch import RANK_ENV


def virtual_ranks(rank: int, size: int, virtual: int) -> list[int]:
    """The virtual ranks real rank ``rank`` of ``size`` runs: ``rank, rank + size, ...`` below ``virtual``."""
    if not 0 <= rank < size or size > virtual:
        raise ValueError(f"rank {rank} of {size} cannot run {virtual} virtual ranks")
    return list(range(rank, virtual, size))


def gradient_scale(size: int, virtual: int) -> float:
    """Factor on the rank-averaged gradient sums that makes the update the mean over all ``virtual`` batches."""
    return size / virtual


def horovodrun_command(horovodrun: str, config_path: str, overrides: Sequence[str], elastic: ElasticConfig,
                       np_: int, discovery: str, start_timeout: int) -> list[str]:
    """The elastic launch: ``np_`` ranks to start, between min_ranks and max_ranks, hosts from ``discovery``; each
    rank starts through :data:`~hvdtrain.runtime.launch.RANK_ENV`, which puts back the secrets kept off its command
    line (:func:`~hvdtrain.runtime.launch.sealed_env`)."""
    low, high = elastic.blacklist_cooldown
    return [horovodrun, "-np", str(np_), "--min-np", str(elastic.min_ranks), "--max-np", str(elastic.max_ranks),
            "--host-discovery-script", discovery, "--blacklist-cooldown-range", str(low), str(high), "--gloo",
            # A rank joining after a reset starts a process (TensorFlow import, data plan) while the others wait
            # in the rendezvous: Gloo's default 30 s aborted the survivors on a loaded host.
            "--gloo-timeout-seconds", str(start_timeout), "--start-timeout", str(start_timeout),
            *RANK_ENV, sys.executable, "-m", "hvdtrain.training.elastic", config_path, *overrides]
