"""overlap_gain, scale_model_np1/np2: the overlapped all-reduce, and the scale model against measurements.

All on benchmarks/overlap_worker.py's 17-layer MLP (15.8 M parameters, 63 MB of float32 gradients).
"""
from __future__ import annotations

import os
import statistics

from benchmarks import scale_model as sm
from benchmarks.bench_allreduce import memcpy_gbps
from benchmarks.common import Entry
from benchmarks.launch import horovodrun, plain, plain_many

QUICK_MODEL = {True: ["--width", "128"], False: []}  # --quick (the suite's smoke run): a narrow model


def spread(values: list[float]) -> dict[str, float]:
    return {"min": round(min(values), 4), "median": round(statistics.median(values), 4),
            "max": round(max(values), 4)}


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def overlap_gain(quick: bool) -> Entry:
    """Grouped ÷ overlapped step time, interleaved in the same 2 processes (default threads)."""
    reps, steps = (2, "2") if quick else (7, "5")
    out = horovodrun(2, "benchmarks.overlap_worker", [steps, "--reps", str(reps), *QUICK_MODEL[quick]])
    grouped, overlap = out["step_seconds"]["grouped"], out["step_seconds"]["overlap"]
    ratios = [g / o for g, o in zip(grouped, overlap)]
    return Entry("overlap_gain", statistics.median(ratios), "x", "grouped all-reduce (ratio of step times)", 1.0,
                 1.0, notes={"ratio": spread(ratios), "grouped_s": spread(grouped), "overlap_s": spread(overlap),
                             "reps": reps, "steps_per_rep": int(steps), "layers": out["layers"],
                             "params": out["params"], "ranks": 2, "loadavg": load()})


def measured_link(quick: bool, extra: dict) -> sm.Link:
    """B and alpha fitted to Horovod's all-reduce sweep at 2 ranks (the allreduce group's, when it ran in this
    run); the fusion copy at memcpy speed."""
    sweep = extra.get("allreduce_sweep") or \
        horovodrun(2, "benchmarks.allreduce_worker", ["sweep", "--quick"] if quick else ["sweep"])["sweep"]
    return sm.fit_link([(p["bytes"], p["seconds"]) for p in sweep], 2, memcpy_gbps() * 1e9)


def model_check(quick: bool, extra: dict) -> list[Entry]:
    """Predicted step time (scale_model) ÷ measured, at 1 and 2 ranks, 1 thread per rank, grouped all-reduce."""
    link = measured_link(quick, extra)
    reps, steps = (1, "2") if quick else (5, "5")
    args = [steps, "--threads", "1", *QUICK_MODEL[quick]]
    compute, busy, np1, np2, size = [], [], [], [], {}
    for _ in range(reps):  # interleaved: plain, 2 plain at once, np1, np2, plain, ...
        compute.append(statistics.median(plain("benchmarks.overlap_worker", args)["step_seconds"]["grouped"]))
        busy.append(statistics.median(t for r in plain_many(2, "benchmarks.overlap_worker", args)
                                      for t in r["step_seconds"]["grouped"]))
        np1.append(statistics.median(horovodrun(1, "benchmarks.overlap_worker", args)["step_seconds"]["grouped"]))
        size = horovodrun(2, "benchmarks.overlap_worker", args)
        np2.append(statistics.median(size["step_seconds"]["grouped"]))
    # The model's measured input: compute per step of a plain process (no launcher, no Horovod), on a host
    # that runs as many such processes as the ranks it holds. On a GPU host each rank has its own device;
    # here the 2 ranks share the 2 cores' caches and memory bandwidth (and each other's spare core).
    work = {1: sm.Workload(compute_seconds=statistics.median(compute), gradient_bytes=size["gradient_bytes"]),
            2: sm.Workload(compute_seconds=statistics.median(busy), gradient_bytes=size["gradient_bytes"])}
    notes = {"bandwidth_gbps": round(link.bandwidth / 1e9, 3), "latency_us": round(link.latency * 1e6, 1),
             "copy_gbps": round(link.copy_bandwidth / 1e9, 2), "gradient_bytes": size["gradient_bytes"],
             "compute_s": spread(compute), "compute_2_at_once_s": spread(busy), "loadavg": load(),
             "sweep": "the allreduce group's" if extra.get("allreduce_sweep") else "its own"}
    entries = []
    for n, measured in ((1, np1), (2, np2)):
        predicted = sm.step_seconds(work[n], n, link)
        entries.append(Entry(f"scale_model_np{n}", predicted, "s", f"measured step time at {n} rank(s)",
                             statistics.median(measured), None,
                             notes={**notes, "measured_s": spread(measured), "within_15pct":
                                    abs(predicted / statistics.median(measured) - 1) <= 0.15,
                                    "predicted_from_1_process_compute_s": sm.step_seconds(work[1], n, link)}))
    return entries


def run(quick: bool, extra: dict) -> list[Entry]:
    return [overlap_gain(quick), *model_check(quick, extra)]
