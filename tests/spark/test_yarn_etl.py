"""``hvdtrain yarn etl``: the ETL's spark-submit command, built from yarn.submit's parts, and the same driver
run on local Spark."""
from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from hvdtrain.core import config
from hvdtrain.core.errors import ConfigError
from hvdtrain.data import manifest
from tests.multiprocess.test_yarn_local import run_submit, submit_env
from tests.unit.test_yarn_command import ENV, PYTHON, REDACTION, SPARK_SUBMIT, YAML, ZIP, confs, deps, inputs, job
from yarn import etl_submit


def test_cluster_mode_ships_env_code_kerberos_queue_and_yarn_env_like_training() -> None:
    cfg = job(queue="ml.etl", deploy_mode="cluster", principal="ml@EXAMPLE.COM", keytab="/home/ml/ml.keytab",
              executor_cores=2, executor_memory="6g", driver_memory="2g", env={"TZ": "UTC"},
              spark_conf={"spark.sql.shuffle.partitions": "400"})
    p = etl_submit.build_etl_plan(cfg, "yarn", inputs(), ["--overwrite"], num_executors=40, is_file=lambda p: True)
    assert p.argv == [
        SPARK_SUBMIT, "--master", "yarn", "--deploy-mode", "cluster", "--name", "hvdtrain-etl-reviews",
        "--queue", "ml.etl", "--principal", "ml@EXAMPLE.COM", "--keytab", "/home/ml/ml.keytab",
        "--driver-memory", "2g", "--executor-memory", "6g", "--executor-cores", "2", "--archives", f"{ENV}#env",
        "--num-executors", "40", "--py-files", ZIP, "--files", YAML,
        *confs("spark.pyspark.python=./env/bin/python", "spark.pyspark.driver.python=./env/bin/python",
               "spark.yarn.appMasterEnv.PYSPARK_PYTHON=./env/bin/python", "spark.yarn.appMasterEnv.TZ=UTC",
               f"spark.executorEnv.MALLOC_TOP_PAD_={64 << 20}", "spark.executorEnv.TZ=UTC",
               *REDACTION, "spark.sql.shuffle.partitions=400"),
        etl_submit.ETL_SCRIPT, "--config", "hvdtrain-job.yaml", "--overwrite",
    ]
    assert p.env == {"PYTHONUNBUFFERED": "1"} and p.result_uri == "hdfs://nn:8020/data/reviews/manifest.json"
    assert any("hive.embedded" in n for n in p.notes)


def test_client_mode_without_a_fixed_executor_count_leaves_allocation_to_the_cluster() -> None:
    p = etl_submit.build_etl_plan(job(), "yarn", inputs(), [])
    assert p.argv == [
        SPARK_SUBMIT, "--master", "yarn", "--deploy-mode", "client", "--name", "hvdtrain-etl-reviews",
        "--driver-memory", "4g", "--executor-memory", "8g", "--executor-cores", "4", "--archives", f"{ENV}#env",
        "--py-files", ZIP,  # client mode: the driver reads the YAML on this host, nothing ships it
        *confs("spark.pyspark.python=./env/bin/python", f"spark.pyspark.driver.python={PYTHON}",
               f"spark.executorEnv.MALLOC_TOP_PAD_={64 << 20}", *REDACTION),
        etl_submit.ETL_SCRIPT, "--config", YAML,
    ]


def test_local_rehearsal_and_refusals() -> None:
    p = etl_submit.build_etl_plan(job(), "local[2]", inputs(archive=None), ["--create-sample-table"], 3)
    assert p.argv[:6] == [SPARK_SUBMIT, "--master", "local[2]", "--deploy-mode", "client", "--name"]
    assert f"spark.pyspark.python={PYTHON}" in p.argv and "--archives" not in p.argv
    assert "--num-executors" not in p.argv and any("--num-executors 3 does not apply" in n for n in p.notes)
    assert p.env["PYTHONPATH"] == ZIP and p.argv[-3:] == ["--config", YAML, "--create-sample-table"]
    with pytest.raises(ConfigError, match="--master must be yarn"):
        etl_submit.build_etl_plan(job(), "mesos://x", inputs(), [])
    with pytest.raises(ConfigError, match="yarn.spark_conf.spark.executor.instances .* use --num-executors"):
        etl_submit.build_etl_plan(job(spark_conf={"spark.executor.instances": "9"}), "yarn", inputs(), [])
    with pytest.raises(ConfigError, match="--num-executors must be >= 1"):
        etl_submit.build_etl_plan(job(), "yarn", inputs(), [], 0)


def test_dry_run_through_the_command_prints_the_plan_and_runs_nothing(tmp_path: Path, capsys) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(job(env_cache=str(tmp_path / "envs")).to_yaml())
    out = io.StringIO()
    code = etl_submit.main([str(path), "etl.max_length=32", "--num-executors", "12", "--executor-cores", "3",
                            "--queue", "prod", "--overwrite", "--dry-run"], deps(out))
    assert code == 0, capsys.readouterr().err
    text = out.getvalue()
    for expected in ("--queue prod", "--num-executors 12", "--executor-cores 3", "etl/job.py", "--overwrite",
                     "#env"):
        assert expected in text, expected
    assert not (tmp_path / "envs").exists()  # nothing packed
    assert etl_submit.main([str(path), "--executor-cores", "0", "--dry-run"], deps(io.StringIO())) == 2
    assert "--executor-cores must be >= 1" in capsys.readouterr().err


@pytest.mark.spark
def test_local_master_runs_the_etl_driver_on_demo_data(tmp_path: Path) -> None:
    """The command a user runs, with local Spark in place of YARN: the real ETL, through spark-submit and the
    shipped code zip, publishes a dataset from the demo's sample table."""
    cfg = config.from_dict({
        "name": "yarnetl", "workdir": str(tmp_path),
        "source": {"table": "demo.reviews", "sample": {"rows": 400, "num_classes": 2, "seed": 3}},
        "etl": {"output": str(tmp_path / "data"), "max_length": 16, "vocab_size": 120, "min_shards_per_split": 1},
    }, base_dir=str(tmp_path))
    path = tmp_path / "etl.yaml"
    path.write_text(cfg.to_yaml())
    cmd = [sys.executable, "-m", "yarn.etl_submit", str(path), "--master", "local[2]", "--create-sample-table"]
    proc = run_submit(cmd, timeout=300, env=submit_env())
    assert "hvdtrain: ETL finished; dataset: " + str(tmp_path / "data" / "manifest.json") in proc.stdout
    assert "--master 'local[2]'" in proc.stdout  # the launcher echoed the spark-submit it ran
    m = manifest.read(str(tmp_path / "data"))
    assert sum(m.split(s).records for s in m.splits) + m.source["rows_rejected"] \
        + m.source["duplicates_dropped"] == 400
    report = json.loads((tmp_path / "data" / "etl_report.json").read_text())
    assert report["rows_in"] == 400 and all(len(m.split(s).shards) >= 1 for s in m.splits)
