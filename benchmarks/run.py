"""``make bench``: every stage against its baseline, as ratios from one run.

    python -m benchmarks.run [--quick] [--only etl,etl_highcard,input,allreduce,training,checkpoint,monitoring,score,
                             mwms,tune,scale,embedding,hadoop,elastic,quality] [--out DIR]

Writes DIR/latest.json (entries {name, value, unit, baseline_name,
baseline_value, ratio, target, passed} and machine facts), DIR/latest.md and
PNG charts. Exits 0 whatever the figures (these are benchmarks, not tests);
1 only when a benchmark itself crashed.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
import traceback

from benchmarks.common import Entry, markdown_table, write_reports
from hvdtrain.core.errors import ANY_ERROR

GROUPS = {
    "etl": "benchmarks.bench_etl",
    "etl_highcard": "benchmarks.bench_etl_highcard",
    "input": "benchmarks.bench_input",
    "allreduce": "benchmarks.bench_allreduce",
    "training": "benchmarks.bench_training",
    "launch": "benchmarks.bench_launch",
    "checkpoint": "benchmarks.bench_checkpoint",
    "monitoring": "benchmarks.bench_monitoring",
    "score": "benchmarks.bench_score",
    "mwms": "benchmarks.bench_mwms",
    "tune": "benchmarks.bench_tune",
    "scale": "benchmarks.bench_scale",
    "embedding": "benchmarks.bench_embedding",
    "hadoop": "benchmarks.bench_hadoop",
    "elastic": "benchmarks.bench_elastic",
    "quality": "benchmarks.bench_quality",
}
# Groups the --quick smoke run (tests/test_bench_smoke.py, in make test) leaves out unless named in --only:
# hadoop starts a one-machine cluster (minutes); the hadoop test tier already runs one.
# minutes of cluster, of kills or of training to the end: one kill of each kind runs in the tests, and
# tests/multiprocess/test_quality_mp.py is quality's small version
FULL_ONLY = {"hadoop", "elastic", "quality"}
DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes (the smoke test in make test)")
    p.add_argument("--only", help=f"comma-separated groups of {', '.join(GROUPS)} (default: all; with --quick, "
                                  f"all but {', '.join(sorted(FULL_ONLY))})")
    p.add_argument("--out", default=DEFAULT_OUT, help="results folder")
    args = p.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    entries: list[Entry] = []
    extra: dict = {"quick": args.quick, "errors": {}, "seconds": {}}
    groups = args.only.split(",") if args.only else [g for g in GROUPS if not (args.quick and g in FULL_ONLY)]
    for group in [g.strip() for g in groups if g.strip()]:
        if group not in GROUPS:
            print(f"unknown benchmark group {group!r}; choose from {', '.join(GROUPS)}", file=sys.stderr)
            return 2
        start = time.perf_counter()
        print(f"[bench] {group} ...", flush=True)
        try:
            module = importlib.import_module(GROUPS[group])
            entries += module.run(args.quick, extra)
        except ANY_ERROR:  # one broken group must not hide the others' figures
            extra["errors"][group] = traceback.format_exc()
            print(f"[bench] {group} failed:\n{extra['errors'][group]}", file=sys.stderr)
        extra["seconds"][group] = round(time.perf_counter() - start, 1)
    paths = write_reports(entries, args.out, extra)
    print(markdown_table(entries))
    print("\n".join(f"[bench] wrote {p}" for p in paths.values()))
    return 1 if extra["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
