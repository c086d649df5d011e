"""The SparkSession, with Hive support. This module owns the pyspark import.

Locally (``hive.embedded: true``) the metastore is an embedded Derby database
and the warehouse a local folder, both under the job's workdir. On a cluster
(``hive.embedded: false``) Spark takes the metastore from the hive-site.xml on
its classpath, as spark-submit sets it up.

Quiet by default: when this process starts Spark itself (a local run: ``hvdtrain
etl``, ``hvdtrain demo``, ``python -m etl.job --master ...``), Spark's own log
(log4j, and whatever the JVM and its Python workers print) goes to
``{workdir}/logs/spark-<job>.log`` (:func:`hvdtrain.observe.console.spark_log_file`)
and its stage progress bars are off, so the job's own lines and its one-line
error stay readable; ``verbose`` puts both back on the console. Under
spark-submit, Spark's logging is spark-submit's.
"""
from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import sys
import tempfile
from typing import Any, Iterator, Optional

from hvdtrain.core import config as config_mod
from hvdtrain.core import secrets
from hvdtrain.core.config import JobConfig
from hvdtrain.core.errors import EnvironmentProblem
from hvdtrain.hadoop import fs, spark_start
from hvdtrain.observe import console

# Spark's own defaults (log4j2-defaults.properties), written to a file instead of the console.
LOG4J2_PROPERTIES = """\
rootLogger.level = info
rootLogger.appenderRef.file.ref = file
appender.file.type = File
appender.file.name = file
appender.file.fileName = {path}
appender.file.append = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
logger.jetty.name = org.sparkproject.jetty
logger.jetty.level = warn
logger.metastore.name = org.apache.hadoop.hive.metastore.RetryingHMSHandler
logger.metastore.level = fatal
logger.hive_functionregistry.name = org.apache.hadoop.hive.ql.exec.FunctionRegistry
logger.hive_functionregistry.level = error
logger.parquet.name = org.apache.parquet.CorruptStatistics
logger.parquet.level = error
"""


def spark_conf(cfg: JobConfig, master: str | None = None, log_config: Optional[str] = None,
               progress_bars: bool = False) -> dict[str, str]:
    """All Spark settings for a job, as plain data (unit-tested).

    ``log_config``: a log4j2 properties file for the driver (Spark's log to a file).

    Reads cfg.spark, cfg.hive (an embedded metastore's settings) and cfg.etl (its shuffle partitions).
    """
    java_options = [f"-Dlog4j2.configurationFile=file:{log_config}"] if log_config else []
    conf = {
        "spark.app.name": cfg.spark.app_name,
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "true" if progress_bars else "false",
        # Shuffle sizes: Spark's adaptive execution coalesces shuffle partitions to the data it sees, unless
        # etl.shuffle_partitions fixes the number.
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.adaptive.coalescePartitions.enabled": "true",
        # ... the persisted rows too: by default a cached plan keeps all spark.sql.shuffle.partitions (200), and
        # every stage after the cache then runs 200 Python tasks; on the 1,500-row test table the ETL took 42 s
        # instead of 2.4 s.
        "spark.sql.optimizer.canChangeCachedPlanOutputPartitioning": "true",
        # Python workers do the tokenizing and writing; reuse them across tasks.
        "spark.python.worker.reuse": "true",
    }
    conf.update(fs.spark_umask_conf())  # Spark's own HDFS writes (rejects, Hive tables) withhold what hvdtrain's do
    if cfg.etl.shuffle_partitions:
        conf["spark.sql.shuffle.partitions"] = str(cfg.etl.shuffle_partitions)
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
            # Embedded means embedded: a hive-site.xml on the classpath (a gateway's, `hvdtrain cluster up
            # --hive`'s) naming a metastore service would otherwise take this job's tables there.
            "spark.hadoop.hive.metastore.uris": "",
        })
        java_options.append(f"-Dderby.system.home={metastore}")
    if java_options:
        conf["spark.driver.extraJavaOptions"] = " ".join(java_options)
    conf.update(config_mod.event_log_conf(cfg.spark))
    conf.update(secrets.spark_redaction_conf(cfg.spark.conf))  # the UI and event logs hide secrets
    conf.update(cfg.spark.conf)
    conf.update(FIXED_CONF)
    return conf


def log_file(workdir: str, master: str | None, verbose: bool, job: str) -> Optional[str]:
    """Where Spark's own log goes: a file when this process starts Spark quietly, else None (pure)."""
    if verbose or master is None:  # under spark-submit the driver JVM is already running
        return None
    return console.spark_log_file(workdir, job)


