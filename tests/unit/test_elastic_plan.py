"""Elastic training's pure plan: which virtual ranks a rank runs, the gradient scale, the launch command."""
from __future__ import annotations

import pytest

from hvdtrain.core import config
from hvdtrain.core.config import ElasticConfig
from hvdtrain.core.errors import ConfigError
from hvdtrain.runtime.elastic_plan import gradient_scale, horovodrun_command, virtual_ranks
from hvdtrain.runtime.launch import discovery_script


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_every_virtual_rank_runs_on_exactly_one_rank_at_every_size(size: int) -> None:
    owned = [v for r in range(size) for v in virtual_ranks(r, size, 4)]
    assert sorted(owned) == [0, 1, 2, 3]
    # the mean over 4 virtual batches: rank-averaged sums x size/4
    assert gradient_scale(size, 4) * sum(len(virtual_ranks(r, size, 4)) for r in range(size)) / size == 1.0


def test_a_world_larger_than_the_virtual_one_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot run 2 virtual ranks"):
        virtual_ranks(2, 3, 2)


def test_the_elastic_launch_command() -> None:
    el = ElasticConfig(min_ranks=1, max_ranks=4, blacklist_cooldown=[5, 60])
    cmd = horovodrun_command("horovodrun", "job.yaml", ["train.epochs=1"], el, 2, "/d.sh", 120)
    assert cmd[:17] == ["horovodrun", "-np", "2", "--min-np", "1", "--max-np", "4", "--host-discovery-script",
                        "/d.sh", "--blacklist-cooldown-range", "5", "60", "--gloo", "--gloo-timeout-seconds", "120",
                        "--start-timeout", "120"]
    assert cmd[-4:] == ["-m", "hvdtrain.training.elastic", "job.yaml", "train.epochs=1"]
    assert discovery_script("localhost:2,127.0.0.1:2") == "#!/bin/sh\necho localhost:2\necho 127.0.0.1:2\n"


@pytest.mark.parametrize("elastic, message", [
    ({"min_ranks": 0}, "train.elastic.min_ranks must be >= 1"),
    ({"min_ranks": 3, "max_ranks": 2}, "train.elastic.max_ranks must be >= train.elastic.min_ranks"),
    ({"blacklist_cooldown": [0, 5]}, "train.elastic.blacklist_cooldown must be \\[low, high\\]"),
])
def test_bad_elastic_settings_name_the_field(elastic: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config.from_dict({"name": "x", "source": {"table": "a.b"}, "train": {"elastic": elastic}})


@pytest.mark.parametrize("train, message", [
    ({"validate_every_epoch": True}, "train.elastic does not work with train.validate_every_epoch yet"),
    ({"early_stopping": {"patience": 2}, "fp16_allreduce": True},
     "train.elastic does not work with train.early_stopping, train.fp16_allreduce yet"),
    ({"grad_accum_steps": 2}, "train.elastic does not work with train.grad_accum_steps yet.*got {'grad_accum_steps': 2}"),
    ({"allreduce": "overlap", "steps_per_call": 4}, "train.elastic does not work with train.allreduce, train.steps_per_call"),
])
def test_what_the_elastic_loop_does_not_do_is_refused_not_ignored(train: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config.from_dict({"name": "x", "source": {"table": "a.b"}, "train": {"elastic": {}, **train}})
