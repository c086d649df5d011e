"""Horovod's own TensorFlow tests against the Horovod this project builds (tier `horovod_upstream`).

Horovod v0.28.1's `test/parallel/test_tensorflow.py` and `test_tensorflow2_keras.py`, unmodified,
live in `../shared/horovod-upstream-tests/` (or wherever HVDTRAIN_HOROVOD_TESTS points). The files
run from a temporary copy, together in one `horovodrun -np 2 -H localhost:2 --gloo` (one TensorFlow
start per rank), every rank writes a JUnit report, and the test fails on any failed or erroring upstream test,
or on a file whose count of passed tests differs from EXPECTED_PASSED, except those in
NOT_APPLICABLE: tests whose own code uses Keras 2 API that Keras 3 removed. Those are ported to
Keras 3 in tests/support/horovod_keras3_ports.py, which runs here the same way.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PORTS = Path(__file__).resolve().parents[1] / "support" / "horovod_keras3_ports.py"
ENV_VAR = "HVDTRAIN_HOROVOD_TESTS"

_KERAS2_COMPILE = "compile(experimental_run_tf_function=False), which Keras 3's compile() rejects"
_TESTING_OPTIMIZER = ("its TestingOptimizer calls Keras 3's Optimizer.__init__ without the required "
                      "learning_rate and defines the Keras 2 update_step(gradient, variable)")

# {test id: why it cannot run on Keras 3}. Each one fails inside the test's own code, before
# Horovod is reached; the port of the same name in tests/support/horovod_keras3_ports.py covers it.
NOT_APPLICABLE: dict[str, str] = {
    "test_tensorflow.py::TensorFlowTests::test_horovod_syncbn_cpu":
        "builds keras.layers.BatchNormalization(fused=False); Keras 3 has no `fused` argument",
    "test_tensorflow2_keras.py::Tf2KerasTests::test_legacy_optimizer":
        "imports keras.optimizers.legacy, removed in Keras 3 (lives in tf_keras, not installed); "
        "no port: Horovod's legacy-optimizer path is Keras 2 only",
    "test_tensorflow2_keras.py::Tf2KerasTests::test_train_model_lr_schedule":
        "uses keras.losses.mean_squared_error, layers.ThresholdedReLU and optimizer.lr (removed "
        "in Keras 3) and " + _KERAS2_COMPILE,
    "test_tensorflow2_keras.py::Tf2KerasTests::test_sparse_as_dense":
        "passes RMSprop(lr=...) (Keras 3: learning_rate only) and " + _KERAS2_COMPILE,
    "test_tensorflow2_keras.py::Tf2KerasTests::test_sparse_as_dense_with_grad_aggregation":
        "passes RMSprop(lr=...) (Keras 3: learning_rate only) and " + _KERAS2_COMPILE,
    "test_tensorflow2_keras.py::Tf2KerasTests::test_gradient_aggregation_0": _TESTING_OPTIMIZER,
    "test_tensorflow2_keras.py::Tf2KerasTests::test_gradient_aggregation_1": _TESTING_OPTIMIZER,
    "test_tensorflow2_keras.py::Tf2KerasTests::test_gradient_aggregation_with_local_vars_0": _TESTING_OPTIMIZER,
    "test_tensorflow2_keras.py::Tf2KerasTests::test_gradient_aggregation_with_local_vars_1": _TESTING_OPTIMIZER,
}

# Passed tests per rank when everything applicable passes (the files are pinned to v0.28.1,
# so a different count means tests were skipped or lost, which would hide failures). Counted
# per test in the JUnit report: test_tensorflow.py runs most tests in graph and eager mode as
# subtests, which pytest's summary counts separately (147 passed there; 58 tests, 112 in
# pytest's count, skip as GPU-only or graph-mode legacy optimizer).
EXPECTED_PASSED = {
    "test_tensorflow.py": 86,
    "test_tensorflow2_keras.py": 5,
    "horovod_keras3_ports.py": 8,
}
# Generous: test_tensorflow.py took 9.5 min on a 2-core machine shared with other heavy jobs.
TIMEOUT_S = {"test_tensorflow.py": 1500, "test_tensorflow2_keras.py": 600, "horovod_keras3_ports.py": 600}


def upstream_tests_folder() -> Path:
    """Where the upstream test files are: $HVDTRAIN_HOROVOD_TESTS, else <repo>/../shared/..."""
    configured = os.environ.get(ENV_VAR)
    folder = Path(configured) if configured else REPO.parent / "shared" / "horovod-upstream-tests"
    if not (folder / "parallel" / "test_tensorflow.py").is_file():
        pytest.fail(f"Horovod's upstream tests not found: looked for parallel/test_tensorflow.py in "
                    f"{folder}{' (from ' + ENV_VAR + ')' if configured else ''}; put the "
                    f"horovod-upstream-tests folder beside the repository or set {ENV_VAR}=/path/to/it",
                    pytrace=False)
    return folder


def read_junit(path: Path) -> dict[str, str]:
    """{test id: passed|failed|skipped} from one rank's JUnit XML; the id starts with the test's file, from its
    class's module (``test_tensorflow.TensorFlowTests`` -> ``test_tensorflow.py``).

    A test whose subtests (graph/eager mode) fail or error in any mode is failed.
    """
    outcomes = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        module, _, cls = case.get("classname", "").rpartition(".")
        test_id = f"{module.rsplit('.', 1)[-1]}.py::{cls}::{case.get('name')}"
        tags = {child.tag for child in case}
        outcomes[test_id] = ("failed" if tags & {"failure", "error"}
                             else "skipped" if "skipped" in tags else "passed")
    return outcomes


def judge(file_name: str, per_rank: list[dict[str, str]]) -> list[str]:
    """Problems in the ranks' outcomes (empty when the file passes as expected)."""
    problems = []
    for rank, outcomes in enumerate(per_rank):
        failed = sorted(t for t, o in outcomes.items() if o == "failed" and t not in NOT_APPLICABLE)
        problems += [f"rank {rank}: FAILED {t}" for t in failed]
        stale = sorted(t for t, o in outcomes.items() if o == "passed" and t in NOT_APPLICABLE)
        problems += [f"rank {rank}: {t} passes now; remove it from NOT_APPLICABLE" for t in stale]
        passed = sum(o == "passed" for o in outcomes.values())
        if passed != EXPECTED_PASSED[file_name]:
            problems.append(f"rank {rank}: {passed} passed, expected {EXPECTED_PASSED[file_name]}")
    return problems


