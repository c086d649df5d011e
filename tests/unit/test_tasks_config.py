"""Task and custom-model config, the model contract per task, ETL label encoding and the sample tables' best
scores (pure: no TensorFlow, no Spark)."""
from __future__ import annotations

import dataclasses

import pytest

from etl import labels as label_mod
from etl import sample
from hvdtrain.core import config, tasks
from hvdtrain.core.config import SampleConfig, TaskConfig
from hvdtrain.core.errors import ConfigError, DataError
from hvdtrain.data import contract
from hvdtrain.data.synthetic import Layout, TabularSpec, make_tabular_dataset


def test_task_shorthand_and_defaults_follow_the_task() -> None:
    cfg = config.from_dict({"task": "regression", "train": {"validate_every_epoch": True}})
    assert cfg.task.kind == "regression"
    assert cfg.checkpoint.best_metric == "validation_rmse" and cfg.checkpoint.best_mode == "min"
    assert cfg.tune.metric == "validation_rmse"  # the default validation_accuracy means "the task's own"
    binary = config.from_dict({"task": {"kind": "binary", "threshold": 0.2},
                               "train": {"early_stopping": {"metric": "pr_auc"}}})
    assert binary.train.early_stopping.direction == "max" and binary.checkpoint.best_metric == "validation_roc_auc"


@pytest.mark.parametrize("data,message", [
    ({"task": "ranking"}, "task.kind must be one of multiclass, binary, multilabel, regression"),
    ({"task": {"kind": "regression", "class_weights": "balanced"}}, "task.class_weights applies to binary and "
                                                                    "multiclass tasks only"),
    ({"task": {"kind": "multiclass", "positive_label": "late"}}, "task.positive_label applies to binary tasks only"),
    ({"task": "regression", "train": {"early_stopping": {"metric": "accuracy"}}},
     "train.early_stopping.metric must be one of rmse, mae, r2, loss (the regression task's metrics)"),
    ({"task": "binary", "tune": {"metric": "validation_rmse"}}, "tune.metric must be one of validation_roc_auc"),
    ({"model": {"kind": "custom"}}, 'model.builder must be "package.module:function" when model.kind is custom'),
    ({"model": {"kind": "custom", "builder": "my-models.wide:build"}}, "model.builder must be"),
    ({"model": {"builder": "pkg.mod:build"}}, "model.builder is only read with model.kind: custom"),
])
def test_bad_task_and_model_settings_name_field_value_and_fix(data, message) -> None:
    with pytest.raises(ConfigError) as info:
        config.from_dict(data)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("task,labels,spec,outputs", [
    ("multiclass", 3, ("int64", []), 3), ("binary", 2, ("int64", []), 1),
    ("multilabel", 3, ("float32", [3]), 3), ("regression", 0, ("float32", []), 1),
])
def test_the_contract_carries_the_task_features_and_output_width(tmp_path, task, labels, spec, outputs) -> None:
    m = make_tabular_dataset(str(tmp_path), TabularSpec(Layout(20), num_classes=max(labels, 2) if task != "binary"
                                                        else 2, task=task))
    assert (m.features["label"].dtype, m.features["label"].shape) == spec and m.task == task
    shape = contract.check_manifest(m, config.ModelConfig(kind="custom", builder="m:b"), task)
    assert shape.task == task and shape.num_outputs == outputs and shape.inputs == ("numeric", "categorical")
    assert shape.features["categorical"].cardinalities == (5, 8, 3) and shape.features["numeric"].shape == (6,)
    assert shape.features["numeric"].columns == tuple(f"x{i}" for i in range(6))


def test_a_run_whose_task_differs_from_the_datasets_fails_before_training(tmp_path) -> None:
    m = make_tabular_dataset(str(tmp_path), TabularSpec(Layout(20), task="regression"))
    with pytest.raises(DataError, match="encoded for task regression, but this run's task is binary: rerun the ETL "
                                        "with task: binary, or set task: regression"):
        contract.check_manifest(m, config.ModelConfig(kind="mlp"), "binary")
    bad = dataclasses.replace(m, task="multiclass", labels=["a", "b"])
    with pytest.raises(DataError, match="feature 'label' is float32"):
        contract.check_manifest(bad, config.ModelConfig(kind="mlp"), "multiclass")


def test_label_encoders_per_task() -> None:
    assert label_mod.encoder(TaskConfig("multiclass"), ["a", "b", "c"])("c") == 2
    assert label_mod.encoder(TaskConfig("binary"), ["no", "yes"])("yes") == 1
    assert label_mod.encoder(TaskConfig("multilabel", label_delimiter=";"), ["a", "b", "c"])("c; a") == [1.0, 0.0, 1.0]
    assert label_mod.encoder(TaskConfig("regression"), [])("-2.5") == -2.5


def test_sample_tables_per_task_and_their_best_scores() -> None:
    cfg = SampleConfig(rows=4000, num_classes=4)
    binary = [label for _, _, label in sample.generate(cfg, task="binary")]
    assert set(binary) == {"negative", "positive"} and 0.01 < binary.count("positive") / len(binary) < 0.03
    multi = [label.split("|") for _, _, label in sample.generate(cfg, task="multilabel")]
    assert all(m and set(m) <= set(sample.label_names(4)) for m in multi) and any(len(m) > 1 for m in multi)
    values = [float(label) for _, _, label in sample.generate(cfg, task="regression")]
    assert len(set(values)) > 1000
    assert sample.best_score(cfg, "regression") == ("rmse", cfg.noise_std)
    assert sample.best_score(cfg, "binary")[1] > 0.99
    metric, best = sample.best_score(cfg, "multilabel")
    assert metric == "micro_f1" and 0.9 < best < 1.0
    assert sample.best_score(cfg) == ("accuracy", sample.accuracy_ceiling(cfg))


def test_every_task_names_its_direction_and_metrics() -> None:
    for kind in tasks.KINDS:
        assert tasks.DEFAULT_METRIC[kind] in tasks.METRICS[kind]
        assert set(tasks.HEADLINE[kind]) <= set(tasks.METRICS[kind])
    assert tasks.direction("validation_rmse") == "min" and tasks.direction("validation_r2") == "max"


def test_tune_searches_model_params_and_defaults_to_the_tasks_metric() -> None:
    from hvdtrain import tune

    cfg = config.from_dict({"task": "binary", "model": {"kind": "custom", "builder": "m:b"}})
    params = tune.parse_space({"model.params.embed_dim": {"int": [8, 64]},
                               "model.params.dropout": {"uniform": [0.0, 0.5]}}, "space.yaml", cfg)
    assert [p.key for p in params] == ["model.params.embed_dim", "model.params.dropout"]
    assert tune.override("model.params.embed_dim", 8) == "model.params.embed_dim=8"
    with pytest.raises(ConfigError, match="is not a config key"):
        tune.parse_space({"model.paramz.x": {"int": [1, 2]}}, "space.yaml", cfg)
    assert cfg.tune.metric == "validation_roc_auc" and tune.direction(cfg.tune.metric) == "maximize"
    assert tune.direction("validation_rmse") == "minimize"
