"""Benchmark machinery that decides figures: interleaving, paired ratios, the GPU bench's refusal."""
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import common, gpu

REPO = Path(__file__).resolve().parents[2]


def test_interleaved_alternates_sides_after_warmup_and_runs_before_untimed():
    calls = []
    times = common.interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, reps=3, warmup=1,
                               before=lambda: calls.append("|"))
    assert calls == ["|", "a", "|", "b"] * 4
    assert [len(times["a"]), len(times["b"])] == [3, 3] and all(t >= 0 for t in times["a"] + times["b"])


def test_paired_entry_reports_the_spread_and_passes_on_the_median_pair_ratio():
    # Pair ratios 1, 10, 0.3: median 1.0. The ratio of the medians (3 / 1) would pass a target of 2.
    e = common.Entry.paired("x", [1.0, 10.0, 3.0], "u", "base", [1.0, 1.0, 10.0], 2.0)
    assert e.ratio == pytest.approx(1.0) and e.passed is False
    d = e.to_dict()
    assert (d["ratio_min"], d["ratio_median"], d["ratio_max"]) == pytest.approx((0.3, 1.0, 10.0))
    assert (d["value"], d["baseline_value"]) == (3.0, 1.0)
    assert "1.000 (0.300–10.000)" in common.markdown_table([e])
    assert common.Entry("y", 4.0, "u", "b", 2.0, 1.5).to_dict().get("ratio_min") is None


def test_paired_entry_refuses_unmatched_repetitions():
    with pytest.raises(ValueError, match="x: need equal"):
        common.Entry.paired("x", [1.0, 2.0], "u", "base", [1.0], 1.0)


def test_gpu_problem_names_the_missing_piece_and_the_fix():
    assert "no CUDA GPU" in gpu.gpu_problem(0, False) and "HVDTRAIN_TF=gpu" in gpu.gpu_problem(0, False)
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in gpu.gpu_problem(2, False)
    assert gpu.gpu_problem(2, True) is None


@pytest.mark.skipif(gpu.nvidia_present(), reason="this host has an NVIDIA driver: bench-gpu would run")
def test_bench_gpu_without_a_gpu_stops_with_one_line():
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu", "--out", "/nonexistent/never-written"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == gpu.NO_GPU_EXIT and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [gpu.gpu_problem(0, False)]
