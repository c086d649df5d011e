"""The Spark driver of a training job: ``horovod.spark.run`` (``run_elastic``) of the rank function on N tasks.

spark-submit runs this file (``yarn/submit.py`` builds the command)::

    spark-submit ... yarn/driver.py --config job.yaml --num-proc N --start-timeout S \\
        --executable ./env/bin/python --result hdfs://.../yarn_result.json

It starts N Spark tasks, one per executor; Horovod's Gloo controller connects
them, and each task's rank process runs :func:`yarn.executor.run_rank`. The
driver prints rank 0's result, writes every rank's record to ``--result``
(through :mod:`hvdtrain.hadoop.fs`, so an ``hdfs://`` path works in cluster mode,
where this process's output goes to the YARN logs), and exits 0 only when
every rank trained.

This module owns the launcher's use of pyspark and ``horovod.spark``.
"""
from __future__ import annotations

import os
import sys

# spark-submit runs this file as a script, so its folder (yarn/) would come first on
# sys.path, and yarn/packaging.py would shadow the `packaging` distribution Horovod imports.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import time  # noqa: E402
from typing import Any, Iterator, Mapping, Optional, Sequence  # noqa: E402

from hvdtrain.core import config as config_mod  # noqa: E402
from hvdtrain.core import secrets  # noqa: E402
from hvdtrain.core.config import JobConfig, TrainConfig, YarnConfig  # noqa: E402
from hvdtrain.core.errors import HvdtrainError, StepFailed  # noqa: E402
from hvdtrain.hadoop import fs, hadoop_conf, hadoop_tokens, spark_start
from hvdtrain.observe import console
from hvdtrain.runtime import startup, supervise
from hvdtrain.runtime.launch import spark_malloc_env  # noqa: E402
from hvdtrain.training import checkpoint, leases  # noqa: E402
from yarn import executor

RESULT_MARK = "hvdtrain: rank 0 result:"


def horovod_env(y: YarnConfig, executors_sealed: bool = False) -> dict[str, str]:
    """Extra environment for every rank process (pure): glibc's malloc top pad (:func:`hvdtrain.runtime.launch.malloc_env`),
    then yarn.env (NCCL_*, GLOO_*, HOROVOD_*, ...). A top pad set in yarn.env or as the executors' environment in
    yarn.spark_conf is left to win. With ``executors_sealed`` (a cluster job: yarn/submit.py's ``conf_args``) the
    executors' daemon already put yarn.env's secrets back (yarn/spark_daemon.py) and every rank inherits its task's
    environment, so they are left out here: Horovod's driver sends this environment to the tasks over the network."""
    env = {"PYTHONUNBUFFERED": "1", **spark_malloc_env(y.env, y.spark_conf)}
    return secrets.split_secret_items(env)[0] if executors_sealed else env


