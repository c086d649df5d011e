"""Secrets never reach argv, logs, MLflow params/artifacts or the dry-run output (#28 items 6, 8)."""
from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hvdtrain import config, secrets, tracking, tune
from hvdtrain.envcheck import HorovodBuild
from yarn import etl_submit, submit

REPO = Path(__file__).resolve().parents[2]
SECRET = "S3cr3t-pl4nted-9f2c"
STORAGE = f"mysql+pymysql://optuna:{SECRET}@db.internal:3306/studies"


def _cfg(tmp_path) -> config.JobConfig:
    return config.from_dict({
        "name": "leak", "workdir": str(tmp_path), "source": {"table": "db.t"},
        "etl": {"output": "hdfs://nn:8020/data/t"}, "train": {"output": "hdfs://nn:8020/runs/t"},
        "tracking": {"uri": f"https://ml:{SECRET}@mlflow.internal"},
        "tune": {"storage": STORAGE},
        "spark": {"conf": {"spark.hadoop.fs.s3a.secret.key": SECRET}},
        "yarn": {"env": {"MLFLOW_TRACKING_TOKEN": SECRET, "GLOO_SOCKET_IFNAME": "eth0"}},
    }, base_dir=str(tmp_path))


@pytest.mark.parametrize("value, key, expected", [
    ("postgresql://u:pw@h/db", "", "postgresql://u:***@h/db"),
    ("see https://a:b@c and mysql://x:y@z/d", "", "see https://a:***@c and mysql://x:***@z/d"),
    ("abc", "MLFLOW_TRACKING_TOKEN", "***"),
    ("abc", "spark.hadoop.fs.s3a.secret.key", "***"),
    ("abc", "db_password", "***"),
    ("eth0", "GLOO_SOCKET_IFNAME", "eth0"),
    ("http://mlflow:5000", "uri", "http://mlflow:5000"),
    ({"A_TOKEN": "x", "B": "https://u:p@h"}, "", {"A_TOKEN": "***", "B": "https://u:***@h"}),
])
def test_one_redaction_for_keys_and_url_passwords(value, key, expected):
    assert secrets.redact(value, key) == expected


def test_config_yaml_and_mlflow_params_are_redacted(tmp_path):
    cfg = _cfg(tmp_path)
    assert SECRET in cfg.to_yaml()  # the job itself needs them
    assert SECRET not in cfg.to_yaml(redacted=True)
    params = tracking.flat_params(cfg)
    assert not [k for k, v in params.items() if SECRET in v]
    assert params["yarn.env.MLFLOW_TRACKING_TOKEN"] == "***" and params["yarn.env.GLOO_SOCKET_IFNAME"] == "eth0"
    assert params["tune.storage"] == "mysql+pymysql://optuna:***@db.internal:3306/studies"


def test_the_study_url_reaches_a_trial_by_environment_not_argv(tmp_path):
    cfg = _cfg(tmp_path)
    overrides = tune.trial_overrides(cfg, 3, {"train.learning_rate": 0.01}, STORAGE, "run1")
    opts = tune.TuneOptions(config_path="job.yaml", overrides=(), space="space.yaml", trials=2, np=2)
    argv = tune.trial_command(opts, overrides, 60)
    assert not [a for a in argv if SECRET in a]
    assert tune.trial_env({"PATH": "/bin"}, STORAGE)[tune.STORAGE_ENV] == STORAGE
    plain = tune.trial_overrides(cfg, 3, {}, "sqlite:////s.db", None)
    assert "tune.storage=sqlite:////s.db" in plain  # nothing secret: it stays visible


