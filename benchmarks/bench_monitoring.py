"""monitoring_overhead: training throughput with monitoring on (the defaults) ÷ off, interleaved in one -np 2
job; monitoring_overhead_metrics_only: the same with monitoring.step_breakdown off (report only)."""
from __future__ import annotations

import os
import shutil
import statistics
import tempfile

from benchmarks.common import Entry
from benchmarks.launch import ROOT, horovodrun


def paired_ratios(on: list[float], off: list[float]) -> list[float]:
    """on/off throughput of each interleaved repetition (pure): pairs share the machine's load of the moment."""
    return [a / b for a, b in zip(on, off)]


def run(quick: bool, extra: dict) -> list[Entry]:
    from hvdtrain.synthetic import Layout, TextSpec, make_text_dataset

    steps, reps = ("10", "1") if quick else ("100", "9")
    root = tempfile.mkdtemp(prefix="bench-monitoring-")
    try:
        make_text_dataset(f"{root}/data", TextSpec(layout=Layout(
            n_per_split={"train": 8192, "validation": 64, "test": 64}, shards_per_split=4), num_classes=4,
            max_length=64, vocab_size=2000, seed=3))
        out = horovodrun(2, "benchmarks.monitoring_worker", [f"{root}/data", steps, reps, f"{root}/metrics"],
                         env={"PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)})
    finally:
        shutil.rmtree(root, ignore_errors=True)
    on, off = out["samples_per_sec"]["on"], out["samples_per_sec"]["off"]
    ratios = paired_ratios(on, off)
    lean = paired_ratios(out["samples_per_sec"]["metrics_only"], off)
    return [Entry("monitoring_overhead", statistics.median(ratios), "x (on/off)",
                  "monitoring off, interleaved in the same job", 1.0, 0.99,
                  notes={"ratio_min": min(ratios), "ratio_median": statistics.median(ratios),
                         "ratio_max": max(ratios), "on_samples_per_sec": on, "off_samples_per_sec": off,
                         "steps_per_repetition": int(steps), "repetitions": int(reps), "np": 2,
                         "interval_seconds": out["interval_seconds"]}),
            Entry("monitoring_overhead_metrics_only", statistics.median(lean), "x (on/off)",
                  "monitoring off, interleaved in the same job", 1.0, None,
                  notes={"what": "monitoring.step_breakdown: false (fused step, Prometheus hook and writer only)",
                         "ratio_min": min(lean), "ratio_median": statistics.median(lean), "ratio_max": max(lean),
                         "samples_per_sec": out["samples_per_sec"]["metrics_only"]})]
