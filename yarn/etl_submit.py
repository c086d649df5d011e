"""The ETL on YARN: spark-submit of ``etl/job.py`` with the shipped code and environment.

    python -m yarn.etl_submit CONFIG [key=value ...] [--num-executors N] [--executor-cores C]
        [--queue Q] [--principal P --keytab K] [--master yarn|spark://HOST:PORT|local[N]] [--overwrite] [--dry-run]

(also ``hvdtrain yarn etl ...``). Built from the same parts as ``hvdtrain yarn
submit`` (:mod:`yarn.submit`), as ``hvdtrain yarn score`` (:mod:`yarn.score`) is:
the packed environment (``--archives``, cached by content hash), the code zip
(``--py-files``), Kerberos (``--principal`` / ``--keytab``), queue, memory and
cores (:func:`yarn.submit.cluster_args`), ``yarn.env`` on every executor, the dry
run's printout and the :class:`yarn.submit.Submission` that kills the
application when the command is interrupted. The ETL is an ordinary Spark job:
task retries and the cluster's dynamic allocation stay on unless
``--num-executors`` fixes the count. The write tasks set up libhdfs in their
container themselves (:func:`hvdtrain.hadoop.fs.prepare_hdfs_client`), as training
ranks do, so ``etl.output=hdfs://...`` works without any CLASSPATH in the command.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Optional, Sequence

from hvdtrain.core import config as config_mod
from hvdtrain.core import secrets
from hvdtrain.core.config import JobConfig, YarnConfig
from hvdtrain.core.errors import ConfigError
from hvdtrain.hadoop import fs
from hvdtrain.hadoop.envcheck import HorovodBuild
from yarn import packaging, submit

ETL_SCRIPT = os.path.join(packaging.project_root(), "etl", "job.py")

# Spark settings this launcher sets, and what controls each.
OWNED_CONF = {
    "spark.master": "--master", "spark.submit.deployMode": "yarn.deploy_mode",
    "spark.executor.instances": "--num-executors", "spark.executor.cores": "--executor-cores / yarn.executor_cores",
    "spark.pyspark.python": "yarn.env_archive (the shipped env's ./env/bin/python)",
    "spark.pyspark.driver.python": "yarn.deploy_mode",
}


def etl_conf(cfg: JobConfig, local: bool, deploy_mode: str, inputs: submit.Inputs) -> list[tuple[str, str]]:
    """The --conf settings of an ETL submission (pure).

    Reads cfg.yarn and cfg.spark (the event log).
    """
    python = inputs.python if local else inputs.cluster_python
    driver_python = inputs.python if local or deploy_mode == "client" else inputs.cluster_python
    conf = [("spark.pyspark.python", python), ("spark.pyspark.driver.python", driver_python)]
    if not local and deploy_mode == "cluster":  # the driver publishes the dataset from its container
        conf.append(("spark.yarn.appMasterEnv.PYSPARK_PYTHON", inputs.cluster_python))
        conf += [(f"spark.yarn.appMasterEnv.{k}", v) for k, v in sorted(cfg.yarn.env.items())]
    conf += submit.worker_env_conf(cfg.yarn)
    conf += list(secrets.spark_redaction_conf(cfg.yarn.spark_conf).items())  # the UI and event logs hide secrets
    return conf + list(config_mod.event_log_conf(cfg.spark).items()) + list(cfg.yarn.spark_conf.items())


def validate(y: YarnConfig, master: str, num_executors: Optional[int], is_file: Callable[[str], bool]) -> None:
    """Refuse a submission that cannot work, naming the value and the fix."""
    submit.check_master(master)
    if num_executors is not None and num_executors < 1:
        raise ConfigError("--num-executors", num_executors, "must be >= 1 (or leave it out: dynamic allocation)")
    if y.keytab is not None and not is_file(y.keytab):
        raise ConfigError("yarn.keytab", y.keytab, "does not exist or is not a file; pass the keytab of "
                          "--principal on this host")
    for key, value in y.spark_conf.items():
        if key in OWNED_CONF:
            raise ConfigError(f"yarn.spark_conf.{key}", value, f"is set by the launcher; use {OWNED_CONF[key]}")


def build_etl_plan(cfg: JobConfig, master: str, inputs: submit.Inputs, job_args: Sequence[str],
                   num_executors: Optional[int] = None, is_file=os.path.isfile) -> submit.SubmitPlan:
    """The spark-submit command for ``etl/job.py`` (pure, given ``is_file`` for the keytab)."""
    validate(cfg.yarn, master, num_executors, is_file)
    local = submit.is_local_master(master)
    deploy_mode = submit.deploy_mode_for(cfg.yarn, master)
    argv = [inputs.spark_submit, "--master", master, "--deploy-mode", deploy_mode,
            "--name", f"hvdtrain-etl-{cfg.name}", *submit.cluster_args(cfg.yarn, master, inputs)]
    if num_executors is not None and master == "yarn":
        argv += ["--num-executors", str(num_executors)]
    elif num_executors is not None and submit.is_standalone_master(master):
        argv += ["--total-executor-cores", str(num_executors * cfg.yarn.executor_cores)]
    settings = submit.conf_args(etl_conf(cfg, local, deploy_mode, inputs), os.path.dirname(inputs.code_zip), master)
    argv += submit.shipped_args(inputs, deploy_mode, settings.files)
    argv += settings.argv
    argv += [ETL_SCRIPT, "--config", submit.driver_config(inputs, deploy_mode), *job_args]
    notes = _notes(cfg) if not local else []
    if local and num_executors is not None:
        notes.append(f"--num-executors {num_executors} does not apply to --master {master}")
    env = submit.submit_env(inputs, master)
    manifest_uri = fs.join(cfg.etl.output, "manifest.json")
    return submit.SubmitPlan(argv, env, master, deploy_mode, manifest_uri, os.path.dirname(inputs.code_zip), notes,
                             settings.secret_conf, settings.properties_file, settings.sealed_env,
                             settings.sealed_env_file)


def _notes(cfg: JobConfig) -> list[str]:
    """What the submitter is told before an ETL runs on the cluster.

    Reads cfg.etl, cfg.source, cfg.hive and cfg.yarn (where outputs, the table and the metastore are).
    """
    notes = []
    if fs.is_local(cfg.etl.output):
        notes.append(f"etl.output {cfg.etl.output} is a local path: every executor writes shards there, so it must "
                     "be a shared mount; or set etl.output=hdfs://namenode:8020/...")
    if cfg.hive.embedded and not cfg.source.path:
        notes.append("hive.embedded is true: the table is looked up in a Derby metastore on the driver, not the "
                     "cluster's; set hive.embedded=false to use the metastore of Spark's hive-site.xml")
    return notes + submit.archive_notes(cfg.yarn)


def job_args(args: argparse.Namespace) -> list[str]:
    """etl/job.py's own flags, passed through (pure)."""
    return (["--overwrite"] if args.overwrite else []) + (["--create-sample-table"] if args.create_sample_table
                                                          else [])


