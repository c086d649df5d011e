"""Shared benchmark machinery: timing, result entries, machine facts, reports.

Every figure is a ratio against a baseline measured in the same run on the
same machine; each timing is the median of at least 5 repetitions after a
warm-up. Peer comparisons interleave the two sides (A, B, A, B, ...: see
:func:`interleaved`) so that load on a shared machine hits both alike, and
report the min, median and max of the per-pair ratios; ``passed`` then uses
the median. These are benchmarks, never timed tests: nothing here fails a build.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional, Sequence

REPS = 5


@dataclass
class Entry:
    """One benchmark figure (the schema of results/latest.json)."""

    name: str
    value: float
    unit: str
    baseline_name: str
    baseline_value: float
    target: Optional[float]  # None: report only
    lower_is_better: bool = False
    notes: dict[str, Any] = field(default_factory=dict)
    # Per-pair ratios of interleaved repetitions (value_i / baseline_i); when set, ``ratio`` is their median
    # and value/baseline_value are the medians of each side.
    pair_ratios: Optional[list[float]] = None

    @property
    def ratio(self) -> float:
        if self.pair_ratios:
            return statistics.median(self.pair_ratios)
        return self.value / self.baseline_value if self.baseline_value else float("nan")

    @property
    def spread(self) -> Optional[dict[str, float]]:
        """min/median/max of the per-pair ratios, or None for a single-ratio entry."""
        if not self.pair_ratios:
            return None
        return {"min": min(self.pair_ratios), "median": self.ratio, "max": max(self.pair_ratios)}

    @property
    def passed(self) -> Optional[bool]:
        if self.target is None:
            return None
        return self.ratio <= self.target if self.lower_is_better else self.ratio >= self.target

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ratio"] = float(f"{self.ratio:.6g}")
        d["passed"] = self.passed
        if self.spread:
            d.update({f"ratio_{k}": float(f"{v:.6g}") for k, v in self.spread.items()})
        return d

    @classmethod
    def paired(cls, name: str, values: Sequence[float], unit: str, baseline_name: str, baselines: Sequence[float],
               target: Optional[float], **kw: Any) -> "Entry":
        """An entry from interleaved repetitions: pair i is (values[i], baselines[i])."""
        if len(values) != len(baselines) or not values:
            raise ValueError(f"{name}: need equal, non-empty repetitions (got {len(values)} and {len(baselines)})")
        ratios = [v / b for v, b in zip(values, baselines)]
        return cls(name, statistics.median(values), unit, baseline_name, statistics.median(baselines), target,
                   pair_ratios=ratios, **kw)


def median_time(fn: Callable[[], Any], reps: int = REPS, warmup: int = 1) -> float:
    """Median wall seconds of ``fn`` over ``reps`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved(fns: dict[str, Callable[[], Any]], reps: int = REPS, warmup: int = 1,
                before: Optional[Callable[[], Any]] = None) -> dict[str, list[float]]:
    """Wall seconds of each of ``fns``, run in turn (A, B, A, B, ...) ``reps`` times each after ``warmup`` rounds.

    Interleaving makes a burst of load on a shared machine hit both sides of a
    comparison instead of one; the caller pairs the i-th times of A and B.
    ``before`` runs untimed ahead of every call (e.g. a barrier between ranks).
    """
    times: dict[str, list[float]] = {name: [] for name in fns}
    for round_ in range(warmup + reps):
        for name, fn in fns.items():
            if before is not None:
                before()
            start = time.perf_counter()
            fn()
            if round_ >= warmup:
                times[name].append(time.perf_counter() - start)
    return times


def interleaved_results(fns: dict[str, Callable[[], dict]], reps: int = REPS) -> dict[str, list[dict]]:
    """Like :func:`interleaved` for runs that measure themselves (e.g. a launched job's JSON result), no warm-up."""
    out: dict[str, list[dict]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            out[name].append(fn())
    return out


def machine() -> dict[str, Any]:
    import importlib.metadata as md

    facts: dict[str, Any] = {"cores": os.cpu_count(), "python": platform.python_version(),
                             "platform": platform.platform(), "machine": platform.machine()}
    try:
        with open("/proc/meminfo") as fh:
            facts["memory_gb"] = round(int(fh.readline().split()[1]) / 1024 ** 2, 1)
    except OSError:
        pass
    for dist in ("tensorflow-cpu", "tensorflow", "keras", "horovod", "pyspark", "protobuf", "numpy"):
        try:
            facts[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    return facts


def write_reports(entries: list[Entry], out_dir: str, extra: dict[str, Any]) -> dict[str, str]:
    """results/latest.json, latest.md and charts; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    doc = {"machine": machine(), "entries": [e.to_dict() for e in entries], **extra}
    paths = {"json": os.path.join(out_dir, "latest.json"), "md": os.path.join(out_dir, "latest.md")}
    with open(paths["json"], "w") as fh:
        json.dump(doc, fh, indent=2)
    with open(paths["md"], "w") as fh:
        fh.write(markdown_table(entries) + "\n")
    paths.update(charts(entries, extra, out_dir))
    return paths


def markdown_table(entries: list[Entry]) -> str:
    rows = ["| benchmark | value | baseline | ratio | target | met |", "|---|---|---|---|---|---|"]
    for e in entries:
        target = "report" if e.target is None else ("≤ " if e.lower_is_better else "≥ ") + f"{e.target:g}"
        met = "—" if e.passed is None else ("yes" if e.passed else "**no**")
        ratio = f"{e.ratio:.3f}" + (f" ({e.spread['min']:.3f}–{e.spread['max']:.3f})" if e.spread else "")
        rows.append(f"| {e.name} | {e.value:,.4g} {e.unit} | {e.baseline_name}: {e.baseline_value:,.4g} {e.unit} "
                    f"| {ratio} | {target} | {met} |")
    return "\n".join(rows)


def charts(entries: list[Entry], extra: dict[str, Any], out_dir: str) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = {}
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * max(1, len(entries))))
    names = [e.name for e in entries]
    ax.barh(names, [e.ratio for e in entries],
            color=["grey" if e.passed is None else ("tab:green" if e.passed else "tab:red") for e in entries])
    for i, e in enumerate(entries):
        if e.target is not None:
            ax.plot([e.target, e.target], [i - 0.4, i + 0.4], color="black")
    ax.invert_yaxis()
    ax.set_xlabel("ratio to baseline (black line: target)")
    fig.tight_layout()
    paths["ratios_png"] = os.path.join(out_dir, "ratios.png")
    fig.savefig(paths["ratios_png"], dpi=100)
    plt.close(fig)
    sweep = extra.get("allreduce_sweep")
    if sweep:
        fig, ax = plt.subplots(figsize=(7, 4))
        sizes = [p["bytes"] for p in sweep]
        ax.plot(sizes, [p["busbw_gbps"] for p in sweep], marker="o", label="Gloo all-reduce bus bandwidth")
        if extra.get("tcp_gbps"):
            ax.axhline(extra["tcp_gbps"], color="grey", linestyle="--", label="loopback TCP, one stream each way")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tensor bytes")
        ax.set_ylabel("GB/s")
        ax.legend()
        fig.tight_layout()
        paths["allreduce_png"] = os.path.join(out_dir, "allreduce_busbw.png")
        fig.savefig(paths["allreduce_png"], dpi=100)
        plt.close(fig)
    return paths
