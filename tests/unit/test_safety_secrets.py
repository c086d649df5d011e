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

from hvdtrain import tune
from hvdtrain.core import config, secrets
from hvdtrain.hadoop.envcheck import HorovodBuild
from hvdtrain.observe import console, tracking
from yarn import etl_submit, score, submit

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
    overrides = tune.trial_overrides(cfg.tune, 3, {"train.learning_rate": 0.01}, STORAGE, "run1")
    opts = tune.TuneOptions(config_path="job.yaml", overrides=(), space="space.yaml", trials=2, np=2)
    argv = tune.trial_command(opts, overrides, 60)
    assert not [a for a in argv if SECRET in a]
    assert tune.trial_env({"PATH": "/bin"}, STORAGE)[tune.STORAGE_ENV] == STORAGE
    plain = tune.trial_overrides(cfg.tune, 3, {}, "sqlite:////s.db", None)
    assert "tune.storage=sqlite:////s.db" in plain  # nothing secret: it stays visible


def test_yarn_secrets_go_to_private_files_never_argv_the_containers_environment_or_dry_run(tmp_path):
    """#54: on a cluster, yarn.env's secrets travel in a 0600 file shipped with --files, which the executors' Python
    daemon reads back, never as spark.executorEnv (YARN copies a container's environment into its aggregated logs);
    a secret Spark setting goes to the 0600 --properties-file; a local master's executors are the driver's threads,
    so there the variables stay Spark settings in the properties file."""
    cfg = config.from_dict({**_cfg(tmp_path).to_dict(), "yarn": {
        "env": {"MLFLOW_TRACKING_TOKEN": SECRET, "GLOO_SOCKET_IFNAME": "eth0"},
        "spark_conf": {"spark.ssl.keyStorePassword": SECRET}}}, base_dir=str(tmp_path))
    inputs = submit.Inputs("spark-submit", "/usr/bin/python3", str(tmp_path / "code.zip"), str(tmp_path / "job.yaml"),
                           "hdfs://nn/envs/x.tar.gz", HorovodBuild(version="0.28.1", tensorflow=True, gloo=True))
    plans = {"submit": submit.build_plan(cfg, "yarn", inputs, is_file=lambda p: True),
             "etl": etl_submit.build_etl_plan(cfg, "yarn", inputs, [], is_file=lambda p: True),
             "score": score.build_score_plan(cfg, "yarn", inputs, ["--model", "hdfs://nn/m"], is_file=lambda p: True),
             "local": submit.build_plan(cfg, "local[2]", inputs, is_file=lambda p: True)}
    for name, plan in plans.items():
        assert not [a for a in plan.argv if SECRET in a], (name, plan.argv)
        assert SECRET not in submit.format_plan(plan), name
        conf = dict(c.split("=", 1) for f, c in zip(plan.argv, plan.argv[1:]) if f == "--conf")
        assert conf["spark.executorEnv.GLOO_SOCKET_IFNAME"] == "eth0", name  # plain variables stay settings
        assert plan.argv[plan.argv.index("--properties-file") + 1] == plan.properties_file, name
        submit.write_properties(plan)
        assert stat.S_IMODE(os.stat(plan.properties_file).st_mode) == 0o600, name
        properties = open(plan.properties_file).read()
        assert f"spark.ssl.keyStorePassword={SECRET}\n" in properties, name
        os.remove(plan.properties_file)
        if name == "local":  # nothing to ship: the driver reads the job's YAML here
            assert f"spark.executorEnv.MLFLOW_TRACKING_TOKEN={SECRET}\n" in properties
            assert plan.sealed_env_file is None and "spark.python.daemon.module" not in conf
            continue
        assert "MLFLOW_TRACKING_TOKEN" not in properties, name  # not the containers' environment
        assert conf[f"spark.executorEnv.{secrets.SEALED_ENV}"] == submit.SEALED_ENV_FILE, name
        assert conf["spark.python.daemon.module"] == submit.DAEMON_MODULE, name
        files = plan.argv[plan.argv.index("--files") + 1].split(",")
        assert plan.sealed_env_file in files and os.path.basename(plan.sealed_env_file) == submit.SEALED_ENV_FILE
        assert f"the executors' MLFLOW_TRACKING_TOKEN: secret, written to a 0600 {submit.SEALED_ENV_FILE}" \
            in submit.format_plan(plan), name
        assert stat.S_IMODE(os.stat(plan.sealed_env_file).st_mode) == 0o600, name
        # ... and read back as the executors' daemon does, in the container's working folder
        environ = {secrets.SEALED_ENV: submit.SEALED_ENV_FILE}
        cwd = os.getcwd()
        os.chdir(os.path.dirname(plan.sealed_env_file))
        try:
            secrets.unseal_env(environ)
        finally:
            os.chdir(cwd)
        assert environ == {"MLFLOW_TRACKING_TOKEN": SECRET}, name
        os.remove(plan.sealed_env_file)


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

    from hvdtrain.training import checkpoint

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
    from hvdtrain.runtime import launch

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
    # a rank: hvdtrain.runtime.rank_env puts the secrets back and execs the program (same process)
    out = tmp_path / "env.json"
    code = subprocess.run([sys.executable, "-m", "hvdtrain.runtime.rank_env", sys.executable, "-c",
                           f"import json, os; json.dump(dict(os.environ), open({str(out)!r}, 'w'))"],
                          env={**sealed, "PYTHONPATH": str(REPO)}).returncode
    assert code == 0 and json.loads(out.read_text())["MLFLOW_TRACKING_TOKEN"] == SECRET
    # other hosts cannot read this host's file: their environment goes as it is; one rank needs no horovodrun
    assert launch.sealed_env(launch.horovod_command(["python", "t.py"], 2, hosts="w1:1,w2:1"), env) == env
    assert launch.sealed_env(launch.horovod_command(["python", "t.py"], 1), env) == env


