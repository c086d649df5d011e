"""The run context: what every part of one training run needs to know, built once.

:func:`hvdtrain.training.train.run` builds one :class:`TrainContext` after the manifest
has been checked and the ranks agreed on the plan, and passes it to the loop's
hooks, evaluation and the checkpointer instead of long parameter lists.

Importing this module imports no heavy dependency.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:
    from hvdtrain.core.config import JobConfig
    from hvdtrain.data.contract import InputShape
    from hvdtrain.data.manifest import Manifest
    from hvdtrain.observe.tracking import Tracker
    from hvdtrain.runtime.distributed import RankInfo

Phase = Callable[..., None]  # watchdog.Watchdog.phase(what, timeout=None): what the rank waits for next


def no_phase(what: str, timeout: Optional[float] = None) -> None:
    """A phase callback that tells no one (single-process tools and tests)."""


@dataclass(frozen=True)
class TrainContext:
    """One run's fixed facts, on every rank.

    ``layout`` is what the input position and step numbering depend on
    (:func:`hvdtrain.training.resume.layout`); ``phase`` tells the stall watchdog what
    the rank is about to wait for.
    """

    cfg: "JobConfig"
    manifest: "Manifest"
    shape: "InputShape"
    rank: "RankInfo"
    steps: int  # optimizer steps per epoch
    stage_dir: str  # local folder for staged remote shards
    tracker: "Tracker"
    layout: dict[str, Any]
    phase: Phase = no_phase
    threads: int = 0  # this rank's CPU budget (hvdtrain.runtime.cpus): tf.data's private pool; 0 = TensorFlow's default

    @property
    def run_id(self) -> Optional[str]:
        return self.tracker.run_id if self.tracker is not None else None
