"""A real public table through mixed and hashed features: OpenML's Titanic (1,309 rows), as scikit-learn ships
it in its test data, with a scikit-learn baseline on the same split. No download.

    python scripts/titanic_mixed.py WORKDIR [--np 1] [--elastic EPOCHS]

The passenger's name is the text column; age, fare, pclass, sibsp, parch numeric (age and fare with real
NULLs); sex, embarked, cabin categorical with a vocabulary; ticket (929 values) and home.dest (369) hashed.
``boat`` and ``body`` are left out: they are known only after the outcome. Prints one JSON document:
hvdtrain's test accuracy next to scikit-learn's (logistic regression and a gradient-boosted tree) on the rows
of the same test split (etl.split.split_of). ``--elastic EPOCHS`` trains under ``train.elastic`` (2 virtual ranks)
for a fixed number of epochs instead, as elastic jobs do not stop early.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys

import numpy as np

ARFF = os.path.join("datasets", "tests", "data", "openml", "id_40945", "data-v1-dl-16826755.arff.gz")
NUMERIC = ["pclass", "age", "sibsp", "parch", "fare"]
CATEGORICAL = ["sex", "embarked", "cabin", "ticket", "home_dest"]
HASHED = {"ticket": 1024, "home_dest": 512}


def load() -> list[dict]:
    import sklearn
    from sklearn.externals import _arff

    with gzip.open(os.path.join(os.path.dirname(sklearn.__file__), ARFF), "rt") as fh:
        doc = _arff.load(fh)
    names = [a[0].replace(".", "_") for a in doc["attributes"]]
    return [dict(zip(names, row), id=f"p{i:04d}") for i, row in enumerate(doc["data"])]


def write_source(rows: list[dict], path: str) -> None:
    import pandas as pd

    frame = pd.DataFrame([{"id": r["id"], "name": r["name"], "label": str(r["survived"]),
                           **{c: r[c] for c in NUMERIC}, **{c: r[c] for c in CATEGORICAL}} for r in rows])
    os.makedirs(path, exist_ok=True)
    frame.to_parquet(os.path.join(path, "part-0.parquet"), index=False)


def config(workdir: str, elastic_epochs: int = 0) -> str:
    import yaml

    doc = {"name": "titanic", "workdir": workdir,
           "source": {"path": os.path.join(workdir, "source"), "format": "parquet", "text_column": "name",
                      "numeric_columns": NUMERIC, "categorical_columns": CATEGORICAL},
           "etl": {"max_length": 12, "vocab_size": 600, "max_categories": 200, "categorical_hash_buckets": HASHED,
                   "min_shards_per_split": 1},
           "model": {"kind": "mlp", "hidden_units": [64, 32], "categorical_embed_dim": 4, "dropout": 0.2},
           # 1,068 training rows: a practitioner stops on the validation loss and keeps the best epoch
           "train": {"epochs": 40, "batch_size": 32, "learning_rate": 3e-3, "progress": "off",
                     "early_stopping": {"metric": "loss", "patience": 4}},
           "checkpoint": {"enabled": False}, "tracking": {"enabled": False}}
    if elastic_epochs:
        doc["train"].pop("early_stopping")
        doc["train"].update(epochs=elastic_epochs, elastic={"min_ranks": 1, "max_ranks": 2, "commit_every_steps": 5})
    path = os.path.join(workdir, "titanic.yaml")
    with open(path, "w") as fh:
        yaml.safe_dump(doc, fh)
    return path


def baseline(rows: list[dict], fractions: dict[str, float]) -> dict[str, float]:
    """Logistic regression and a gradient-boosted tree on the same train/test rows (one-hot + imputation)."""
    import pandas as pd
    from sklearn.compose import make_column_transformer
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import accuracy_score, roc_auc_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    from etl import split

    frame = pd.DataFrame(rows)
    frame[CATEGORICAL] = frame[CATEGORICAL].astype("string").fillna("?")
    part = frame["id"].map(lambda k: split.split_of(k, fractions))
    y = frame["survived"].astype(int)
    out = {}
    for name, model in (("logistic_regression", LogisticRegression(max_iter=2000)),
                        ("hist_gradient_boosting", HistGradientBoostingClassifier(random_state=0))):
        pre = make_column_transformer(
            (make_pipeline(SimpleImputer(), StandardScaler()), NUMERIC),
            (OneHotEncoder(handle_unknown="ignore", min_frequency=2, sparse_output=False), CATEGORICAL))
        pipe = make_pipeline(pre, model).fit(frame[part == "train"], y[part == "train"])
        test = part == "test"
        proba = pipe.predict_proba(frame[test])[:, 1]
        out[name] = {"accuracy": round(accuracy_score(y[test], proba > 0.5), 4),
                     "roc_auc": round(roc_auc_score(y[test], proba), 4)}
    out["test_rows"] = int((part == "test").sum())
    out["majority_class_accuracy"] = round(float(max(np.mean(y[part == "test"]), 1 - np.mean(y[part == "test"]))), 4)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("workdir")
    p.add_argument("--np", type=int, default=1)
    p.add_argument("--elastic", type=int, default=0, metavar="EPOCHS", help="train.elastic, this many epochs")
    args = p.parse_args()
    workdir = os.path.abspath(args.workdir)
    rows = load()
    write_source(rows, os.path.join(workdir, "source"))
    cfg = config(workdir, args.elastic)
    subprocess.run(["hvdtrain", "etl", cfg, "--overwrite"], check=True)
    subprocess.run(["hvdtrain", "train", cfg, "--np", str(args.np)], check=True)
    from hvdtrain.core import config as config_mod
    from hvdtrain.data import manifest

    job = config_mod.load(cfg)
    with open(os.path.join(job.train.output, "eval_report.json")) as fh:
        report = json.load(fh)
    tab = manifest.read(job.etl.output).preprocessing["tabular"]
    print(json.dumps({"hvdtrain_mlp": report["evaluation"].get("test"),
                      "sklearn_same_split": baseline(rows, job.etl.splits),
                      "cardinalities": dict(zip(tab["categorical_columns"], tab["cardinalities"])),
                      "distinct_values": tab.get("distinct_values"), "hash_buckets": tab.get("hash_buckets")},
                     indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