# Settings no config may change: ``${var}`` in a filter or a partition value is never expanded by Spark.
FIXED_CONF = {"spark.sql.variable.substitute": "false"}


def get_session(cfg: JobConfig, master: str | None = None, verbose: bool = False, job: str = "etl") -> Any:
    """Build (or join) the SparkSession for a job.

    ``master`` is the explicit one for a local run; under spark-submit it is
    None and the command line decides. Unless ``verbose``, a local run logs to
    :func:`log_file` (``job`` names it) and shows no stage progress bars.
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
    fs.makedirs_if_local(cfg.spark.event_log_dir)  # Spark refuses to start without it
    path = log_file(cfg.workdir, master, verbose, job)
    log_config = _write_log_config(path) if path else None
    builder = SparkSession.builder
    plain, secret = secrets.split_secret_items(spark_conf(cfg, master, log_config, progress_bars=verbose))
    for key, value in plain.items():
        builder = builder.config(key, value)
    with _output_to(path), _secret_properties(secret, builder):
        spark = spark_start.start(builder.enableHiveSupport().getOrCreate)
    for key, value in FIXED_CONF.items():  # a joined session (spark-submit) keeps its own settings otherwise
        spark.conf.set(key, value)
    if path is None:
        spark.sparkContext.setLogLevel("WARN")
    return spark


def _write_log_config(path: str) -> str:
    """A fresh log file and the log4j2 properties that write Spark's log to it."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "w").close()  # one run per file
    config_path = os.path.splitext(path)[0] + ".log4j2.properties"
    with open(config_path, "w") as fh:
        fh.write(LOG4J2_PROPERTIES.format(path=path))
    return config_path


@contextlib.contextmanager
def _secret_properties(items: dict[str, str], builder: Any) -> Iterator[None]:
    """Secret settings (``spark.hadoop.fs.s3a.secret.key``, a URL password) reach the JVM PySpark starts through
    a 0600 ``--properties-file``, read once at launch and deleted, never through its command line (PySpark passes
    builder settings as ``--conf K=V``, visible to ``ps``). A JVM already running takes them in process."""
    from pyspark import SparkContext

    if not items:
        yield
        return
    if SparkContext._gateway is not None:
        for key, value in items.items():
            builder.config(key, value)
        yield
        return
    fd, path = tempfile.mkstemp(prefix="hvdtrain-spark-", suffix=".properties")
    os.close(fd)
    before = os.environ.get("PYSPARK_SUBMIT_ARGS")
    try:
        secrets.write_properties(path, items)
        os.environ["PYSPARK_SUBMIT_ARGS"] = (f"--properties-file {shlex.quote(path)} --load-spark-defaults "
                                             + (before or "pyspark-shell"))
        yield
    finally:
        if before is None:
            os.environ.pop("PYSPARK_SUBMIT_ARGS", None)
        else:
            os.environ["PYSPARK_SUBMIT_ARGS"] = before
        os.remove(path)


@contextlib.contextmanager
def _output_to(path: Optional[str]) -> Iterator[None]:
    """Point this process's stdout/stderr at ``path`` while Spark's JVM starts (nothing when None).

    pyspark starts the JVM with this process's stdout and stderr, and the JVM keeps them:
    its own warnings (e.g. the incubator-module notice), anything printed before log4j is
    configured, and the stderr of the Python workers it forks. Handing it the log file
    sends all of that where Spark's log4j output goes; this process gets its own back.
    """
    if path is None:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    target = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.dup2(target, 1)
        os.dup2(target, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, target):
            os.close(fd)


def ship_model_code(spark: Any, code_dir: Optional[str]) -> None:
    """Send ``model.code`` (the user's model package folder) to every executor's Python path, and put it on this
    driver's, so a custom model's layers load where it is scored (``SparkContext.addPyFile`` of a zip)."""
    if not code_dir:
        return
    import tempfile

    if not os.path.isdir(code_dir):
        raise EnvironmentProblem(f"model.code {code_dir} is not a folder on this host: set it to the folder "
                                 "holding the model's builder module")
    if code_dir not in sys.path:
        sys.path.insert(0, code_dir)
    base = os.path.join(tempfile.mkdtemp(prefix="hvdtrain-model-code-"), "model_code")
    spark.sparkContext.addPyFile(shutil.make_archive(base, "zip", root_dir=code_dir))
