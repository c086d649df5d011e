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

REPO = Path(__file__).resolve().parents[2]
FIELDS = {"name", "value", "unit", "baseline_name", "baseline_value", "ratio", "target", "passed"}
EXPECTED = {"etl_write", "input_raw", "input_pipeline", "input_vs_stock", "parse_vectorized", "staging_overlap",
            "allreduce_vs_tcp", "allreduce_vs_tf_ring", "allreduce_fusion", "hvd_overhead", "scaling_np2",
            "launch_overhead", "checkpoint_save", "checkpoint_restore", "monitoring_overhead",
            "monitoring_overhead_breakdown", "score_throughput", "score_throughput_all_cores", "score_vs_pyfunc",
            "train_vs_mwms",
            "tune_efficiency", "tune_best_accuracy", "overlap_gain", "scale_model_np1", "scale_model_np2",
            "vocab_driver_memory", "embedding_sparse_vs_dense", "etl_high_cardinality",
            "etl_high_cardinality_driver_memory"}
# Peer comparisons: interleaved repetitions, a min/median/max of the per-pair ratios.
PAIRED = {"input_vs_stock", "allreduce_vs_tcp", "allreduce_vs_tf_ring", "train_vs_mwms", "embedding_sparse_vs_dense",
          "etl_high_cardinality"}


@pytest.mark.timeout(1500)  # above the subprocess's own limit, which reports what it printed
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
        if e["name"] in PAIRED:
            assert e["ratio_min"] <= e["ratio_median"] == e["ratio"] <= e["ratio_max"], e
        else:
            assert e["ratio"] == pytest.approx(e["value"] / e["baseline_value"], rel=1e-3)
        assert e["passed"] is None if e["target"] is None else isinstance(e["passed"], bool)
    table = (tmp_path / "latest.md").read_text()
    assert all(f"| {n} |" in table for n in EXPECTED)
    fit = next(e for e in doc["entries"] if e["name"] == "train_vs_mwms")["notes"]["model_fit_attempt"]
    assert fit.startswith("model.fit"), fit  # the MWMS worker really tried Keras model.fit once
    assert (tmp_path / "ratios.png").stat().st_size > 1000 and (tmp_path / "allreduce_busbw.png").stat().st_size > 1000
