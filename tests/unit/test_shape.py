"""The code's shape: short parameter lists, path fields derived from the config, light imports."""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

from hvdtrain.core import config

REPO = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("hvdtrain", "etl", "yarn")
MAX_PARAMS = 7


def _long_signatures(root: pathlib.Path, limit: int) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
                names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
                if len(names) > limit:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name}({', '.join(names)})")
    return found


def test_no_library_function_takes_more_than_seven_parameters() -> None:
    # Values that travel together are a dataclass (TrainContext, LoopPlan, TrainStream, TextSpec, Fitted, ...).
    assert [line for package in PACKAGES for line in _long_signatures(REPO / package, MAX_PARAMS)] == []


def test_the_checker_sees_a_long_signature(tmp_path: pathlib.Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "m.py").write_text("class C:\n    def f(self, a, b, c, d, e, f, g, *, h=1):\n        pass\n")
    assert _long_signatures(pkg, MAX_PARAMS) == ["pkg/m.py:2 f(a, b, c, d, e, f, g, h)"]


def test_path_fields_are_derived_from_the_marked_fields() -> None:
    assert set(config.path_fields()) == {
        "workdir", "source.path", "hive.warehouse_dir", "hive.metastore_dir", "etl.output", "etl.vocab_file",
        "train.output", "train.record_trace", "tracking.uri", "yarn.env_archive", "yarn.env_cache", "yarn.keytab",
        "checkpoint.dir", "monitoring.textfile_dir", "score.report_dir", "tune.output", "model.code",
        "spark.event_log_dir"}


def test_a_marked_path_resolves_against_the_yaml_folder(tmp_path: pathlib.Path) -> None:
    (tmp_path / "job.yaml").write_text("name: j\nsource: {table: db.t}\netl: {vocab_file: vocab/v.txt}\n")
    cfg = config.load(tmp_path / "job.yaml")
    assert cfg.etl.vocab_file == str(tmp_path / "vocab" / "v.txt")
    assert cfg.checkpoint.dir == str(tmp_path / "work" / "j" / "checkpoints" / "j")


def test_the_run_context_hooks_and_data_contract_import_without_tensorflow() -> None:
    code = ("import sys, hvdtrain.training.context, hvdtrain.training.hooks, hvdtrain.data.contract, hvdtrain.data.plan; "
            "print(sorted(m for m in ('tensorflow', 'keras', 'horovod', 'pyspark', 'mlflow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
