"""Each task kind end to end on generated tables: Hive table -> Spark ETL (labels encoded per task) ->
``hvdtrain train --np 2`` (Gloo) -> exact evaluation, beside the table's expected best score; and the custom
wide-and-deep example over text + numeric + categorical columns: trained under ``--np 2``, exported, scored.

One Spark process runs every ETL of the module (and the bad-label cases), so the JVM starts once.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.support import mp

# The module's one ETL process runs five Spark jobs before the first test: minutes on a loaded machine.
pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(3600)]

REPO = Path(__file__).resolve().parents[2]
TASK_ROWS = {"binary": 4000, "multilabel": 2500, "regression": 2500}


def _base(tmp: Path, name: str) -> dict:
    """A small job: the module's shared Hive metastore, tiny model, two epochs on two ranks."""
    return {
        "name": name, "workdir": str(tmp / name),
        "hive": {"warehouse_dir": str(tmp / "hive" / "warehouse"), "metastore_dir": str(tmp / "hive" / "metastore")},
        "spark": {"master": "local[2]"},
        "etl": {"output": str(tmp / name / "data"), "max_length": 32, "vocab_size": 400, "min_shards_per_split": 2,
                "min_shard_mb": 0},
        "model": {"kind": "transformer", "embed_dim": 32, "num_heads": 2, "ff_dim": 64},
        "train": {"epochs": 3, "batch_size": 32, "learning_rate": 0.003, "validate_every_epoch": True,
                  "progress": "log"},
        "checkpoint": {"every_steps": 0}, "monitoring": {"enabled": False},
        "tracking": {"uri": str(tmp / "mlruns")},
    }


def _task_config(tmp: Path, task: str) -> Path:
    data = _base(tmp, task)
    data["task"] = {"kind": task, "class_weights": "balanced"} if task == "binary" else task
    data["source"] = {"table": f"tasks.{task}", "sample": {"rows": TASK_ROWS[task], "num_classes": 4,
                                                           "words_per_class": 20, "filler_words": 150}}
    path = tmp / f"{task}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _mixed_rows(path: Path, rows: int = 2400) -> None:
    """JSON lines with text, a numeric and a categorical column that all carry the class (plus noise)."""
    from etl import sample
    from hvdtrain.core.config import SampleConfig

    cfg = SampleConfig(rows=rows, num_classes=3, words_per_class=20, filler_words=150, class_word_rate=0.15,
                       label_noise=0.0)
    names = sample.label_names(3)
    with path.open("w") as fh:
        for key, text, label in sample.generate(cfg):
            rng = random.Random(key)
            k = names.index(label)
            fh.write(json.dumps({"id": key, "text": text, "amount": k + rng.gauss(0, 0.8),
                                 "region": f"r{k}" if rng.random() < 0.6 else f"r{rng.randrange(5)}",
                                 "label": label}) + "\n")


def _custom_config(tmp: Path) -> Path:
    data = _base(tmp, "wide_deep")
    _mixed_rows(tmp / "mixed.json")
    data["source"] = {"path": str(tmp / "mixed.json"), "format": "json", "text_column": "text",
                      "numeric_columns": ["amount"], "categorical_columns": ["region"],
                      "schema": "id STRING, text STRING, amount DOUBLE, region STRING, label STRING"}
    data["model"] = {"kind": "custom", "builder": "wide_deep:build", "code": str(REPO / "examples"),
                     "params": {"embed_dim": 16, "deep_units": [32]}}
    path = tmp / "wide_deep.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _bad_label_configs(tmp: Path) -> dict[str, Path]:
    """A binary task over the multilabel table (its label sets are many distinct strings); a regression over
    the binary table's words (negative / positive)."""
    out = {}
    for case, task, table in (("binary_over_label_sets", "binary", "tasks.multilabel"),
                              ("regression_over_words", "regression", "tasks.binary")):
        data = _base(tmp, case)
        data["task"] = task
        data["source"] = {"table": table}
        out[case] = tmp / f"{case}.yaml"
        out[case].write_text(yaml.safe_dump(data))
    return out


def etl_main(configs: list[str], bad: list[str], report: str) -> None:
    """Run in one process: every ETL (sample tables created first), then the bad-label ETLs, recording errors."""
    from etl import job, session, sources
    from hvdtrain.core import config
    from hvdtrain.core.errors import HvdtrainError

    errors = {}
    for path in configs + bad:
        cfg = config.load(path)
        spark = session.get_session(cfg, cfg.spark.master, False, "etl")
        if cfg.source.sample is not None:
            sources.create_sample_table(spark, cfg)
        try:
            job.run(spark, cfg)
        except HvdtrainError as exc:
            if path not in bad:
                raise
            errors[path] = {"message": str(exc), "exit_code": exc.exit_code,
                            "published": os.path.exists(os.path.join(cfg.etl.output, "manifest.json"))}
    Path(report).write_text(json.dumps(errors))


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI" and not k.startswith("HOROVOD_")}
    env["PYTHONPATH"] = str(REPO)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    mp.horovodrun()
    tmp = tmp_path_factory.mktemp("tasks")
    configs = {task: _task_config(tmp, task) for task in TASK_ROWS}
    configs["custom"] = _custom_config(tmp)
    bad = _bad_label_configs(tmp)
    report = tmp / "etl_errors.json"
    cmd = [sys.executable, __file__, "etl", str(report), *map(str, configs.values()), "--bad", *map(str, bad.values())]
    proc = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-5000:]
    errors = json.loads(report.read_text())
    return configs, {case: errors.get(str(path)) for case, path in bad.items()}


