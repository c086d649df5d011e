"""hvdtrain check-script (hvdtrain/model/keras3_check.py): Keras 2 uses that break on Keras 3, found by reading.

The oracle is Horovod v0.28.1's own tests (../shared/horovod-upstream-tests): every test that
tests/test_horovod_upstream.py lists as failing on Keras 3 must get a finding inside it, and no
test that runs on Keras 3 may get one. Clean scripts (the project's code, its examples, the Keras 3
ports) give none.
"""
from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from hvdtrain import cli
from hvdtrain.model import keras3_check
from hvdtrain.model.keras3_check import check_source
from tests.multiprocess.test_horovod_upstream import NOT_APPLICABLE, upstream_tests_folder

REPO = Path(__file__).resolve().parents[2]


def _test_ranges(path: Path) -> dict[str, range]:
    """{file::Class::test: its lines} for the test methods of a file."""
    out = {}
    for cls in ast.parse(path.read_text()).body:
        if isinstance(cls, ast.ClassDef):
            for fn in cls.body:
                if isinstance(fn, ast.FunctionDef) and fn.name.startswith("test"):
                    out[f"{path.name}::{cls.name}::{fn.name}"] = range(fn.lineno, fn.end_lineno + 1)
    return out


@pytest.mark.parametrize("file_name", ["test_tensorflow.py", "test_tensorflow2_keras.py"])
def test_every_keras3_failure_of_horovods_tests_is_found_and_nothing_else(file_name: str) -> None:
    path = upstream_tests_folder() / "parallel" / file_name
    findings = keras3_check.check_file(str(path))
    ranges = _test_ranges(path)
    # parameterized tests run as test_x_0, test_x_1: the source has test_x
    failing = {t.rsplit("_", 1)[0] if t.rsplit("_", 1)[-1].isdigit() and t not in ranges else t
               for t in NOT_APPLICABLE if t.startswith(file_name)}
    for test_id in failing:
        assert any(f.line in ranges[test_id] for f in findings), f"nothing found in {test_id}"
    # GPU tests are skipped on this CPU-only build; the GPU twin of the syncbn test has the same fused=False.
    allowed = [ranges[t] for t in failing] + [r for t, r in ranges.items() if t.endswith("_gpu")]
    stray = [f.format(file_name) for f in findings if not any(f.line in r for r in allowed)]
    assert not stray, stray


def test_upstream_findings_give_the_exact_replacements() -> None:
    path = upstream_tests_folder() / "parallel" / "test_tensorflow2_keras.py"
    found = {(f.line, f.fix) for f in keras3_check.check_file(str(path))}
    assert (141, "learning_rate=") in found  # RMSprop(lr=0.0001)
    assert (80, "remove the argument") in found  # compile(experimental_run_tf_function=False)
    assert (87, "self.model.optimizer.learning_rate") in found
    assert any(line == 77 and fix.startswith("keras.losses.mse ") for line, fix in found)
    assert any(line == 328 and fix.startswith("def update_step(self, gradient, variable, learning_rate)")
               for line, fix in found)


@pytest.mark.parametrize("path", sorted(str(p.relative_to(REPO)) for p in [
    *REPO.glob("examples/*.py"), REPO / "tests" / "support" / "horovod_keras3_ports.py", *REPO.glob("hvdtrain/**/*.py"),
    *REPO.glob("yarn/*.py"), *REPO.glob("etl/*.py")]))
def test_clean_scripts_give_no_findings(path: str) -> None:
    assert keras3_check.check_file(str(REPO / path)) == []


def _fixes(source: str) -> list[tuple[int, str, str]]:
    return [(f.line, f.code, f.fix) for f in check_source(textwrap.dedent(source))]


