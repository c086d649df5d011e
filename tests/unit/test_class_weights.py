"""Explicit class weights (issue 53, item 4): ``task.class_weights`` takes ``{label: weight}`` besides none and
balanced; a label the dataset does not have fails with one line naming the labels it has."""
from __future__ import annotations

import pytest

from hvdtrain.core import config
from hvdtrain.core.errors import ConfigError, DataError
from hvdtrain.model import heads


def test_a_class_weight_mapping_weighs_each_label_by_name_and_absent_labels_by_1() -> None:
    task = config.from_dict({"task": {"kind": "binary", "class_weights": {"late": 3, "on_time": 0.5}}}).task
    assert task.class_weights == {"late": 3.0, "on_time": 0.5}
    head = heads.for_task(task, ["on_time", "late"], {"on_time": 90, "late": 10})
    assert head.class_weights == (0.5, 3.0)  # in the manifest's label order
    multi = config.from_dict({"task": {"kind": "multiclass", "class_weights": {"b": 2}}}).task
    assert heads.for_task(multi, ["a", "b", "c"], {}).class_weights == (1.0, 2.0, 1.0)  # as Keras's class_weight


def test_a_class_weight_for_a_label_the_dataset_lacks_fails_in_one_line() -> None:
    task = config.from_dict({"task": {"kind": "binary", "class_weights": {"delayed": 3}}}).task
    with pytest.raises(DataError) as info:
        heads.for_task(task, ["on_time", "late"], {})
    message = str(info.value)
    assert "task.class_weights names 'delayed'" in message and "'on_time', 'late'" in message
    assert "\n" not in message


@pytest.mark.parametrize("value, message", [
    ({"late": -1}, "task.class_weights must be none, balanced or a mapping {label: weight >= 0}"),
    ({}, "task.class_weights must be none, balanced or a mapping {label: weight >= 0}"),
    ("heavy", "task.class_weights must be none, balanced or a mapping {label: weight >= 0}"),
])
def test_bad_class_weights_name_the_field(value, message) -> None:
    with pytest.raises(ConfigError) as info:
        config.from_dict({"task": {"kind": "binary", "class_weights": value}})
    assert message in str(info.value) and "\n" not in str(info.value)
