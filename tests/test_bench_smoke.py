"""`make bench` in its --quick size: the script runs and writes valid results.

Checks the shape of what is written, never the figures: benchmark numbers
depend on the machine and are judged in the closing note, not here.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.multiprocess]

REPO = Path(__file__).resolve().parents[1]
FIELDS = {"name", "value", "unit", "baseline_name", "baseline_value", "ratio", "target", "passed"}
EXPECTED = {"etl_write", "input_raw", "input_pipeline", "parse_vectorized", "staging_overlap", "allreduce_busbw",
            "allreduce_fusion", "hvd_overhead", "scaling_np2", "launch_overhead", "checkpoint_save",
            "checkpoint_restore", "monitoring_overhead", "monitoring_overhead_breakdown", "score_throughput",
            "score_vs_pyfunc", "tune_efficiency", "tune_best_accuracy", "vocab_driver_memory"}


def test_quick_benchmarks_write_json_markdown_and_charts(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "benchmarks.run", "--quick", "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    doc = json.loads((tmp_path / "latest.json").read_text())
    assert doc["quick"] is True and doc["errors"] == {}
    assert doc["machine"]["cores"] >= 1 and "tensorflow-cpu" in doc["machine"]
    names = {e["name"] for e in doc["entries"]}
    assert names == EXPECTED
    for e in doc["entries"]:
        assert FIELDS <= set(e), e
        assert e["value"] > 0 and e["baseline_value"] > 0
        assert e["ratio"] == pytest.approx(e["value"] / e["baseline_value"], rel=1e-3)
        assert e["passed"] is None if e["target"] is None else isinstance(e["passed"], bool)
    table = (tmp_path / "latest.md").read_text()
    assert all(f"| {n} |" in table for n in EXPECTED)
    assert (tmp_path / "ratios.png").stat().st_size > 1000 and (tmp_path / "allreduce_busbw.png").stat().st_size > 1000
