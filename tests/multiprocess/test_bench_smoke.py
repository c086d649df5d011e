"""`make bench` in its --quick size: the runner writes valid results (JSON, markdown table, charts).

Checks the shape of what is written, never the figures: benchmark numbers
depend on the machine and are judged in the closing note, not here. The run
takes the groups that exercise every part of the runner (plain and paired
entries, both charts) in about 20 seconds; every group's module is imported
and its entry point checked, and `make bench` runs them all.
"""
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.multiprocess]

REPO = Path(__file__).resolve().parents[2]
FIELDS = {"name", "value", "unit", "baseline_name", "baseline_value", "ratio", "target", "passed"}
# The groups the smoke run takes: a Horovod job with paired entries (allreduce, with the bus-bandwidth chart) and
# plain entries written from files (checkpoint). The input group (10 s more) runs in `make bench` only.
SMOKE_GROUPS = ("allreduce", "checkpoint")
EXPECTED = {"allreduce_vs_tcp", "allreduce_vs_tf_ring", "allreduce_fusion", "checkpoint_save", "checkpoint_restore"}
# Peer comparisons: interleaved repetitions, a min/median/max of the per-pair ratios.
PAIRED = {"input_vs_stock", "allreduce_vs_tcp", "allreduce_vs_tf_ring", "train_vs_mwms", "embedding_sparse_vs_dense",
          "etl_high_cardinality", "etl_high_cardinality_spark_floor", "etl_write"}


def test_every_group_module_has_a_runner():
    from benchmarks import run

    for group, name in run.GROUPS.items():
        module = importlib.import_module(name)
        assert callable(getattr(module, "run", None)), f"{group}: {name} has no run(quick, extra)"


@pytest.mark.timeout(900)  # above the subprocess's own limit, which reports what it printed
def test_quick_benchmarks_write_json_markdown_and_charts(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "benchmarks.run", "--quick", "--only", ",".join(SMOKE_GROUPS),
                           "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    doc = json.loads((tmp_path / "latest.json").read_text())
    assert doc["quick"] is True and doc["errors"] == {}
    assert doc["machine"]["cores"] >= 1 and "tensorflow-cpu" in doc["machine"]
    names = {e["name"] for e in doc["entries"]}
    assert names == EXPECTED
    for e in doc["entries"]:
        assert FIELDS <= set(e), e
        assert e["value"] > 0 and e["baseline_value"] > 0
        if e["name"] in PAIRED:
            assert e["ratio_min"] <= e["ratio_median"] == e["ratio"] <= e["ratio_max"], e
        else:
            assert e["ratio"] == pytest.approx(e["value"] / e["baseline_value"], rel=1e-3)
        assert e["passed"] is None if e["target"] is None else isinstance(e["passed"], bool)
    table = (tmp_path / "latest.md").read_text()
    assert all(f"| {n} |" in table for n in EXPECTED)
    assert (tmp_path / "ratios.png").stat().st_size > 1000 and (tmp_path / "allreduce_busbw.png").stat().st_size > 1000
