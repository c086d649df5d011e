"""monitoring_overhead: training throughput with monitoring on at its defaults (Prometheus hook and writer,
fused step) ÷ off, interleaved in one -np 2 job; monitoring_overhead_breakdown: the same with
monitoring.step_breakdown on (the timed step and the per-epoch breakdown; report only)."""
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
    from hvdtrain.data.synthetic import Layout, TextSpec, make_text_dataset

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
    off = out["samples_per_sec"]["off"]
    defaults = paired_ratios(out["samples_per_sec"]["metrics_only"], off)  # monitoring's defaults
    breakdown = paired_ratios(out["samples_per_sec"]["on"], off)
    return [Entry("monitoring_overhead", statistics.median(defaults), "x (on/off)",
                  "monitoring off, interleaved in the same job", 1.0, 0.99,
                  notes={"what": "monitoring on at its defaults: Prometheus hook and writer, fused step",
                         "ratio_min": min(defaults), "ratio_median": statistics.median(defaults),
                         "ratio_max": max(defaults), "on_samples_per_sec": out["samples_per_sec"]["metrics_only"],
                         "off_samples_per_sec": off, "steps_per_repetition": int(steps), "repetitions": int(reps),
                         "np": 2, "interval_seconds": out["interval_seconds"]}),
            Entry("monitoring_overhead_breakdown", statistics.median(breakdown), "x (on/off)",
                  "monitoring off, interleaved in the same job", 1.0, None,
                  notes={"what": "monitoring.step_breakdown: true (timed step, per-epoch breakdown)",
                         "ratio_min": min(breakdown), "ratio_median": statistics.median(breakdown),
                         "ratio_max": max(breakdown), "samples_per_sec": out["samples_per_sec"]["on"]})]
