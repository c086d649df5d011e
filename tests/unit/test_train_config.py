"""Config fields of the training loop, model kinds and tracking: defaults, YAML, errors naming field/value/fix."""
from __future__ import annotations

import os

import pytest

from hvdtrain.core import config
from hvdtrain.core.errors import ConfigError

BASE = {"name": "t", "source": {"table": "a.b"}}


def _cfg(**sections):
    return config.from_dict({**BASE, **sections})


def test_defaults_keep_the_previous_behaviour() -> None:
    cfg = _cfg()
    t = cfg.train
    assert (t.lr_schedule, t.grad_accum_steps, t.fp16_allreduce, t.mixed_precision) == ("constant", 1, False, "none")
    assert t.clip_norm is None and t.early_stopping is None and not t.validates_each_epoch
    assert cfg.model.kind == "transformer" and cfg.model.hidden_units == [128, 64]
    assert cfg.tracking.log_every_steps == 50 and cfg.tracking.registered_model_name is None


def test_nested_early_stopping_and_round_trip() -> None:
    cfg = _cfg(train={"early_stopping": {"metric": "macro_f1", "patience": 2}, "lr_schedule": "cosine",
                      "min_lr_ratio": 0.1, "clip_norm": 1, "grad_accum_steps": 4, "mixed_precision": "bfloat16"},
               model={"kind": "mlp", "hidden_units": [32], "categorical_embed_dim": 4})
    assert cfg.train.early_stopping.direction == "max" and cfg.train.validates_each_epoch
    assert cfg.train.clip_norm == 1.0 and isinstance(cfg.train.clip_norm, float)
    again = config.from_dict(cfg.to_dict())
    assert again.to_dict() == cfg.to_dict()
    assert cfg.flat()["train.early_stopping.patience"] == 2


@pytest.mark.parametrize("section,values,message", [
    ("train", {"grad_accum_steps": 0}, "train.grad_accum_steps must be >= 1 (1 = no accumulation) (got 0)"),
    ("train", {"lr_schedule": "step"}, "train.lr_schedule must be one of constant, cosine, linear (got 'step')"),
    ("train", {"min_lr_ratio": 2}, "train.min_lr_ratio must be in [0, 1] (got 2.0)"),
    ("train", {"clip_norm": 0}, "train.clip_norm must be > 0, or null for no clipping (got 0.0)"),
    ("train", {"mixed_precision": "fp8"}, "train.mixed_precision must be one of none, bfloat16, float16"),
    ("train", {"early_stopping": {"metric": "auc"}}, "train.early_stopping.metric must be one of accuracy, macro_f1"),
    ("train", {"early_stopping": {"metric": "loss", "mode": "max"}},
     "train.early_stopping.mode must be auto or min for metric loss"),
    ("train", {"early_stopping": {"patience": -1}}, "train.early_stopping.patience must be >= 0 epochs (got -1)"),
    ("train", {"progress": "fancy"}, "train.progress must be one of auto, bar, log, off"),
    ("model", {"kind": "cnn"}, "model.kind must be one of transformer, mlp, custom (got 'cnn')"),
    ("model", {"hidden_units": []}, "model.hidden_units must be a non-empty list of layer widths > 0"),
    ("model", {"hidden_units": [8, 0]}, "model.hidden_units must be a non-empty list"),
    ("tracking", {"log_every_steps": -1}, "tracking.log_every_steps must be >= 0 (0 turns per-step metrics off)"),
    ("tracking", {"registered_model_name": " "}, "tracking.registered_model_name must be a non-empty name"),
])
def test_bad_values_name_field_value_and_fix(section: str, values: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        _cfg(**{section: values})
    assert message in str(info.value)


def test_config_import_stays_light() -> None:
    import subprocess
    import sys

    code = "import sys, hvdtrain.core.config; assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_keep_best_needs_a_metric_the_run_records(tmp_path) -> None:
    base = {"name": "j", "source": {"table": "db.t"}}
    with pytest.raises(ConfigError, match=r"^checkpoint.best_metric is never recorded by this run, so keep_best 1 "
                                          r"would keep nothing: record validation metrics with "
                                          r"train.validate_every_epoch: true .*use one of train_accuracy, train_loss"):
        config.from_dict({**base, "checkpoint": {"best_metric": "validation_accuracy"}})
    with pytest.raises(ConfigError, match=r"best_metric is never recorded .*use one of .*validation_macro_f1"):
        config.from_dict({**base, "checkpoint": {"best_metric": "val_acc"}, "train": {"validate_every_epoch": True}})
    assert config.from_dict({**base, "checkpoint": {"best_metric": "val_acc", "keep_best": 0}})  # nothing to keep
    plain = config.from_dict(base).checkpoint  # auto: what the run records
    assert (plain.best_metric, plain.best_mode) == ("train_loss", "min")
    validated = config.from_dict({**base, "train": {"early_stopping": {"metric": "loss"}}}).checkpoint
    assert (validated.best_metric, validated.best_mode) == ("validation_accuracy", "max")


def test_the_demo_keeps_its_best_checkpoint_by_validation_accuracy() -> None:
    demo = config.load(os.path.join(os.path.dirname(__file__), "..", "..", "configs", "demo.yaml")).checkpoint
    assert demo.keep_best >= 1 and (demo.best_metric, demo.best_mode) == ("validation_accuracy", "max")