def test_an_elastic_launch_on_this_host_is_sealed_too_and_its_ranks_start_through_rank_env(tmp_path):
    """#54 item 5: elastic horovodrun (--host-discovery-script, no -H) wrote every rank's whole environment into
    its command line. A discovery script hvdtrain wrote for this host seals it as -H localhost does; a user's
    script, which may print any host at any time, and one naming another host do not."""
    from hvdtrain.core.config import ElasticConfig
    from hvdtrain.runtime import elastic_plan, launch

    env = {"PATH": "/usr/bin", "MLFLOW_TRACKING_TOKEN": SECRET}
    ours = tmp_path / "discover.sh"
    ours.write_text(launch.discovery_script("localhost:2"))
    cmd = elastic_plan.horovodrun_command("horovodrun", "job.yaml", [], ElasticConfig(min_ranks=1, max_ranks=2), 2,
                                          str(ours), 60)
    assert cmd[cmd.index("--start-timeout") + 2:][:3] == list(launch.RANK_ENV)  # each rank unseals first
    sealed = launch.sealed_env(cmd, env)
    assert SECRET not in repr(sealed) and secrets.SEALED_ENV in sealed
    assert launch.static_hosts(launch.discovery_script("localhost:2,127.0.0.1:1")) == ["localhost", "127.0.0.1"]
    for other in (launch.discovery_script("worker-7:2"), "#!/bin/sh\ncurl -s http://scheduler/hosts\n", ""):
        ours.write_text(other)
        assert launch.sealed_env(cmd, env) == env
    ours.unlink()
    assert launch.sealed_env(cmd, env) == env  # no script to read: as it is


def test_a_rank_whose_sealed_file_is_gone_fails_with_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "hvdtrain.runtime.rank_env", "true"], capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO),
                               secrets.SEALED_ENV: str(tmp_path / "gone.json")})
    assert proc.returncode == 4 and proc.stderr.count("\n") == 1
    assert "cannot read the secret environment" in proc.stderr and "Traceback" not in proc.stderr


# -- #54 item 6: the names and URL parts Spark's own redaction knows, and the error paths -------------------------

