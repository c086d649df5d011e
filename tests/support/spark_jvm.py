"""Spark's JVM in the test process: one gateway serves every SparkSession pytest creates, and that JVM keeps the
Hadoop configuration it started with (HADOOP_CONF_DIR's core-site.xml is on its classpath). A test that starts
Spark against the minicluster must leave no JVM behind, or every later session resolves bare paths on hdfs://."""
from __future__ import annotations

import contextlib
import subprocess
from typing import Any


def stop_with_jvm(spark: Any) -> None:
    """Stop the session and shut its JVM gateway down, so the next session starts a JVM of its own."""
    from pyspark import SparkContext

    spark.stop()
    gateway = SparkContext._gateway
    if gateway is not None:
        gateway.shutdown()
        proc = getattr(gateway, "proc", None)  # the JVM pyspark launched (it ends when its stdin closes)
        if proc is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
    SparkContext._gateway = None
    SparkContext._jvm = None


def default_fs(spark: Any) -> str:
    """The filesystem this session's JVM resolves bare paths on."""
    return spark.sparkContext._jsc.hadoopConfiguration().get("fs.defaultFS")


def assert_local_default_fs(spark: Any) -> None:
    fs = default_fs(spark)
    assert fs.startswith("file:"), (f"this Spark JVM resolves bare paths on {fs}: an earlier test started Spark with "
                                    "HADOOP_CONF_DIR set and left its JVM running (tests/support/spark_jvm.py)")


def module_session(cfg: Any) -> Any:
    """A module's local[2] SparkSession (2 shuffle partitions: small tables), stopped after its last test; a
    fixture yields from it: ``yield from module_session(cfg)``."""
    from etl import session

    s = session.get_session(cfg, "local[2]")
    assert_local_default_fs(s)
    s.conf.set("spark.sql.shuffle.partitions", "2")
    yield s
    s.stop()


def parquet_job(base: Any) -> Any:
    """A minimal job config whose source is Parquet files under ``base/in`` (for modules that call the ETL's
    and scoring's functions directly)."""
    from hvdtrain.core import config

    return config.from_dict({"name": "forms", "workdir": str(base), "source": {"path": str(base / "in"),
                                                                              "format": "parquet"}},
                            base_dir=str(base))
