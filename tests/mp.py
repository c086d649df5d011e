"""Shared by the multiprocess and multihost tiers: finding horovodrun, and the one way to skip them."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

SKIP_ENV = "HVDTRAIN_SKIP_MULTIPROCESS"  # =1: skip the multiprocess and multihost tiers on purpose
HOROVODRUN = Path(sys.executable).parent / "horovodrun"


def horovodrun() -> Path:
    """horovodrun of this interpreter's environment; a missing one fails the test (never a silent skip)."""
    if not HOROVODRUN.exists():
        pytest.fail(f"horovodrun not found next to {sys.executable}: the multiprocess tier needs Horovod "
                    f"(make env builds it); set {SKIP_ENV}=1 to skip this tier on purpose")
    return HOROVODRUN