SECRET_NAMES = [
    "spark.ssl.keyStorePassword", "spark.ssl.trustStorePassword", "spark.ssl.keyPassword",
    "javax.jdo.option.ConnectionPassword", "spark.hadoop.javax.jdo.option.ConnectionPassword",
    "spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net", "fs.azure.account.key.acct.blob.core.windows.net",
    "fs.azure.account.oauth2.client.secret", "spark.hadoop.fs.s3a.access.key", "fs.s3a.secret.key",
    "fs.s3a.encryption.key", "fs.s3a.session.token", "fs.gs.auth.service.account.private.key",
    "PGPASSWORD", "MYSQL_PWD", "AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN", "HF_TOKEN",
    "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_PASSWORD", "AZURE_STORAGE_KEY", "GOOGLE_APPLICATION_CREDENTIALS",
    "spark.authenticate.secret", "db_passwd", "apiKey", "yarn.env.PGPASSWORD", "spark.conf.spark.ssl.keyStorePassword",
]
PLAIN_NAMES = [
    "train.batch_size", "tokenizer", "tokenizer_json", "max_tokens", "etl.packed_tokens",
    "score.unknown_token_threshold", "HADOOP_TOKEN_FILE_LOCATION", "spark.ssl.keyStore", "spark.yarn.keytab",
    "spark.io.encryption.keySizeBits", "fs.s3a.aws.credentials.provider", "spark.security.credentials.hive.enabled",
    "etl.key_column", "PWD", "OLDPWD", "GLOO_SOCKET_IFNAME", "tracking.uri", "spark.kerberos.access.hadoopFileSystems",
]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_a_name_that_names_a_secret_hides_its_value(name):
    assert secrets.is_secret_key(name) and secrets.redact("v4lue", name) == "***"


@pytest.mark.parametrize("name", PLAIN_NAMES)
def test_a_setting_whose_name_only_resembles_a_secret_stays_readable(name):
    # the rule: token, pwd and credential(s) name a secret as a key's last word (MLFLOW_TRACKING_TOKEN), not inside
    # another name (unknown_token_threshold, HADOOP_TOKEN_FILE_LOCATION) or as another word (tokenizer, max_tokens)
    assert not secrets.is_secret_key(name) and secrets.redact("v4lue", name) == "v4lue"


@pytest.mark.parametrize("text, expected", [
    ("jdbc:sqlserver://db:1433;databaseName=d;user=u;password=pw9x", "jdbc:sqlserver://db:1433;databaseName=d;user=u;password=***"),
    ("postgresql://h/db?sslmode=require&password=pw9x", "postgresql://h/db?sslmode=require&password=***"),
    ("mysql://h/db?PWD=pw9x&passwd=pw9x", "mysql://h/db?PWD=***&passwd=***"),
    ("https://h/x?token=t0k&a=1#f", "https://h/x?token=***&a=1#f"),
    ("https://acct.blob.core.windows.net/c/b?sv=2022-11-02&sig=a%2Fb%3D&se=2030", "https://acct.blob.core.windows.net/c/b?sv=2022-11-02&sig=***&se=2030"),
    ("s3 https://b.s3/k?X-Amz-Signature=abc&X-Amz-Security-Token=def&X-Amz-Date=1", "s3 https://b.s3/k?X-Amz-Signature=***&X-Amz-Security-Token=***&X-Amz-Date=1"),
    ("https://maps/api?key=AIzaSy&secret=s3c&access_token=ya29", "https://maps/api?key=***&secret=***&access_token=***"),
    ("mysql://u:pw9x@h/db?key=k", "mysql://u:***@h/db?key=***"),
    ("-Dspark.ssl.keyStorePassword=pw9x -Dlog4j2.configurationFile=x", "-Dspark.ssl.keyStorePassword=*** -Dlog4j2.configurationFile=x"),
    ("https://h/x?tokenizer=bert&max_tokens=5&keyspace=k", "https://h/x?tokenizer=bert&max_tokens=5&keyspace=k"),
    ("hdfs://nn:8020/data/t?x=1", "hdfs://nn:8020/data/t?x=1"),
])
def test_secret_parts_of_a_url_are_masked_anywhere(text, expected):
    assert secrets.redact_text(text) == expected
    assert secrets.redact(text, "any.key") == expected


