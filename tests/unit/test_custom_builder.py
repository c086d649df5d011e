"""model.kind custom: the example builder behind the contract, save/load with its registered layers, and
bad builders (a path that does not import, a builder returning a non-model or the wrong width) as one line
and exit 2."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from hvdtrain.core import config
from hvdtrain.core.errors import ConfigError
from hvdtrain.data import contract
from hvdtrain.data.synthetic import Layout, TabularSpec, make_tabular_dataset
from hvdtrain.model import models

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = str(REPO / "examples")


@pytest.fixture(scope="module")
def tabular(tmp_path_factory):
    root = tmp_path_factory.mktemp("tabular")
    return make_tabular_dataset(str(root), TabularSpec(Layout(40), task="multilabel"))


def _custom(builder: str, code: str = EXAMPLES, **params) -> config.ModelConfig:
    return config.ModelConfig(kind="custom", builder=builder, code=code, params=params)


def test_the_example_builds_from_the_contract_and_reloads_with_its_layers(tabular, tmp_path) -> None:
    import keras

    model_cfg = _custom("wide_deep:build", embed_dim=4, deep_units=[8])
    shape = contract.check_manifest(tabular, model_cfg, "multilabel")
    model = models.build_model(model_cfg, shape)
    assert model.outputs[0].shape[-1] == shape.num_outputs == 3
    x = {"numeric": np.random.default_rng(0).normal(size=(5, 6)).astype("float32"),
         "categorical": np.array([[1, 2, 0]] * 5, dtype="int64")}
    path = str(tmp_path / "model.keras")
    model.save(path)
    again = keras.saving.load_model(path, compile=False)  # wide_deep is imported: its layers are registered
    np.testing.assert_allclose(again(x), model(x), rtol=1e-6)
    assert any(type(layer).__name__ == "TakeColumn" for layer in again.layers)


def test_builder_errors_are_one_config_line(tabular, tmp_path) -> None:
    (tmp_path / "bad_builders.py").write_text(
        "import keras\n"
        "def not_a_model(contract, params):\n    return {'a': 1}\n"
        "def wrong_width(contract, params):\n"
        "    x = keras.Input((6,), name='numeric')\n"
        "    return keras.Model(x, keras.layers.Dense(contract.num_outputs + 1)(x))\n")
    shape = contract.check_manifest(tabular, _custom("bad_builders:not_a_model", str(tmp_path)), "multilabel")
    cases = {"bad_builders:not_a_model": "returned dict, not a keras.Model",
             "bad_builders:wrong_width": "needs one output (batch, 3): end with Dense(contract.num_outputs)",
             "bad_builders:missing": "names no function 'missing' in module bad_builders",
             "no_such_module:build": "does not import (ModuleNotFoundError"}
    for builder, message in cases.items():
        with pytest.raises(ConfigError) as info:
            models.build_model(_custom(builder, str(tmp_path)), shape)
        assert message in str(info.value) and "\n" not in str(info.value), str(info.value)


def _cli_train(tmp_path: Path, tabular, model: dict, task: str = "multilabel") -> subprocess.CompletedProcess:
    data = {"name": "bad", "workdir": str(tmp_path / "work"), "task": task, "etl": {"output": tabular.root},
            "model": model, "train": {"epochs": 1, "batch_size": 8, "progress": "off"}, "tracking": {"enabled": False},
            "monitoring": {"enabled": False}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "hvdtrain.cli", "train", str(path), "--np", "1"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


def test_cli_a_builder_path_that_does_not_import_is_exit_2_before_any_rank(tabular, tmp_path) -> None:
    proc = _cli_train(tmp_path, tabular, {"kind": "custom", "builder": "no_such_pkg.models:build"})
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "model.builder" in line]
    assert len(lines) == 1 and "names module 'no_such_pkg.models', which is not importable" in lines[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_cli_a_builder_returning_a_non_model_is_exit_2(tabular, tmp_path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "returns_dict.py").write_text("def build(contract, params):\n    return {'layers': params}\n")
    proc = _cli_train(tmp_path, tabular, {"kind": "custom", "builder": "returns_dict:build", "code": str(code)})
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "returned dict, not a keras.Model" in proc.stderr and "Traceback" not in proc.stderr
