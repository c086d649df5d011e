"""How the tabular model's defaults are chosen: values of one setting against each other on the quality group's
tables as they ship, ``hvdtrain train --np 2`` per seed with the values interleaved, and plain Keras ``model.fit``
with the defaults on the same rows (benchmarks/bench_quality.py's own functions). Not a ``make bench`` entry: a
one-off measurement, kept so that its figures (docs/models.md) can be made again. By default the measurement that
chose ``model.numeric_embedding`` (``none`` against ``ple``).

    python -m benchmarks.quality_embeddings [--setting model.numeric_embedding] [--values none ple]
                                            [--seeds 1 2 3] [--keras-seeds 1]

``--setting -`` makes each value a ``;``-separated list of whole overrides, formatted per table with its task
metric and epochs: the measurement that chose early stopping compared ``train.epochs={epochs}`` with
``train.epochs={epochs2};train.early_stopping.metric={metric}`` (twice the epochs, stopping on the metric).
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
    parser.add_argument("--setting", default="model.numeric_embedding", help="the config key to vary")
    parser.add_argument("--values", nargs="+", default=["none", "ple"], help="its values, each run per seed")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="quality-embeddings-")
    found: dict[str, dict[str, list[float]]] = {}
    epochs_run: dict[str, dict[str, list]] = {}
    try:
        for table in quality.TABLES:
            config, _ = quality.prepare(table, root, 0, table.epochs)
            runs = found.setdefault(table.name, {})
            for seed in args.seeds:
                for name in args.values:
                    result = quality.hvdtrain_run(config, seed, overrides(args.setting, name, table), whole=True)
                    metrics = result["test_metrics"]
                    runs.setdefault(name, []).append(metrics[table.metric])
                    epochs_run.setdefault(table.name, {}).setdefault(name, []).append(result.get("epochs_run"))
                    print(f"{table.name} {name} seed {seed}: test {table.metric} {metrics[table.metric]:.4f} "
                          f"after {result.get('epochs_run')} epochs", flush=True)
            for seed in args.keras_seeds:  # the default (auto: ple on these datasets), plain Keras
                runs.setdefault("keras_default", []).append(quality.keras_run(config, seed)[table.metric])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps({t: {k: {"median": statistics.median(v), "runs": v,
                              **({"epochs_run": epochs_run[t][k]} if k in epochs_run.get(t, {}) else {})}
                          for k, v in runs.items()} for t, runs in found.items()}, indent=1))


def overrides(setting: str, value: str, table: quality.Table) -> list[str]:
    """The overrides of one value: ``setting=value``, or with setting ``-`` the value's own ``;``-separated
    overrides with the table's ``{metric}``, ``{epochs}`` and ``{epochs2}`` (twice its epochs) filled in."""
    if setting != "-":
        return [f"{setting}={value}"]
    return [o.format(metric=table.metric, epochs=table.epochs, epochs2=2 * table.epochs)
            for o in value.split(";") if o]


if __name__ == "__main__":
    main()