def test_yarn_secrets_go_to_a_private_properties_file_never_argv_or_dry_run(tmp_path):
    cfg = _cfg(tmp_path)
    inputs = submit.Inputs("spark-submit", "/usr/bin/python3", str(tmp_path / "code.zip"), str(tmp_path / "job.yaml"),
                           "hdfs://nn/envs/x.tar.gz", HorovodBuild(version="0.28.1", tensorflow=True, gloo=True))
    for plan in (submit.build_plan(cfg, "yarn", inputs, is_file=lambda p: True),
                 etl_submit.build_etl_plan(cfg, "yarn", inputs, [], is_file=lambda p: True)):
        assert not [a for a in plan.argv if SECRET in a], plan.argv
        assert SECRET not in submit.format_plan(plan)
        assert ("--conf", "spark.executorEnv.GLOO_SOCKET_IFNAME=eth0") in zip(plan.argv, plan.argv[1:])
        assert plan.argv[plan.argv.index("--properties-file") + 1] == plan.properties_file
        submit.write_properties(plan)
        assert stat.S_IMODE(os.stat(plan.properties_file).st_mode) == 0o600
        text = open(plan.properties_file).read()
        assert f"spark.executorEnv.MLFLOW_TRACKING_TOKEN={SECRET}\n" in text
        os.remove(plan.properties_file)


def test_log_lines_are_redacted(caplog):
    handler = logging.StreamHandler()
    logging.getLogger().addHandler(handler)
    try:
        filt = secrets.protect_logging("pl4inV4lue")
        record = logging.LogRecord("hvdtrain", logging.INFO, __file__, 1, "storage %s token %s", (STORAGE, "pl4inV4lue"),
                                   None)
        filt.filter(record)
        assert record.getMessage() == "storage mysql+pymysql://optuna:***@db.internal:3306/studies token ***"
        assert filt in handler.filters
    finally:
        logging.getLogger().removeHandler(handler)


def test_files_written_after_private_files_are_not_world_readable(tmp_path):
    import numpy as np

    from hvdtrain import checkpoint

    previous = secrets.private_files()
    try:
        writer = checkpoint.CheckpointWriter(str(tmp_path / "ckpt"), 1, 0, None, "max")
        writer.save(1, {"model/0000/w": np.ones(2, np.float32)}, {"step": 1})
        writer.wait()
        (tmp_path / "run.log").write_text("x")
    finally:
        os.umask(previous)
    modes = {p: stat.S_IMODE(os.stat(p).st_mode) for p in [*tmp_path.rglob("*")]}
    assert modes and all(m & 0o077 == 0 for m in modes.values()), modes


def test_horovodrun_on_this_host_gets_the_secret_environment_sealed_and_each_rank_unseals_it(tmp_path):
    from hvdtrain import launch

    env = {"PATH": "/usr/bin", "MLFLOW_TRACKING_TOKEN": SECRET, "DB": STORAGE}
    cmd = launch.horovod_command(["python", "t.py"], 2)
    sealed = launch.sealed_env(cmd, env)
    assert SECRET not in repr(sealed) and sealed["PATH"] == "/usr/bin"
    path = sealed[secrets.SEALED_ENV]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    back = dict(sealed)
    secrets.unseal_env(back)
    assert back == env  # the rank's environment is the launcher's again
    # a rank: hvdtrain.rank_env puts the secrets back and execs the program (same process)
    out = tmp_path / "env.json"
    code = subprocess.run([sys.executable, "-m", "hvdtrain.rank_env", sys.executable, "-c",
                           f"import json, os; json.dump(dict(os.environ), open({str(out)!r}, 'w'))"],
                          env={**sealed, "PYTHONPATH": str(REPO)}).returncode
    assert code == 0 and json.loads(out.read_text())["MLFLOW_TRACKING_TOKEN"] == SECRET
    # other hosts cannot read this host's file: their environment goes as it is; one rank needs no horovodrun
    assert launch.sealed_env(launch.horovod_command(["python", "t.py"], 2, hosts="w1:1,w2:1"), env) == env
    assert launch.sealed_env(launch.horovod_command(["python", "t.py"], 1), env) == env


def test_a_rank_whose_sealed_file_is_gone_fails_with_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "hvdtrain.rank_env", "true"], capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO),
                               secrets.SEALED_ENV: str(tmp_path / "gone.json")})
    assert proc.returncode == 4 and proc.stderr.count("\n") == 1
    assert "cannot read the secret environment" in proc.stderr and "Traceback" not in proc.stderr