def run_files(workdir: Path, file_names: list[str]) -> dict[str, list[dict[str, str]]]:
    """Run the test files in one ``horovodrun -np 2 --gloo`` (one TensorFlow start per rank, not one per file);
    each file's outcomes per rank."""
    parallel = workdir / "parallel"
    reports = workdir / "reports"
    reports.mkdir(exist_ok=True)
    bindir = Path(sys.executable).parent
    rank_cmd = (f"exec {sys.executable} -m pytest -q -p no:cacheprovider -o addopts= {' '.join(file_names)} "
                f"--junitxml={reports}/upstream.rank${{HOROVOD_RANK}}.xml")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(workdir / "utils"), str(REPO)]),
               PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    proc = subprocess.run([str(bindir / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo",
                           "sh", "-c", rank_cmd], cwd=parallel, env=env, capture_output=True,
                          text=True, timeout=sum(TIMEOUT_S[f] for f in file_names))
    paths = [reports / f"upstream.rank{rank}.xml" for rank in range(2)]
    if not all(p.is_file() for p in paths):
        pytest.fail(f"{' '.join(file_names)}: horovodrun exited {proc.returncode} without both ranks' reports; "
                    f"output tail:\n{(proc.stdout + proc.stderr)[-4000:]}", pytrace=False)
    per_rank = [read_junit(p) for p in paths]
    outside = sorted({t for outcomes in per_rank for t in outcomes if not t.startswith(tuple(f"{f}::" for f in file_names))})
    if outside:  # e.g. a file that failed to import: pytest reports it under no test file
        pytest.fail(f"outcomes outside the test files (a collection error?): {outside}; output tail:\n"
                    f"{(proc.stdout + proc.stderr)[-4000:]}", pytrace=False)
    return {f: [{t: o for t, o in outcomes.items() if t.startswith(f"{f}::")} for outcomes in per_rank]
            for f in file_names}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private copy of the upstream files (pytest writes caches next to them) plus the ports."""
    target = tmp_path_factory.mktemp("hvd-upstream") / "tests"
    shutil.copytree(upstream_tests_folder(), target)
    shutil.copy(PORTS, target / "parallel" / PORTS.name)
    return target


@pytest.mark.horovod_upstream
@pytest.mark.timeout(3000)
def test_horovod_upstream_files(workdir: Path) -> None:
    outcomes = run_files(workdir, list(EXPECTED_PASSED))
    problems = [f"{f}: {p}" for f, per_rank in outcomes.items() for p in judge(f, per_rank)]
    assert not problems, "under horovodrun -np 2 --gloo:\n" + "\n".join(problems)


def test_judge_reports_unlisted_failures_stale_entries_and_lost_tests() -> None:
    listed = "test_tensorflow2_keras.py::Tf2KerasTests::test_legacy_optimizer"
    ok = {f"test_tensorflow2_keras.py::Tf2KerasTests::t{i}": "passed" for i in range(5)}
    assert judge("test_tensorflow2_keras.py", [dict(ok, **{listed: "failed"})] * 2) == []
    broken = dict(ok, **{"test_tensorflow2_keras.py::Tf2KerasTests::t0": "failed"})
    assert judge("test_tensorflow2_keras.py", [ok, broken]) == [
        "rank 1: FAILED test_tensorflow2_keras.py::Tf2KerasTests::t0",
        "rank 1: 4 passed, expected 5"]
    assert judge("test_tensorflow2_keras.py", [dict(ok, **{listed: "passed"}), ok])[0] == (
        f"rank 0: {listed} passes now; remove it from NOT_APPLICABLE")
    skipped = dict(ok, **{"test_tensorflow2_keras.py::Tf2KerasTests::t4": "skipped"})
    assert judge("test_tensorflow2_keras.py", [skipped, ok]) == ["rank 0: 4 passed, expected 5"]


def test_missing_upstream_folder_fails_naming_where_it_looked(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "nowhere"))
    with pytest.raises(pytest.fail.Exception, match=f"nowhere.*{ENV_VAR}"):
        upstream_tests_folder()
