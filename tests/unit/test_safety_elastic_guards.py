"""An elastic job runs under the stall watchdog and the Kerberos renewer, as a fixed-size one does (#54 item 9).

Both paths enter :func:`hvdtrain.training.runtime.guarded`; the collaborators are passed in, nothing is patched."""
from __future__ import annotations

import contextlib
import os

import pytest

from hvdtrain.core import config
from hvdtrain.core.errors import DataError
from hvdtrain.runtime import distributed
from hvdtrain.training import elastic, runtime
from hvdtrain.training import train as train_lib


class FakeDog:
    def __init__(self, timeout, rank):
        self.timeout, self.rank, self.phases, self.entered, self.exited = timeout, rank, [], False, False

    def phase(self, what, timeout=None):
        self.phases.append((what, timeout))

    def __enter__(self):
        self.entered = True
        return self

    def __exit__(self, *exc):
        self.exited = True


def test_guarded_starts_the_watchdog_and_the_renewer(tmp_path):
    cfg = config.from_dict({"name": "g", "workdir": str(tmp_path), "source": {"table": "demo.reviews"},
                            "fault": {"stall_timeout": 42}})
    rank = distributed.RankInfo(0, 1, 0, 1, "host", "local")
    dogs, renewing = [], []

    @contextlib.contextmanager
    def renewer(c, r):
        renewing.append((c, r))
        yield
        renewing.append("stopped")

    with runtime.guarded(cfg, rank, watchdog=lambda t, r: dogs.append(FakeDog(t, r)) or dogs[-1],
                         renewer=renewer) as dog:
        assert dog is dogs[0] and (dog.timeout, dog.rank, dog.entered) == (42, 0, True)
        assert renewing == [(cfg.yarn, rank)]
    assert dog.exited and renewing[-1] == "stopped"


@pytest.mark.parametrize("run", [elastic.run, train_lib.run], ids=["elastic", "fixed-size"])
def test_the_elastic_and_the_fixed_size_run_enter_the_same_guard_before_any_work(tmp_path, run):
    cfg = config.from_dict({"name": "g", "workdir": str(tmp_path), "source": {"table": "demo.reviews"},
                            "etl": {"output": str(tmp_path / "no-dataset")},
                            "train": {"elastic": {"min_ranks": 1, "max_ranks": 2}} if run is elastic.run else {}})
    entered = []

    @contextlib.contextmanager
    def guard(c, rank):
        dog = FakeDog(c.fault.stall_timeout, rank.rank)
        entered.append((c, rank, dog))
        yield dog
        entered.append("left")

    umask = os.umask(0o022)
    try:
        with pytest.raises(DataError):  # no dataset: the plan fails inside the guard
            run(cfg, guard=guard)
    finally:
        os.umask(umask)
    assert len(entered) == 1 and entered[0][0] is cfg and entered[0][1].rank == 0
