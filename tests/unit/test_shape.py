"""The code's shape: short parameter lists, path fields derived from the config, light imports."""
from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import sys
from typing import Iterator

from hvdtrain.core import config

REPO = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("hvdtrain", "etl", "yarn")
MAX_PARAMS = 7


def _functions(root: pathlib.Path) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """(path relative to the package's parent, function) for every function under ``root``."""
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield str(path.relative_to(root.parent)), node


def _package(tmp_path: pathlib.Path, source: str) -> pathlib.Path:
    """A package ``pkg`` holding one module ``m.py`` (for the checkers' own tests)."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "m.py").write_text(source)
    return pkg


def _long_signatures(root: pathlib.Path, limit: int) -> list[str]:
    found = []
    for rel, node in _functions(root):
        a = node.args
        names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
        names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
        if len(names) > limit:
            found.append(f"{rel}:{node.lineno} {node.name}({', '.join(names)})")
    return found


def test_no_library_function_takes_more_than_seven_parameters() -> None:
    # Values that travel together are a dataclass (TrainContext, LoopPlan, TrainStream, TextSpec, Fitted, ...).
    assert [line for package in PACKAGES for line in _long_signatures(REPO / package, MAX_PARAMS)] == []


def test_the_checker_sees_a_long_signature(tmp_path: pathlib.Path) -> None:
    pkg = _package(tmp_path, "class C:\n    def f(self, a, b, c, d, e, f, g, *, h=1):\n        pass\n")
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


# --- Narrow inputs (#57 item 2) -----------------------------------------------------------------------------------
# The commands' own functions take the whole JobConfig: they hand its blocks out. Every other function takes the
# blocks (or values) it reads; one that reads several blocks of a JobConfig says which, in a docstring line
# ``Reads cfg.a, cfg.b.`` that this test holds to what its body reads. Using the whole config (its methods, or
# passing it on) is for the entry points below alone.
ENTRY_POINTS = {
    # command -> the function that runs it, and its body when the body is a function of its own
    "etl/job.py": {"run", "_run_leased"},
    "etl/score_job.py": {"run"},
    "etl/session.py": {"get_session"},  # the SparkSession every Spark command starts with
    "hvdtrain/training/train.py": {"run"},
    "hvdtrain/training/elastic.py": {"run", "_run"},
    # the tune command: its space is checked against the whole config, and its Driver runs trials of it
    "hvdtrain/tune.py": {"run_study", "load_space", "parse_space", "check_values", "__init__"},
    "hvdtrain/observe/tracking.py": {"start", "flat_params"},  # the whole config is the run's params
    "hvdtrain/core/config.py": {"_resolve_paths"},
    "yarn/submit.py": {"build_plan", "launch", "staged_inputs"},
    "yarn/driver.py": {"run_job", "rank_job"},  # rank_job: the config the ranks load, whole
    "yarn/etl_submit.py": {"build_etl_plan"},
    "yarn/score.py": {"build_score_plan"},
}
WHOLE = {"flat", "to_dict", "to_yaml", "check_output_folders"}  # methods on the whole config
HASHED = "section_hash"  # cfg.section_hash("a", "b") reads the blocks it names


def _config_uses(root: pathlib.Path) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef, str, set[str], bool]]:
    """(file, function, parameter, blocks it reads, whether it uses the config whole) per JobConfig parameter."""
    out = []
    for rel, node in _functions(root):
        for arg in node.args.posonlyargs + node.args.args + node.args.kwonlyargs:
            if arg.annotation is None or not re.fullmatch(r"(Optional\[)?(\w+\.)?JobConfig\]?",
                                                           ast.unparse(arg.annotation)):
                continue
            read = {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
                    and isinstance(n.value, ast.Name) and n.value.id == arg.arg}
            read |= {a.value for n in ast.walk(node) if isinstance(n, ast.Call)
                     and isinstance(n.func, ast.Attribute) and n.func.attr == HASHED
                     and isinstance(n.func.value, ast.Name) and n.func.value.id == arg.arg
                     for a in n.args if isinstance(a, ast.Constant)}
            parents = {id(n.value) for n in ast.walk(node) if isinstance(n, ast.Attribute)}
            bare = any(isinstance(n, ast.Name) and n.id == arg.arg and isinstance(n.ctx, ast.Load)
                       and id(n) not in parents for n in ast.walk(node))
            out.append((rel, node, arg.arg, read - WHOLE - {HASHED}, bare or bool(read & WHOLE)))
    return out


def _wide_inputs(root: pathlib.Path, entry_points: dict[str, set[str]]) -> list[str]:
    found, seen = [], set()
    for rel, node, name, blocks, whole in _config_uses(root):
        where = f"{rel}:{node.lineno} {node.name}({name})"
        if node.name in entry_points.get(rel, set()):
            seen.add((rel, node.name))
            if not whole:  # the list stays the functions that need the whole config
                found.append(f"{where} is listed as an entry point but reads blocks only")
            continue
        if whole:
            found.append(f"{where} uses the whole JobConfig but is no entry point")
        elif len(blocks) < 2:
            found.append(f"{where} reads {', '.join(sorted(blocks)) or 'nothing'} of it: take that instead")
        else:
            doc = ast.get_docstring(node) or ""
            said = next((line for line in doc.splitlines() if line.strip().startswith("Reads ")), "")
            named = set(re.findall(rf"\b{name}\.(\w+)", said))
            if named != blocks:
                found.append(f"{where} reads {', '.join(f'{name}.{b}' for b in sorted(blocks))}; its docstring "
                             f"says {said.strip()!r}")
    stale = {(rel, fn) for rel, names in entry_points.items() for fn in names} - seen
    found += [f"{rel} {fn}: listed as an entry point but takes no JobConfig there" for rel, fn in sorted(stale)
              if (root.parent / rel).is_relative_to(root)]
    return found


def test_functions_take_the_config_blocks_they_read() -> None:
    assert [line for package in PACKAGES for line in _wide_inputs(REPO / package, ENTRY_POINTS)] == []


def test_the_narrow_input_checker_sees_a_wide_one(tmp_path: pathlib.Path) -> None:
    pkg = _package(
        tmp_path,
        "def one(cfg: JobConfig):\n    return cfg.etl.seed\n\n"
        "def two(cfg: JobConfig):\n    '''Reads cfg.etl.'''\n    return cfg.etl, cfg.source\n\n"
        "def said(cfg: JobConfig):\n    '''Sums.\n\n    Reads cfg.etl and cfg.source.\n    '''\n"
        "    return cfg.etl, cfg.source\n\n"
        "def hub(cfg: JobConfig):\n    return said(cfg)\n\n"
        "def entry(cfg: JobConfig):\n    return said(cfg)\n\n"
        "def narrow_entry(cfg: JobConfig):\n    return cfg.etl, cfg.source\n")
    assert _wide_inputs(pkg, {"pkg/m.py": {"entry", "narrow_entry", "gone"}}) == [
        "pkg/m.py:1 one(cfg) reads etl of it: take that instead",
        "pkg/m.py:4 two(cfg) reads cfg.etl, cfg.source; its docstring says 'Reads cfg.etl.'",
        "pkg/m.py:15 hub(cfg) uses the whole JobConfig but is no entry point",
        "pkg/m.py:21 narrow_entry(cfg) is listed as an entry point but reads blocks only",
        "pkg/m.py gone: listed as an entry point but takes no JobConfig there"]
