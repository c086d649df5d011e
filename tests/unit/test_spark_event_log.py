"""spark.event_log_dir: Spark event logs for the history server from the ETL, scoring and every YARN launch."""
from __future__ import annotations

from pathlib import Path

from etl import session
from hvdtrain.core import config
from tests.unit.test_yarn_command import inputs
from yarn import etl_submit, score, submit

EVENT_LOG = {"spark.eventLog.enabled": "true", "spark.eventLog.dir": "hdfs://nn:8020/spark-history",
             "spark.eventLog.compress": "true"}


def _job(tmp_path: Path, **spark: str) -> config.JobConfig:
    return config.from_dict({"name": "j", "workdir": str(tmp_path), "spark": spark,
                             "train": {"output": "hdfs://nn:8020/runs/j"}, "etl": {"output": "hdfs://nn:8020/d"},
                             "tracking": {"uri": "http://mlflow:5000"}})


def test_off_by_default(tmp_path: Path) -> None:
    cfg = _job(tmp_path)
    assert config.event_log_conf(cfg.spark) == {}
    assert not any(k.startswith("spark.eventLog") for k in session.spark_conf(cfg, "local[2]"))
    assert not any(k.startswith("spark.eventLog") for k, _ in submit.spark_conf(cfg, "yarn", "client", inputs()))


def test_every_spark_job_logs_its_events_when_configured(tmp_path: Path) -> None:
    cfg = _job(tmp_path, event_log_dir="hdfs://nn:8020/spark-history")
    assert {k: v for k, v in session.spark_conf(cfg, "local[2]").items() if k.startswith("spark.eventLog")} \
        == EVENT_LOG
    for conf in (submit.spark_conf(cfg, "yarn", "client", inputs()), score.score_conf(cfg, False, "client", inputs()),
                 etl_submit.etl_conf(cfg, False, "client", inputs())):
        assert {k: v for k, v in conf if k.startswith("spark.eventLog")} == EVENT_LOG


def test_a_local_folder_is_a_file_uri_resolved_against_the_yaml(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: j\nspark:\n  event_log_dir: history\n")
    cfg = config.load(path)
    assert config.event_log_conf(cfg.spark)["spark.eventLog.dir"] == f"file:{tmp_path / 'history'}"


def test_the_users_spark_conf_still_wins(tmp_path: Path) -> None:
    cfg = _job(tmp_path, event_log_dir="hdfs://nn:8020/spark-history",
               conf={"spark.eventLog.compress": "false"})
    assert session.spark_conf(cfg, "local[2]")["spark.eventLog.compress"] == "false"


def test_an_embedded_metastore_stays_embedded_beside_a_hive_site_xml(tmp_path: Path) -> None:
    """#56 item 7: a hive-site.xml on the classpath (a gateway's, `hvdtrain cluster up --hive`'s) names a
    metastore service; hive.embedded: true overrides its hive.metastore.uris, hive.embedded: false leaves the
    cluster's settings to Spark."""
    embedded = session.spark_conf(_job(tmp_path), "local[2]")
    assert embedded["spark.hadoop.hive.metastore.uris"] == "" and "metastore_db" in \
        embedded["spark.hadoop.javax.jdo.option.ConnectionURL"]
    shared = session.spark_conf(config.from_dict({"name": "j", "workdir": str(tmp_path), "hive": {"embedded": False}}),
                                "local[2]")
    assert not any(k.startswith(("spark.hadoop.hive.", "spark.hadoop.javax.jdo", "spark.sql.warehouse")) for k in shared)
