"""Batch scoring on YARN: spark-submit of ``etl/score_job.py`` with the shipped code and environment.

    python -m yarn.score CONFIG [key=value ...] --model MODEL --output-table DB.TABLE [--partition K=V]
        [--overwrite] [--queue Q] [--principal P --keytab K] [--master yarn|spark://HOST:PORT|local[N]] [--dry-run]

(also ``hvdtrain yarn score ...``). The same machinery as ``hvdtrain yarn
submit`` (:mod:`yarn.submit`): the packed environment (``--archives``, cached
by content hash), the code zip (``--py-files``), Kerberos (``--principal`` /
``--keytab``), queue and memory flags (:func:`yarn.submit.cluster_args`), the
dry run's printout and the :class:`yarn.submit.Submission` that kills the
application when the command is interrupted. Unlike training, scoring is an
ordinary Spark job: dynamic allocation and task retries stay on, and no
Horovod is needed; executor Python workers get one TensorFlow thread per core
(``score.threads_per_task``).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

from hvdtrain.core import config as config_mod
from hvdtrain.core import secrets
from hvdtrain.core.config import JobConfig
from hvdtrain.core.errors import ConfigError
from hvdtrain.hadoop import envcheck, fs
from yarn import packaging, submit

SCORE_SCRIPT = os.path.join(packaging.project_root(), "etl", "score_job.py")


def score_conf(cfg: JobConfig, local: bool, deploy_mode: str, inputs: submit.Inputs) -> list[tuple[str, str]]:
    """The --conf settings of a scoring submission (pure).

    Reads cfg.yarn and cfg.spark (the event log).
    """
    python = inputs.python if local else inputs.cluster_python
    driver_python = inputs.python if local or deploy_mode == "client" else inputs.cluster_python
    conf = [("spark.pyspark.python", python), ("spark.pyspark.driver.python", driver_python),
            ("spark.sql.catalogImplementation", "hive"), ("spark.python.worker.reuse", "true")]
    if not local and deploy_mode == "cluster":
        conf.append(("spark.yarn.appMasterEnv.PYSPARK_PYTHON", inputs.cluster_python))
    conf += submit.worker_env_conf(cfg.yarn)
    conf += list(secrets.spark_redaction_conf(cfg.yarn.spark_conf).items())  # the UI and event logs hide secrets
    return conf + list(config_mod.event_log_conf(cfg.spark).items()) + list(cfg.yarn.spark_conf.items())


def build_score_plan(cfg: JobConfig, master: str, inputs: submit.Inputs, job_args: Sequence[str],
                     is_file=os.path.isfile) -> submit.SubmitPlan:
    """The spark-submit command for ``etl/score_job.py`` (pure, given ``is_file`` for the keytab)."""
    submit.check_master(master)
    if cfg.yarn.keytab is not None and not is_file(cfg.yarn.keytab):
        raise ConfigError("yarn.keytab", cfg.yarn.keytab, "does not exist or is not a file; pass the keytab of "
                          "--principal on this host")
    local = submit.is_local_master(master)
    deploy_mode = submit.deploy_mode_for(cfg.yarn, master)
    argv = [inputs.spark_submit, "--master", master, "--deploy-mode", deploy_mode,
            "--name", f"hvdtrain-score-{cfg.name}", *submit.cluster_args(cfg.yarn, master, inputs)]
    settings = submit.conf_args(score_conf(cfg, local, deploy_mode, inputs), os.path.dirname(inputs.code_zip), master)
    argv += submit.shipped_args(inputs, deploy_mode, settings.files)
    argv += settings.argv
    argv += [SCORE_SCRIPT, "--config", submit.driver_config(inputs, deploy_mode), *job_args]
    notes = [] if local else _notes(cfg, job_args, deploy_mode)
    env = submit.submit_env(inputs, master)
    report = fs.join(cfg.score.report_dir, "score_report.json")
    return submit.SubmitPlan(argv, env, master, deploy_mode, report, os.path.dirname(inputs.code_zip), notes,
                             settings.secret_conf, settings.properties_file, settings.sealed_env,
                             settings.sealed_env_file)


def _notes(cfg: JobConfig, job_args: Sequence[str], deploy_mode: str) -> list[str]:
    """What the submitter is told before a scoring job runs on the cluster.

    Reads cfg.score (the model and report folder) and cfg.yarn.
    """
    notes = []
    model = job_args[job_args.index("--model") + 1] if "--model" in job_args else cfg.score.model
    if deploy_mode == "cluster" and model and fs.is_local(model) and not model.startswith(("runs:/", "models:/")):
        notes.append(f"--model {model} is a local folder but the driver runs in the cluster (deploy_mode cluster): "
                     "use an hdfs:// training output or an MLflow runs:/ / models:/ URI")
    if fs.is_local(cfg.score.report_dir):
        notes.append(f"score.report_dir {cfg.score.report_dir} is local to the driver's host; set "
                     "score.report_dir=hdfs://... to keep the reports with the table")
    return notes + submit.archive_notes(cfg.yarn)


def job_args(args: argparse.Namespace) -> list[str]:
    """The score job's own flags, passed through (pure)."""
    out = []
    for flag in ("model", "output_table", "partition"):
        value = getattr(args, flag)
        if value:
            out += [f"--{flag.replace('_', '-')}", value]
    return out + (["--overwrite"] if args.overwrite else [])


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hvdtrain yarn score", description="Score on YARN: spark-submit of the "
                                "scoring job with the shipped environment (flags override the config).")
    p.add_argument("config", help="job YAML; its source is the input")
    p.add_argument("overrides", nargs="*", help="config overrides, section.key=value")
    p.add_argument("--model", help="hdfs:// training output, runs:/..., models:/NAME/VERSION|@ALIAS, or a name")
    p.add_argument("--output-table", help="Hive table db.name for the predictions")
    p.add_argument("--partition", help="k=v[,k=v] (default score.partition, else ds=<UTC date>)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty partition (atomically)")
    p.add_argument("--queue", help="YARN queue (yarn.queue)")
    p.add_argument("--principal", help="Kerberos principal, with --keytab")
    p.add_argument("--keytab", help="keytab file for --principal")
    p.add_argument("--master", default="yarn", help=submit.MASTER_HELP)
    p.add_argument("--dry-run", action="store_true", help="print the command and environment; run nothing")
    return p.parse_intermixed_args(argv)


def run(args: argparse.Namespace, deps: submit.Collaborators) -> int:
    cfg = config_mod.load(args.config, list(args.overrides) + submit.flag_overrides(_as_submit(args), os.getcwd()))
    # The same identity, hence the same cached env archive, as training's submissions.
    build = submit.probe_build(args, deps) if not submit.is_local_master(args.master) else envcheck.HorovodBuild()
    with submit.staged_inputs(cfg, args, deps, build, "score") as inputs:
        plan = build_score_plan(cfg, args.master, inputs, job_args(args))
        submit.launch(cfg, plan, inputs, args, deps, job=" of the scoring job")
    return 0


def _as_submit(args: argparse.Namespace) -> argparse.Namespace:
    """The flags yarn.submit.flag_overrides knows (queue, Kerberos); scoring has no worker or GPU count."""
    return argparse.Namespace(num_workers=None, gpus_per_worker=None, queue=args.queue, principal=args.principal,
                              keytab=args.keytab)


def main(argv: Optional[Sequence[str]] = None, deps: Optional[submit.Collaborators] = None) -> int:
    return submit.guarded(run, parse_args(argv), deps or submit.Collaborators())


if __name__ == "__main__":
    sys.exit(main())
