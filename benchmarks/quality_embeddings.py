"""How the tabular default (``model.numeric_embedding``) was chosen: ``none`` against ``ple`` on the quality
group's tables as they ship, ``hvdtrain train --np 2`` per seed with the two interleaved, and plain Keras
``model.fit`` with the default on the same rows (benchmarks/bench_quality.py's own functions). Not a ``make
bench`` entry: a one-off measurement, kept so that its figures (docs/models.md) can be made again.

    python -m benchmarks.quality_embeddings [--seeds 1 2 3] [--keras-seeds 1]
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile

from benchmarks import bench_quality as quality


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--keras-seeds", type=int, nargs="*", default=[1])
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="quality-embeddings-")
    found: dict[str, dict[str, list[float]]] = {}
    try:
        for table in quality.TABLES:
            config, _ = quality.prepare(table, root, 0, table.epochs)
            runs = found.setdefault(table.name, {})
            for seed in args.seeds:
                for name in ("none", "ple"):
                    metrics = quality.hvdtrain_run(config, seed, [f"model.numeric_embedding={name}"])
                    runs.setdefault(name, []).append(metrics[table.metric])
                    print(f"{table.name} {name} seed {seed}: test {table.metric} {metrics[table.metric]:.4f}", flush=True)
            for seed in args.keras_seeds:  # the default (auto: ple on these datasets), plain Keras
                runs.setdefault("keras_default", []).append(quality.keras_run(config, seed)[table.metric])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps({t: {k: {"median": statistics.median(v), "runs": v} for k, v in runs.items()}
                      for t, runs in found.items()}, indent=1))


if __name__ == "__main__":
    main()