WIDE = "Wid3-s3cret-5b7a"


def _wide_cfg(tmp_path, storage: str) -> config.JobConfig:
    return config.from_dict({
        "name": "leak", "workdir": str(tmp_path), "source": {"table": "db.t"},
        "etl": {"output": "hdfs://nn:8020/data/t"}, "train": {"output": "hdfs://nn:8020/runs/t"},
        "tracking": {"uri": f"https://mlflow.internal/?token={WIDE}"},
        "tune": {"storage": storage},
        "spark": {"conf": {"spark.ssl.keyStorePassword": WIDE, "spark.hadoop.javax.jdo.option.ConnectionPassword": WIDE,
                           "spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net": WIDE}},
        "yarn": {"env": {"PGPASSWORD": WIDE, "DB_URL": f"jdbc:postgresql://db/x;password={WIDE}"},
                 "spark_conf": {"spark.ssl.keyStorePassword": WIDE}},
    }, base_dir=str(tmp_path))


STORAGES = [f"postgresql://db.internal/studies?password={WIDE}", f"jdbc:sqlserver://db;user=u;password={WIDE}",
            f"mysql://db.internal/studies?token={WIDE}"]


@pytest.mark.parametrize("storage", STORAGES)
def test_common_secret_names_reach_no_argv_param_or_config_yaml(tmp_path, storage):
    cfg = _wide_cfg(tmp_path, storage)
    assert WIDE not in cfg.to_yaml(redacted=True)
    assert [k for k, v in tracking.flat_params(cfg).items() if WIDE in v] == []
    inputs = submit.Inputs("spark-submit", "/usr/bin/python3", str(tmp_path / "code.zip"), str(tmp_path / "job.yaml"),
                           "hdfs://nn/envs/x.tar.gz", HorovodBuild(version="0.28.1", tensorflow=True, gloo=True))
    for plan in (submit.build_plan(cfg, "yarn", inputs, is_file=lambda p: True),
                 etl_submit.build_etl_plan(cfg, "yarn", inputs, [], is_file=lambda p: True)):
        assert [a for a in plan.argv if WIDE in a] == [] and WIDE not in submit.format_plan(plan)
    # a trial gets the study's storage through its environment, never its command line
    overrides = tune.trial_overrides(cfg.tune, 3, {"train.learning_rate": 0.01}, storage, "run1")
    opts = tune.TuneOptions(config_path="job.yaml", overrides=(), space="space.yaml", trials=2, np=2)
    assert [a for a in tune.trial_command(opts, overrides, 60) if WIDE in a] == []
    assert tune.trial_env({}, storage)[tune.STORAGE_ENV] == storage


def test_a_mistyped_secret_key_is_not_echoed_in_its_error():
    from hvdtrain.core.errors import ConfigError

    data = {"name": "x", "source": {"table": "db.t"}}
    config.apply_override(data, "tracking.pasword=hunter2")
    with pytest.raises(ConfigError) as err:
        config.from_dict(data)
    assert "tracking.pasword is not a known key" in str(err.value) and "hunter2" not in str(err.value)
    with pytest.raises(ConfigError, match=r"tracking.expriment is not a known key.*\(got 'abc'\)"):
        config.from_dict({"name": "x", "source": {"table": "db.t"}, "tracking": {"expriment": "abc"}})  # not near
    # a value error under a secret name, or a URL secret in any value, is masked too
    assert "hunter2" not in str(ConfigError("yarn.env.PGPASSWORD", "hunter2", "must be a string"))
    assert "hunter2" not in str(ConfigError("tune.storage", "mysql://h/db?password=hunter2", "must name a database"))
    assert "(got 0)" in str(ConfigError("train.batch_size", 0, "must be > 0"))


