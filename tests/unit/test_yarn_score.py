"""``hvdtrain yarn score``: the scoring job's spark-submit command, built from yarn.submit's parts."""
from __future__ import annotations

import io
from pathlib import Path

import pytest

from hvdtrain.core.errors import ConfigError
from hvdtrain.runtime import launch
from tests.unit.test_yarn_command import ENV, PYTHON, REDACTION, SPARK_SUBMIT, YAML, ZIP, confs, deps, inputs, job
from yarn import score as yarn_score


def test_cluster_mode_ships_env_code_and_kerberos_like_training() -> None:
    cfg = job(queue="ml.batch", deploy_mode="cluster", principal="ml@EXAMPLE.COM", keytab="/home/ml/ml.keytab",
              executor_cores=2, executor_memory="6g", driver_memory="2g", env={"TZ": "UTC"})
    args = ["--model", "models:/reviews@champion", "--output-table", "db.preds", "--partition", "ds=2026-11-23"]
    p = yarn_score.build_score_plan(cfg, "yarn", inputs(), args, is_file=lambda p: True)
    assert p.argv == [
        SPARK_SUBMIT, "--master", "yarn", "--deploy-mode", "cluster", "--name", "hvdtrain-score-reviews",
        "--queue", "ml.batch", "--principal", "ml@EXAMPLE.COM", "--keytab", "/home/ml/ml.keytab",
        "--driver-memory", "2g", "--executor-memory", "6g", "--executor-cores", "2", "--archives", f"{ENV}#env",
        "--py-files", ZIP, "--files", YAML,
        *confs("spark.pyspark.python=./env/bin/python", "spark.pyspark.driver.python=./env/bin/python",
               "spark.sql.catalogImplementation=hive", "spark.python.worker.reuse=true",
               "spark.yarn.appMasterEnv.PYSPARK_PYTHON=./env/bin/python",
               f"spark.executorEnv.MALLOC_TOP_PAD_={64 << 20}", "spark.executorEnv.TZ=UTC", *REDACTION),
        yarn_score.SCORE_SCRIPT, "--config", "hvdtrain-job.yaml", *args,
    ]
    assert p.env == {"PYTHONUNBUFFERED": "1"}
    assert any("score.report_dir" in n for n in p.notes)


def test_local_rehearsal_runs_this_interpreter_and_the_shipped_zip() -> None:
    p = yarn_score.build_score_plan(job(), "local[2]", inputs(archive=None), ["--model", "/m"])
    assert p.argv[:6] == [SPARK_SUBMIT, "--master", "local[2]", "--deploy-mode", "client", "--name"]
    assert f"spark.pyspark.python={PYTHON}" in p.argv and "--archives" not in p.argv
    assert p.env["PYTHONPATH"] == ZIP and p.argv[-4:] == ["--config", YAML, "--model", "/m"]
    with pytest.raises(ConfigError, match="--master must be yarn"):
        yarn_score.build_score_plan(job(), "mesos://x", inputs(), [])


def test_dry_run_through_the_cli_prints_the_plan_and_runs_nothing(tmp_path: Path, capsys) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(job(env_cache=str(tmp_path / "envs")).to_yaml())
    out = io.StringIO()
    code = yarn_score.main([str(path), "--model", "runs:/abc/model", "--output-table", "db.preds", "--overwrite",
                            "--queue", "prod", "--dry-run"], deps(out))
    assert code == 0
    text = out.getvalue()
    assert "--queue prod" in text and "etl/score_job.py" in text and "--output-table db.preds" in text
    assert "--overwrite" in text and "#env" in text
    assert yarn_score.job_args(yarn_score.parse_args([str(path), "--model", "m", "--partition", "ds=1"])) == \
        ["--model", "m", "--partition", "ds=1"]


def test_hvdtrain_score_runs_the_score_job_entry_point() -> None:
    cmd = launch.score_command("job.yaml", ["score.predict_batch=64"],
                            launch.score_flags("runs:/abc/model", "db.preds", "ds=1", "local[2]", overwrite=True))
    assert cmd[1:] == ["-m", "etl.score_job", "--config", "job.yaml", "--model", "runs:/abc/model",
                       "--output-table", "db.preds", "--partition", "ds=1", "--master", "local[2]", "--overwrite",
                       "score.predict_batch=64"]