def summarize(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The job's result document from every rank's record, in rank order (pure)."""
    errors = [f"rank {r['rank']}: {r['error']}" for r in records if r.get("error")]
    chief = records[0] if records else {}
    return {
        "ok": bool(records) and not errors,
        "world_size": len(records),
        "errors": errors,
        "result": chief.get("result"),
        "ranks": [{k: v for k, v in r.items() if k != "result"} for r in records],
    }


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="yarn/driver.py", description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="the resolved job YAML")
    p.add_argument("--num-proc", type=int, required=True, help="Horovod ranks (one Spark task each)")
    p.add_argument("--start-timeout", type=int, default=600, help="seconds for all tasks to start")
    p.add_argument("--executable", default=sys.executable, help="Python that runs each rank on the executors")
    p.add_argument("--result", required=True, help="where to write every rank's record (JSON)")
    p.add_argument("--verbose", type=int, default=1, help="horovod.spark.run verbosity (0-2)")
    p.add_argument("--script-zip", help="a user's script folder, zipped (hvdtrain yarn run): every rank runs the "
                                        "script instead of hvdtrain's training")
    p.add_argument("--script", help="the script's path inside --script-zip")
    p.add_argument("--script-args", default="[]", help="the script's arguments (a JSON list)")
    p.add_argument("--logs", help="folder for every rank's log (rank<N>.log; local or hdfs://)")
    return p.parse_args(argv)


def rank_job(cfg: JobConfig, args: argparse.Namespace) -> tuple[Any, tuple[Any, ...]]:
    """The function every rank runs and its arguments: hvdtrain's training, or the user's script."""
    if args.script_zip:
        spec = {"zip": args.script_zip, "script": args.script, "args": json.loads(args.script_args),
                "logs": args.logs, "executor_cores": cfg.yarn.executor_cores}
        return executor.run_script, (spec,)
    return executor.run_rank, (cfg.to_dict(),)


def job_exit_code(records: Sequence[dict[str, Any]], script: bool) -> int:
    """The job's exit code (pure): a user script's is its worst rank's; training's, its first failed rank's."""
    if script:
        return supervise.worst_code([int(r.get("exit_code", 0)) for r in records], 0 if records else 1)
    return records_exit_code(records)


def run_job(cfg: JobConfig, args: argparse.Namespace) -> tuple[list[dict[str, Any]], supervise.Outcome, dict[str, Any]]:
    """Start Spark, run the ranks (relaunched inside this application after a restartable failure, up to
    ``fault.max_restarts`` times), write every rank's record to ``args.result``, stop Spark; returns the last
    try's rank records, the outcome and the summary written."""
    import horovod.spark
    from pyspark import SparkContext

    # horovod.spark needs only the SparkContext; a SparkSession on top of it would cost about 3 s more of
    # start-up (its SQL state), before any rank runs.
    sc = spark_start.start(SparkContext.getOrCreate)
    sc.setLogLevel("WARN")
    print(f"hvdtrain: Spark application {sc.applicationId}: {args.num_proc} ranks", flush=True)
    last: dict[str, list[dict[str, Any]]] = {"records": []}
    fn, fn_args = rank_job(cfg, args)
    sealed = sc.getConf().contains(f"spark.executorEnv.{secrets.SEALED_ENV}")

    submitted_at = startup.launched_at()
    stack = contextlib.ExitStack()
    token_env: dict[str, str] = {}
    lease_env: dict[str, str] = {}

    failed = {"any": False}

    def once(env: Mapping[str, str]) -> tuple[int, str]:
        # The first try's ranks time their start-up from the command (hvdtrain yarn submit passes its start: in
        # client mode this driver inherits it), so spark-submit, the containers and the archive's localization
        # are their launcher phase; a relaunch, or cluster mode, from the try's start.
        first = supervise.RESTARTS_ENV not in env
        rank_env = {**horovod_env(cfg.yarn, sealed), **env, **token_env, **lease_env,
                    **startup.try_clock(first, submitted_at, time.time())}
        try:
            last["records"] = launch(horovod.spark, cfg.train, fn, fn_args, args, rank_env)
        except RuntimeError as exc:  # a rank process failed, was lost or never started
            print(f"hvdtrain: the Horovod job failed: {exc}", file=sys.stderr, flush=True)
            failed["any"] = True
            return 1, str(exc)
        code = job_exit_code(last["records"], bool(args.script_zip))
        failed["any"] = failed["any"] or code != 0
        return code, ""

    try:
        token_env = stack.enter_context(hdfs_token_for_ranks(cfg.yarn))
        if not args.script_zip:  # one training job per output: this driver holds the leases across restarts
            lease_env = stack.enter_context(leases.hold(
                cfg.train.output, cfg.checkpoint.dir if cfg.checkpoint.enabled else None))
        outcome = supervise.run_with_restarts(
            once, cfg.fault.max_restarts,
            resume_step=lambda: checkpoint.newest_step(cfg.checkpoint.dir) if cfg.checkpoint.enabled else None,
            wait=lambda attempt: supervise.backoff(attempt, cfg.fault.restart_backoff))
        summary = {**summarize(last["records"]), "restarts": [vars(r) for r in outcome.restarts]}
        # Before Spark stops: on a Kerberos cluster this driver reaches HDFS with the application's delegation
        # token (hvdtrain.hadoop.hadoop_tokens), which the ResourceManager cancels once the application ends.
        fs.write_bytes_atomic(args.result, (json.dumps(summary, indent=2) + "\n").encode())
        return last["records"], outcome, summary
    finally:
        stack.close()
        if failed["any"] and sc.master == "yarn":
            time.sleep(loss_report_wait(sc.getConf().get(HEARTBEAT_CONF, None)))
        sc.stop()


# Why YARN ended a container (killed for its memory, say) reaches this driver from the application master, which
# learns it from the ResourceManager on its next heartbeat; Spark logs it only then ("Container killed by YARN for
# exceeding physical memory limits ..."), and the launcher names the memory kill from that line. A rank's failure
# is seen at once, so after one the driver gives the report a heartbeat and a second before Spark stops.
HEARTBEAT_CONF = "spark.yarn.scheduler.heartbeat.interval-ms"


def loss_report_wait(heartbeat_ms: Optional[str]) -> float:
    """Seconds to wait for the application master's report of a lost container (pure): its heartbeat (Spark's
    default 3 s, at most 10 s here) plus one."""
    try:
        seconds = int(str(heartbeat_ms).removesuffix("ms")) / 1000 if heartbeat_ms else 3.0
    except ValueError:
        seconds = 3.0
    return min(seconds, 10.0) + 1.0


@contextlib.contextmanager
def hdfs_token_for_ranks(y: YarnConfig) -> Iterator[dict[str, str]]:
    """On a Kerberos cluster, with ``yarn.principal``/``yarn.keytab`` on this host (client mode): the ranks'
    environment gets an HDFS delegation token for ``fs.defaultFS`` that this driver renews while they run
    (:class:`hvdtrain.hadoop.hadoop_tokens.TokenRenewer`). Otherwise nothing: the ranks use their containers' tokens."""
    props = hadoop_conf.load()
    if not (hadoop_tokens.kerberos_enabled(props) and y.principal and y.keytab and os.path.isfile(y.keytab)
            and props.get("fs.defaultFS", "").startswith("hdfs://")):
        yield {}
        return
    hadoop_tokens.use_keytab(y.principal, y.keytab)
    with hadoop_tokens.TokenRenewer(props["fs.defaultFS"]) as renewer:
        yield {hadoop_tokens.TOKEN_ENV: renewer.token, hadoop_tokens.TOKEN_FS_ENV: props["fs.defaultFS"]}
    print(f"hvdtrain: the ranks' HDFS delegation token was renewed {renewer.renewals} times while they ran",
          flush=True)


def launch(spark_hvd: Any, train: TrainConfig, fn: Any, fn_args: tuple[Any, ...], args: argparse.Namespace,
           env: Mapping[str, str]) -> list[dict[str, Any]]:
    """One try of the ranks: ``horovod.spark.run``, or with ``train.elastic`` ``horovod.spark.run_elastic``.

    Elastic Horovod on Spark treats every task attempt as a host of one slot: a lost rank fails its task, the
    survivors go on, and Spark's retry of the task (``spark.task.maxFailures``, yarn/submit.py) joins as a new
    host. ``run_elastic`` has no ``executable`` parameter and starts the ranks with ``sys.executable``
    (horovod.spark.gloo_run.gloo_run_elastic), so it is this driver's only for the call.
    """
    el = train.elastic
    if el is None:
        return spark_hvd.run(fn, args=fn_args, num_proc=args.num_proc, start_timeout=args.start_timeout,
                             use_gloo=True, env=dict(env), verbose=args.verbose, executable=args.executable)
    driver_python, sys.executable = sys.executable, args.executable
    try:
        return spark_hvd.run_elastic(fn, args=fn_args, num_proc=args.num_proc, min_num_proc=el.min_ranks,
                                     max_num_proc=el.max_ranks, start_timeout=args.start_timeout,
                                     elastic_timeout=args.start_timeout, env=dict(env), verbose=args.verbose)
    finally:
        sys.executable = driver_python


def records_exit_code(records: Sequence[dict[str, Any]]) -> int:
    """0 when every rank succeeded, else the exit code of the first rank's error (pure)."""
    failed = [r for r in records if r.get("error")]
    return int(failed[0].get("exit_code", 2)) if failed else (0 if records else 1)


def main(argv: Optional[Sequence[str]] = None) -> int:
    # Horovod's rendezvous server logs every key at INFO; warnings are what matter here.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s driver %(levelname)s %(message)s",
                        datefmt="%H:%M:%S")
    args = parse_args(argv)
    try:
        cfg = config_mod.load(args.config)
        records, outcome, summary = run_job(cfg, args)
    except HvdtrainError as exc:
        return console.print_error(exc, "hvdtrain")
    if outcome.failure is not None and not records:
        return console.print_error(StepFailed(f"the Horovod job failed: {outcome.failure.cause}; the ranks' messages "
                                              "above say why"), "hvdtrain")
    if summary["result"] is not None:
        print(RESULT_MARK, json.dumps(summary["result"], indent=2), sep="\n")
    print(f"hvdtrain: every rank's record: {args.result}", flush=True)
    for error in summary["errors"]:
        print(f"hvdtrain: error: {error}", file=sys.stderr)
    return 0 if summary["ok"] else job_exit_code(records, bool(args.script_zip))


if __name__ == "__main__":
    sys.exit(main())