def test_printed_errors_are_redacted(capsys):
    exc = RuntimeError(f"cannot reach https://u:{WIDE}@mlflow.internal/?token={WIDE}")
    exc.add_note(f"jdbc:sqlserver://db;password={WIDE}")
    assert console.print_error(exc, "hvdtrain") == 1
    err = capsys.readouterr().err
    assert WIDE not in err and "https://u:***@mlflow.internal/?token=***" in err
    secrets.protect_logging("kn0wn-v4lue")  # a secret this process was given is masked wherever it appears
    console.print_error(RuntimeError("driver said kn0wn-v4lue"), "hvdtrain")
    assert capsys.readouterr().err == "hvdtrain: error: driver said ***\n"


def test_a_failed_tracking_connection_does_not_print_the_uri_secret(tmp_path, caplog, monkeypatch):
    from tests.support.mlflow_server import free_port

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    uri = f"http://u:{WIDE}@127.0.0.1:{free_port()}/?token={WIDE}x"
    cfg = config.from_dict({"name": "x", "workdir": str(tmp_path), "source": {"table": "db.t"},
                            "tracking": {"uri": uri}}, base_dir=str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="hvdtrain.observe.tracking"):
        assert tracking.Tracker(cfg, sleep=lambda s: None).start({}) is None
    said = [r.getMessage() for r in caplog.records if r.name == "hvdtrain.observe.tracking"]
    assert said and "tracking is off" in said[-1] and "127.0.0.1" in said[-1]
    assert [m for m in said if WIDE in m] == []


def test_every_spark_conf_hvdtrain_builds_sets_spark_redaction(tmp_path):
    import re

    from etl import session
    from yarn import score

    cfg = _wide_cfg(tmp_path, "sqlite:////s.db")
    inputs = submit.Inputs("spark-submit", "/usr/bin/python3", str(tmp_path / "code.zip"), str(tmp_path / "job.yaml"),
                           "hdfs://nn/envs/x.tar.gz", HorovodBuild(version="0.28.1", tensorflow=True, gloo=True))
    confs = {"etl session": session.spark_conf(cfg, "local[1]"),
             "yarn submit": dict(submit.spark_conf(cfg, "yarn", "client", inputs)),
             "yarn etl": dict(etl_submit.etl_conf(cfg, False, "client", inputs)),
             "yarn score": dict(score.score_conf(cfg, False, "client", inputs))}
    for where, conf in confs.items():
        keys = re.compile(conf["spark.redaction.regex"])  # Spark masks a value when its key or the value matches
        for name in [*SECRET_NAMES, "spark.executorEnv.HADOOP_TOKEN_FILE_LOCATION"]:  # a superset of Spark's own
            assert keys.search(name), (where, name)
        for value in ["mysql://u:pw@h/db", "jdbc:sqlserver://db;user=u;pwd=x", "https://h/b?sig=abc"]:
            assert keys.search(value), (where, value)
        for name in ["spark.executor.memory", "spark.sql.shuffle.partitions", "hdfs://nn:8020/data"]:
            assert not keys.search(name), (where, name)
        sql = re.compile(conf["spark.sql.redaction.string.regex"])
        assert sql.sub("***", "LOCATION 'jdbc:mysql://u:pw9@h/db?x=1&password=pw9'") == \
            "LOCATION 'jdbc:mysql://***@h/db?x=1&***'"
    # on the command line: the settings are not secret themselves
    argv = submit.build_plan(cfg, "yarn", inputs, is_file=lambda p: True).argv
    assert f"spark.redaction.regex={confs['yarn submit']['spark.redaction.regex']}" in argv
    # a user's own setting wins
    own = config.from_dict({"name": "x", "source": {"table": "db.t"}, "spark": {"conf": {"spark.redaction.regex": "mine"}},
                            "yarn": {"spark_conf": {"spark.redaction.regex": "mine"}}})
    assert session.spark_conf(own, "local[1]")["spark.redaction.regex"] == "mine"
    assert [v for k, v in submit.spark_conf(own, "yarn", "client", inputs) if k == "spark.redaction.regex"] == ["mine"]
