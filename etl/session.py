"""The SparkSession, with Hive support. This module owns the pyspark import.

Locally (``hive.embedded: true``) the metastore is an embedded Derby database
and the warehouse a local folder, both under the job's workdir. On a cluster
(``hive.embedded: false``) Spark takes the metastore from the hive-site.xml on
its classpath, as spark-submit sets it up.
"""
from __future__ import annotations

import os
import shutil
import sys
from typing import Any

from hvdtrain import fs
from hvdtrain.config import JobConfig
from hvdtrain.errors import EnvironmentProblem


def spark_conf(cfg: JobConfig, master: str | None = None) -> dict[str, str]:
    """All Spark settings for a job, as plain data (unit-tested)."""
    conf = {
        "spark.app.name": cfg.spark.app_name,
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "8",
        # Python workers do the tokenizing and writing; reuse them across tasks.
        "spark.python.worker.reuse": "true",
    }
    if master:
        conf["spark.master"] = master
    if cfg.hive.embedded:
        # Derby lives on the driver's local disk; the warehouse may be local or on HDFS.
        metastore = fs.local_path(cfg.hive.metastore_dir)
        warehouse = fs.local_path(cfg.hive.warehouse_dir) if fs.is_local(cfg.hive.warehouse_dir) \
            else cfg.hive.warehouse_dir
        conf.update({
            "spark.sql.catalogImplementation": "hive",
            "spark.sql.warehouse.dir": warehouse,
            "spark.hadoop.javax.jdo.option.ConnectionURL":
                f"jdbc:derby:;databaseName={metastore}/metastore_db;create=true",
            "spark.hadoop.hive.metastore.schema.verification": "false",
            "spark.hadoop.datanucleus.schema.autoCreateAll": "true",
            "spark.driver.extraJavaOptions": f"-Dderby.system.home={metastore}",
        })
    conf.update(cfg.spark.conf)
    return conf


def get_session(cfg: JobConfig, master: str | None = None) -> Any:
    """Build (or join) the SparkSession for a job.

    ``master`` is the explicit one for a local run; under spark-submit it is
    None and the command line decides.
    """
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise EnvironmentProblem("Spark needs Java 17: java is not on PATH and JAVA_HOME is not set; "
                                 "install openjdk-17-jre-headless")
    from pyspark.sql import SparkSession

    if (master or "").startswith("local"):
        # Local workers run this interpreter (the venv), not whatever python3 is on PATH.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if cfg.hive.embedded:
        if not fs.is_local(cfg.hive.metastore_dir):
            raise EnvironmentProblem(f"hive.metastore_dir {cfg.hive.metastore_dir} must be a local folder "
                                     "(the embedded Derby metastore lives on the driver); for a shared metastore "
                                     "set hive.embedded: false and put hive-site.xml on Spark's classpath")
        os.makedirs(fs.local_path(cfg.hive.metastore_dir), exist_ok=True)
        fs.makedirs(cfg.hive.warehouse_dir)
    builder = SparkSession.builder
    for key, value in spark_conf(cfg, master).items():
        builder = builder.config(key, value)
    spark = builder.enableHiveSupport().getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