def test_each_rule_names_the_line_and_the_replacement() -> None:
    src = """\
        import tensorflow as tf
        import horovod.tensorflow as hvd
        opt = tf.optimizers.SGD(lr=0.01, decay=1e-4)
        hvd.broadcast_variables(opt.variables(), root_rank=0)
        bn = tf.keras.layers.BatchNormalization(fused=True)
        loss = tf.keras.losses.mean_absolute_error
        lstm = tf.keras.layers.LSTM(4, time_major=True)
        ckpt = tf.keras.callbacks.ModelCheckpoint("m.keras", period=2)
        model.fit_generator(gen)
        sess = tf.keras.backend.get_session()
        """
    fixes = _fixes(src)
    assert (3, "K3-KWARG", "learning_rate=") in fixes
    assert any(line == 3 and fix.startswith("learning_rate=tf.optimizers.schedules.InverseTimeDecay")
               for line, _, fix in fixes)
    assert (4, "K3-VARIABLES", "opt.variables") in fixes
    assert (5, "K3-KWARG", "no fused= (Keras 3 has no such argument)") in fixes
    assert any(line == 6 and fix.startswith("tf.keras.losses.mae ") for line, _, fix in fixes)
    assert any(line == 7 and "time_major" in fix for line, _, fix in fixes)
    assert (8, "K3-KWARG", "save_freq=STEPS_PER_EPOCH * PERIOD") in fixes
    assert (9, "K3-REMOVED", "model.fit(...)") in fixes
    assert any(line == 10 and code == "K3-REMOVED" for line, code, _ in fixes)
    assert len(fixes) == 9, fixes  # two on line 3


def test_aliases_follow_the_namespace_the_script_imports() -> None:
    """tf.keras (Keras 3's keras._tf_keras) keeps mse and drops mean_squared_error; plain keras the reverse."""
    tf_keras = _fixes("from tensorflow import keras\nkeras.losses.mse\nkeras.losses.mean_squared_error\n")
    assert [(line, fix.split()[0]) for line, _, fix in tf_keras] == [(3, "keras.losses.mse")]
    plain = _fixes("import keras\nkeras.losses.mse\nkeras.losses.mean_squared_error\n"
                   "keras.layers.ThresholdedReLU\n")
    assert [(line, fix.split()[0]) for line, _, fix in plain] == [(2, "keras.losses.mean_squared_error"),
                                                                   (4, "keras.layers.ReLU(threshold=THETA)")]
    assert _fixes("import tensorflow as tf\ntf.keras.layers.ThresholdedReLU(0.5)\n") == []


def test_optimizer_subclass_needs_a_learning_rate_and_the_keras3_update_step() -> None:
    keras2 = """\
        import tensorflow as tf
        class Opt(tf.keras.optimizers.Optimizer):
            def __init__(self, name, **kwargs):
                super().__init__(name=name, **kwargs)
            def update_step(self, gradient, variable):
                variable.assign_add(gradient)
        """
    assert [(line, code) for line, code, _ in _fixes(keras2)] == [(4, "K3-NO-LR"), (5, "K3-OPTIMIZER")]
    keras3 = keras2.replace("name, **kwargs)", "name, learning_rate=0.1, **kwargs)").replace(
        "name=name, **kwargs)", "learning_rate=learning_rate, name=name, **kwargs)").replace(
        "gradient, variable)", "gradient, variable, learning_rate)")
    assert _fixes(keras3) == []
    assert _fixes("import tensorflow as tf\nclass O(tf.compat.v1.train.Optimizer):\n"
                  "    def __init__(self):\n        super().__init__(name='x', use_locking=False)\n") == []


def test_lookalikes_are_not_findings() -> None:
    """argparse's args.lr, a user's own variables() method, tf_keras (Keras 2 on purpose), hvd's SyncBN."""
    src = """\
        import argparse
        import tf_keras
        import horovod.tensorflow as hvd
        import tensorflow as tf
        args = argparse.ArgumentParser().parse_args()
        opt = tf.keras.optimizers.Adam(args.lr)
        opt.learning_rate.assign(args.lr * 2)
        tf_keras.optimizers.legacy.Adam(lr=0.1)
        hvd.SyncBatchNormalization(fused=False)
        class Store:
            def variables(self):
                return []
        Store().variables()
        """
    assert _fixes(src) == []


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    clean, dirty, broken = tmp_path / "clean.py", tmp_path / "dirty.py", tmp_path / "broken.py"
    clean.write_text("import tensorflow as tf\nopt = tf.keras.optimizers.Adam(learning_rate=0.1)\n")
    dirty.write_text("import tensorflow as tf\nopt = tf.keras.optimizers.Adam(lr=0.1)\n")
    broken.write_text("def f(:\n")
    assert cli.main(["check-script", str(clean)]) == 0
    assert cli.main(["check-script", str(dirty)]) == 1
    assert f"{dirty}:2:" in capsys.readouterr().out
    assert cli.main(["check-script", str(broken)]) == 2
    assert cli.main(["check-script", str(tmp_path / "missing.py")]) == 2
    assert "missing.py" in capsys.readouterr().err