def flag_overrides(args: argparse.Namespace, cwd: str) -> list[str]:
    """Config overrides the flags stand for: yarn.submit's queue and Kerberos ones, and the executor cores."""
    as_submit = argparse.Namespace(num_workers=None, gpus_per_worker=None, queue=args.queue,
                                   principal=args.principal, keytab=args.keytab)
    out = submit.flag_overrides(as_submit, cwd)
    if args.executor_cores is not None:
        if args.executor_cores < 1:
            raise ConfigError("--executor-cores", args.executor_cores, "must be >= 1")
        out.append(f"yarn.executor_cores={int(args.executor_cores)}")
    return out


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hvdtrain yarn etl", description="Run the ETL on YARN: spark-submit of "
                                "etl/job.py with the shipped environment (flags override the config).")
    p.add_argument("config", help="job YAML: its source is read, etl.output is written")
    p.add_argument("overrides", nargs="*", help="config overrides, section.key=value")
    p.add_argument("--num-executors", type=int, help="a fixed executor count (default: the cluster's dynamic "
                                                     "allocation)")
    p.add_argument("--executor-cores", type=int, help="cores per executor (yarn.executor_cores)")
    p.add_argument("--queue", help="YARN queue (yarn.queue)")
    p.add_argument("--principal", help="Kerberos principal, with --keytab")
    p.add_argument("--keytab", help="keytab file for --principal")
    p.add_argument("--master", default="yarn", help=submit.MASTER_HELP)
    p.add_argument("--overwrite", action="store_true", help="replace the dataset at etl.output (the old one stays "
                                                            "readable until the new one is published)")
    p.add_argument("--create-sample-table", action="store_true",
                   help="first write source.sample rows into source.table (demo and smoke tests)")
    p.add_argument("--dry-run", action="store_true", help="print the command and environment; run nothing")
    return p.parse_intermixed_args(argv)


def run(args: argparse.Namespace, deps: submit.Collaborators) -> int:
    cfg = config_mod.load(args.config, list(args.overrides) + flag_overrides(args, os.getcwd()))
    # The same identity, hence the same cached env archive, as training's submissions.
    build = submit.probe_build(args, deps) if not submit.is_local_master(args.master) else HorovodBuild()
    with submit.staged_inputs(cfg, args, deps, build, "etl") as inputs:
        plan = build_etl_plan(cfg, args.master, inputs, job_args(args), args.num_executors)
        if submit.launch(cfg, plan, inputs, args, deps, job=" of the ETL"):
            print(f"hvdtrain: ETL finished; dataset: {plan.result_uri}", file=deps.out)
    return 0


def main(argv: Optional[Sequence[str]] = None, deps: Optional[submit.Collaborators] = None) -> int:
    return submit.guarded(run, parse_args(argv), deps or submit.Collaborators())


if __name__ == "__main__":
    sys.exit(main())