def _train(config: Path, *extra: str) -> tuple[dict, str]:
    proc = subprocess.run([sys.executable, "-m", "hvdtrain.cli", "train", str(config), "--np", "2", *extra],
                          cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}"
    data = yaml.safe_load(config.read_text())
    result = json.loads((Path(data["workdir"]) / "runs" / data["name"] / "result.json").read_text())
    return result, proc.stdout


def _best(config: Path) -> tuple[str, float]:
    from hvdtrain.core import config as config_lib
    from hvdtrain.data import manifest

    sample = manifest.read(config_lib.load(config).etl.output).source["sample"]
    return sample["best_metric"], sample["best_value"]


def _check_task_run(result: dict, stdout: str, config: Path, task: str) -> dict:
    metric, best = _best(config)
    print(f"{task}: test {metric} {result['test_metrics'][metric]:.4f}, expected best ~{best:.4f}")
    assert result["task"] == task and result["world_size"] == 2 and result["ranks_agree"] is True
    assert f"(expected best ~{best:.4f})" in stdout  # the summary shows the best score beside the result
    report = json.loads(Path(result["report"]).read_text())
    assert report["evaluation"]["test"]["complete"] is True  # every record evaluated once across the ranks
    return result["test_metrics"]


def test_binary_2_percent_positives(prepared):
    configs, _ = prepared
    result, stdout = _train(configs["binary"])
    test = _check_task_run(result, stdout, configs["binary"], "binary")
    assert test["roc_auc"] >= 0.8 and 0 < test["pr_auc"] <= 1 and test["log_loss"] > 0


def test_multilabel(prepared):
    configs, _ = prepared
    result, stdout = _train(configs["multilabel"])
    test = _check_task_run(result, stdout, configs["multilabel"], "multilabel")
    assert test["micro_f1"] >= 0.6 and test["macro_roc_auc"] >= 0.8


def test_regression_with_known_noise(prepared):
    configs, _ = prepared
    result, stdout = _train(configs["regression"])
    test = _check_task_run(result, stdout, configs["regression"], "regression")
    report = json.loads(Path(result["report"]).read_text())["evaluation"]["test"]
    assert test["rmse"] < report["target_std"] and test["r2"] > 0.2  # better than predicting the mean
    # the residual chart shows every test record here (under 1,000 per rank), gathered from both ranks
    pairs = np.array(report["residual_sample"])
    assert len(pairs) == report["records"]
    assert np.sqrt(np.mean((pairs[:, 0] - pairs[:, 1]) ** 2)) == pytest.approx(report["rmse"], rel=1e-5)
    assert Path(result["exports"]["residuals"]).stat().st_size > 1000


def test_custom_wide_and_deep_trains_exports_and_scores(prepared, tmp_path):
    configs, _ = prepared
    config = configs["custom"]
    result, _ = _train(config)
    assert result["task"] == "multiclass" and result["ranks_agree"] is True
    assert result["test_accuracy"] >= 0.7, result
    labels = json.loads(Path(result["exports"]["labels"]).read_text())
    assert labels["model_builder"] == "wide_deep:build" and labels["model_kind"] == "custom"
    model_dir = str(Path(result["exports"]["keras"]).parent)
    proc = subprocess.run([sys.executable, "-m", "hvdtrain.cli", "score", str(config), "--model", model_dir,
                           "--output-table", "tasks.wide_deep_scores", "--master", "local[2]", "--overwrite"],
                          cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}"
    assert "tasks.wide_deep_scores" in proc.stdout


def test_a_binary_task_over_many_labels_fails_with_one_line(prepared):
    _, errors = prepared
    err = errors["binary_over_label_sets"]
    assert err is not None and err["exit_code"] == 3 and not err["published"]
    assert "task: binary needs exactly 2 distinct labels" in err["message"] and "set task: multiclass" in \
        err["message"] and "\n" not in err["message"]


def test_a_regression_over_words_fails_with_one_line(prepared):
    _, errors = prepared
    err = errors["regression_over_words"]
    assert err is not None and err["exit_code"] == 3 and not err["published"]
    assert "task: regression needs numeric labels" in err["message"] and "'label'" in err["message"]
    assert "\n" not in err["message"]


if __name__ == "__main__":  # the module's ETL process (see ``prepared``)
    _, _, out, *rest = sys.argv
    split = rest.index("--bad")
    etl_main(rest[:split], rest[split + 1:], out)
