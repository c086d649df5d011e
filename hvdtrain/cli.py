"""``hvdtrain`` command line: demo, etl, train, run, check-script, tune, yarn, cluster, checkpoints, env, config.

The ETL runs in its own process (``python -m etl.job``, the same entry point
spark-submit runs), and local training under ``horovodrun``; this module only
builds those commands (pure functions) and runs them. It never imports ``etl``
or ``yarn``, which import ``hvdtrain``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

from hvdtrain import tune
from hvdtrain.core import config as config_mod
from hvdtrain.core import secrets, tasks
from hvdtrain.core.errors import (
    EXIT_CODES,
    EXIT_INTERRUPTED,
    ConfigError,
    DataError,
    EnvironmentProblem,
    HvdtrainError,
    StepFailed,
    UsageError,
    add_note,
)
from hvdtrain.data import manifest
from hvdtrain.hadoop import envcheck, fs
from hvdtrain.hadoop.minicluster import cluster as minicluster
from hvdtrain.model import keras3_check
from hvdtrain.observe import console, tensorboard, timeline
from hvdtrain.runtime import elastic_plan, startup, supervise
from hvdtrain.runtime.launch import (
    child_env,
    discovery_script,
    etl_command,
    horovod_command,
    horovodrun,
    score_command,
    score_flags,
    sealed_env,
    train_command,
)
from hvdtrain.training import checkpoint, demo, leases

EXIT_CODES_HELP = "exit codes:\n" + "\n".join(f"  {code:>3}  {meaning}" for code, meaning in EXIT_CODES.items())


def _run(cmd: list[str], extra_env: Optional[Mapping[str, str]] = None) -> console.Outcome:
    """One try of a step in a child process, shown through :mod:`hvdtrain.observe.console`.

    On a terminal the child's output is tidied and rank 0's progress drawn; elsewhere
    its lines pass unchanged. The outcome keeps the last lines for :func:`supervise.classify`.
    """
    tty = sys.stderr.isatty()
    print(f"$ {shlex.join(cmd)}", flush=True)
    env = sealed_env(cmd, console.child_env({**child_env(), **(extra_env or {})}, tty))
    return console.run(cmd, env, console.View(tty))


def _step(cmd: list[str], what: str, spark_log: Optional[str] = None,
          extra_env: Optional[Mapping[str, str]] = None) -> console.Outcome:
    """Run a step once; its reported error (or how it died) becomes ours, with Spark's log named."""
    outcome = _run(cmd, extra_env)
    if outcome.returncode != 0:
        exc = console.failure(outcome, what)
        if spark_log and outcome.error is None and os.path.exists(spark_log):  # it crashed before saying so
            add_note(exc, console.spark_log_note(spark_log))
        raise exc
    return outcome


def _train_with_restarts(cfg: config_mod.JobConfig, cmd: list[str], env: Mapping[str, str]) -> console.Outcome:
    """Run training, relaunching it after a lost rank, a stall or a storage failure (``fault.max_restarts``);
    ``env`` goes to every try (the leases this launcher holds).

    Reads cfg.fault and cfg.checkpoint (where a relaunch resumes from).
    """
    if cfg.fault.max_restarts == 0:
        return _step(cmd, "training", extra_env=env)
    tries, outcome = _supervised(
        cmd, cfg.fault, lambda: checkpoint.newest_step(cfg.checkpoint.dir) if cfg.checkpoint.enabled else None, env)
    if outcome.code == 0:
        return tries[-1]
    if tries[-1].error is not None:  # a rank said what was wrong (a config, data or environment error)
        raise console.failure(tries[-1], "training")
    failure = outcome.failure
    assert failure is not None  # run_with_restarts classifies every non-zero exit
    code = failure.code if failure.code in EXIT_CODES and failure.code != 0 else StepFailed.exit_code
    raise StepFailed(f"training failed after {len(outcome.restarts)} restart(s): {failure.cause}"
                     f"{f' on rank {failure.rank}' if failure.rank is not None else ''}"
                     f" (exit code {outcome.code}); see the messages above", code)


def _supervised(cmd: list[str], fault: config_mod.FaultConfig, resume_step: Callable[[], Optional[int]],
                base_env: Mapping[str, str]) -> tuple[list[console.Outcome], supervise.Outcome]:
    """Run ``cmd`` through the console, relaunched after restartable failures up to ``fault.max_restarts``."""
    tries: list[console.Outcome] = []

    def once(env: Mapping[str, str]) -> tuple[int, str]:
        tries.append(_run(cmd, {**base_env, **env}))
        return tries[-1].returncode, tries[-1].tail

    outcome = supervise.run_with_restarts(once, fault.max_restarts, resume_step=resume_step,
                                          wait=lambda attempt: supervise.backoff(attempt, fault.restart_backoff))
    return tries, outcome


def cmd_run(args: argparse.Namespace) -> int:
    """``hvdtrain run --np N SCRIPT [args...]``: a user's Horovod script under horovodrun, after check-script.

    Returns the job's exit code: the worst rank's (0 when every rank finished)."""
    script = keras3_check.script_path(args.script)
    keras3_check.print_findings(script, sys.stderr)
    fault = config_mod.FaultConfig(max_restarts=args.max_restarts or 0, start_timeout=args.start_timeout)
    cmd = horovod_command([sys.executable, script, *args.script_args], args.np, fault.start_timeout, args.hosts)
    if shutil.which(cmd[0]) is None:
        raise EnvironmentProblem(f"{cmd[0]} not found: Horovod is not installed in this environment; build it "
                                 "with `make env` (check with `hvdtrain env check`)")
    tries, outcome = _supervised(cmd, fault, lambda: None, {})
    code = supervise.worst_code(supervise.rank_codes(tries[-1].tail), outcome.code)
    if code:
        how = f"exited with code {code}" if code <= 128 else f"was killed by signal {code - 128}"
        print(f"hvdtrain: {script} failed on {args.np} rank(s): the worst rank {how}"
              f"{f' after {len(outcome.restarts)} restart(s)' if outcome.restarts else ''}", file=sys.stderr)
    return code


def cmd_etl(args: argparse.Namespace) -> int:
    cfg = config_mod.load(args.config, args.overrides)
    _step(etl_command(args.config, args.overrides, args.master or cfg.spark.master, args.overwrite,
                      verbose=args.verbose), "the ETL", console.spark_log_file(cfg.workdir, "etl"))
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    cfg = config_mod.load(args.config, args.overrides)  # a bad config fails here, before Spark starts
    flags = score_flags(args.model, args.output_table, args.partition, args.master or cfg.spark.master,
                        args.overwrite)
    _step(score_command(args.config, args.overrides, flags), "scoring")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    overrides = [*args.overrides, *train_flag_overrides(args, os.getcwd())]
    cfg = config_mod.load(args.config, overrides)  # fail on a bad config before launching ranks
    check_builder_importable(cfg.model)
    # One job per output: this launcher holds train.output's and checkpoint.dir's leases across every restart.
    with leases.hold(cfg.train.output, cfg.checkpoint.dir if cfg.checkpoint.enabled else None) as held, \
            _launch_command(cfg, args.config, overrides, args.np) as cmd:
        outcome = _train_with_restarts(cfg, cmd, held)
    result = outcome.result or json.loads(fs.read_bytes(fs.join(cfg.train.output, "result.json")))
    print(json.dumps(result, indent=2) if args.json else train_summary(result, sample_best(cfg.etl.output)))
    return 0


@contextlib.contextmanager
def _launch_command(cfg: config_mod.JobConfig, config_path: str, overrides: Sequence[str], np: int) -> Iterator[list[str]]:
    """horovodrun for the job: elastic (with a discovery script; a temporary one for this host when
    train.elastic.discovery is unset) or fixed-size.

    Reads cfg.train (its elastic block) and cfg.fault (the start timeout).
    """
    el = cfg.train.elastic
    if el is None:
        yield train_command(config_path, overrides, np, cfg.fault.start_timeout)
        return
    if not el.min_ranks <= np <= el.max_ranks:
        raise ConfigError("--np", np, f"must be within train.elastic.min_ranks {el.min_ranks} and max_ranks "
                          f"{el.max_ranks}: the ranks to start with")
    with tempfile.TemporaryDirectory(prefix="hvdtrain-discovery-") as folder:
        script = el.discovery
        if script is None:
            script = os.path.join(folder, "discover.sh")
            with open(script, "w") as fh:
                fh.write(discovery_script(f"localhost:{el.max_ranks}"))
            os.chmod(script, 0o755)
        yield elastic_plan.horovodrun_command(horovodrun(), config_path, overrides, el, np, script,
                                              cfg.fault.start_timeout)


def check_builder_importable(model: config_mod.ModelConfig) -> None:
    """``model.builder``'s module can be found (with ``model.code``) before any rank starts; the ranks import
    it and check what it returns (hvdtrain.model.models). Finding a module does not import TensorFlow here."""
    if model.kind != "custom" or not model.builder:
        return
    import importlib.util

    module = model.builder.partition(":")[0]
    if model.code:
        if not os.path.isdir(model.code):
            raise ConfigError("model.code", model.code, "is not a folder: give the folder holding the builder's "
                              "package (relative to the YAML file)")
        if model.code not in sys.path:
            sys.path.insert(0, model.code)
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError) as exc:
        found, why = False, f" ({exc})"
    else:
        why = ""
    if not found:
        raise ConfigError("model.builder", model.builder, f"names module {module!r}, which is not importable"
                          f"{why}: set model.code to the folder holding it, or put it on PYTHONPATH")


def sample_best(dataset: str) -> Optional[tuple[str, float]]:
    """(metric, expected best value) of a generated sample table, from its dataset's manifest; None otherwise."""
    try:
        sample = manifest.read(dataset).source.get("sample", {})
    except HvdtrainError:
        return None
    return (sample["best_metric"], float(sample["best_value"])) if "best_metric" in sample else None


def train_flag_overrides(args: argparse.Namespace, cwd: str) -> list[str]:
    """The config overrides ``--max-restarts`` and ``--principal/--keytab`` stand for (pure); a relative
    keytab is relative to where the command runs."""
    out = []
    if getattr(args, "max_restarts", None) is not None:
        out.append(f"fault.max_restarts={args.max_restarts}")
    if getattr(args, "principal", None):
        out.append(f"yarn.principal={json.dumps(args.principal)}")
    if getattr(args, "keytab", None):
        out.append(f"yarn.keytab={json.dumps(os.path.join(cwd, os.path.expanduser(args.keytab)))}")
    return out


def cmd_demo(args: argparse.Namespace) -> int:
    cfg = config_mod.load(args.config, args.overrides)
    if cfg.source.sample is None:
        raise ConfigError("source.sample", None, f"is needed by the demo, which generates its data from it; "
                          f"{args.config} has no source.sample block")
    if cfg.checkpoint.enabled:  # a folder the demo may not clear is refused before the ETL
        demo.check(cfg.checkpoint.dir)
    _step(etl_command(args.config, args.overrides, cfg.spark.master, overwrite=True, create_sample_table=True,
                      verbose=args.verbose), "the ETL", console.spark_log_file(cfg.workdir, "etl"))
    # The training's leases are taken before the previous run's checkpoints go: never from under a running job.
    with leases.hold(cfg.train.output, cfg.checkpoint.dir if cfg.checkpoint.enabled else None) as held:
        if cfg.checkpoint.enabled:  # new data: a new run, not a resume; only what a demo run recorded goes
            if demo.reset(cfg.checkpoint.dir):
                print(f"demo: removed the previous demo run's checkpoints in {cfg.checkpoint.dir}", flush=True)
        _step(train_command(args.config, args.overrides, args.np, cfg.fault.start_timeout), "training",
              extra_env=held)
    print(demo_summary(cfg))
    flags = score_flags(cfg.train.output, DEMO_PREDICTIONS, master=cfg.spark.master, overwrite=True, split="test",
                        evaluate=True)
    _step(score_command(args.config, args.overrides, flags), "scoring the test split")
    return 0


DEMO_PREDICTIONS = "demo.review_predictions"


def table(rows: Sequence[tuple[str, Any]], title: str) -> str:
    """A titled two-column summary, keys aligned (pure)."""
    width = max(len(k) for k, _ in rows)
    return "\n".join(["", title] + [f"  {k:<{width}}  {v}" for k, v in rows])


def train_summary(result: dict[str, Any], best: Optional[tuple[str, float]] = None) -> str:
    """The closing table of ``hvdtrain train``: how well it did (beside ``best``, the expected best score
    of a generated table) and where everything is (pure)."""
    exports = result.get("exports", {})
    rows = [
        *task_rows(result, best),
        ("epochs", result.get("epochs_run")),
        ("ranks", f"{result.get('world_size')}; weights identical on every rank: {result.get('ranks_agree')}"
                  + (f"; elastic, world sizes {', '.join(map(str, result['sizes']))}" if "sizes" in result else "")),
        ("eval report", result.get("report")),
        ("exported model", exports.get("keras")),
        mlflow_row(result),
    ]
    return table(rows, "training finished (the full result: --json):")


def mlflow_row(result: dict[str, Any]) -> tuple[str, str]:
    """Where the run went, or that it went nowhere (pure)."""
    if result.get("run_id") is None:
        return "MLflow", "not logged (tracking.enabled is false, or MLflow failed: see the log)"
    return "MLflow", f"run {result.get('run_id')} at {result.get('tracking_uri')}"


METRIC_NAMES = {"accuracy": "accuracy", "macro_f1": "macro F1", "loss": "loss", "roc_auc": "ROC AUC",
                "pr_auc": "PR AUC", "log_loss": "log loss", "f1": "F1", "micro_f1": "micro F1",
                "macro_roc_auc": "macro ROC AUC", "subset_accuracy": "subset accuracy", "rmse": "RMSE",
                "mae": "MAE", "r2": "R^2"}


def task_rows(result: dict[str, Any], best: Optional[tuple[str, float]] = None) -> list[tuple[str, str]]:
    """The test split's headline metrics of the run's task, then validation's first one (pure); ``best``
    (metric, value) is the expected best score (its estimate for the generated table), shown beside that metric."""
    task = result.get("task", "multiclass")
    test = result.get("test_metrics") or {k: result.get(f"test_{k}") for k in ("accuracy", "macro_f1")}
    rows = []
    for name in tasks.HEADLINE[task]:
        if test.get(name) is not None:
            note = f" (expected best ~{best[1]:.4f})" if best and best[0] == name else ""
            rows.append((f"test {METRIC_NAMES[name]}", f"{test[name]:.4f}{note}"))
    first = tasks.HEADLINE[task][0]
    validation = result.get("validation_metrics") or {"accuracy": result.get("validation_accuracy")}
    if validation.get(first) is not None:
        rows.append((f"validation {METRIC_NAMES[first]}", f"{validation[first]:.4f}"))
    return rows


def demo_summary(cfg: config_mod.JobConfig) -> str:
    """Where every output of the demo is, and how well it did.

    Reads cfg.etl, cfg.train, cfg.source and cfg.hive (where each output is).
    """
    m = manifest.read(cfg.etl.output)
    result_path = fs.join(cfg.train.output, "result.json")
    result = json.loads(fs.read_bytes(result_path))
    ceiling = m.source.get("sample", {}).get("accuracy_ceiling")
    exports = result.get("exports", {})
    rows = [
        ("Hive table", f"{cfg.source.table} (warehouse {cfg.hive.warehouse_dir})"),
        ("dataset manifest", m.location),
        ("records", ", ".join(f"{s} {m.split(s).records:,} in {len(m.split(s).shards)} shards" for s in m.splits)),
        ("rejected rows", f"{m.source.get('rows_rejected', 0):,}"
         + (f" (quarantined in {fs.join(cfg.etl.output, 'rejects')})" if m.source.get("rows_rejected") else "")),
        ("eval report", result.get("report")),
        ("exported model", exports.get("keras")),
        ("SavedModel", exports.get("saved_model")),
        mlflow_row(result),
        ("ranks", f"{result.get('world_size')}; weights identical on every rank: {result.get('ranks_agree')}"),
    ]
    sample = m.source.get("sample", {})
    if result.get("task", "multiclass") == "multiclass" or "best_metric" not in sample:
        rows.append(("test accuracy", f"{result['test_accuracy']:.4f}"
                     + (f" (expected best ~{ceiling:.4f} with {sample['label_noise']:.0%} label noise)"
                        if ceiling else "")))
    else:
        rows += task_rows(result, (sample["best_metric"], sample["best_value"]))
    return table(rows, "demo finished:")


def cmd_yarn(args: argparse.Namespace) -> int:
    """``hvdtrain yarn submit|score|etl ...``: the launchers live in yarn/ (which imports hvdtrain), so run them."""
    modules = {"submit": "yarn.submit", "score": "yarn.score", "etl": "yarn.etl_submit", "run": "yarn.run",
               "pack": "yarn.pack"}
    if not args.rest or args.rest[0] not in modules:
        raise UsageError("usage: hvdtrain yarn submit CONFIG --num-workers N [--gpus-per-worker G] [--queue Q] "
                         "[--principal P --keytab K] [--master M] [--dry-run], or hvdtrain yarn score CONFIG "
                         "--model MODEL --output-table DB.TABLE [--partition K=V] [--queue Q] [--dry-run], or "
                         "hvdtrain yarn etl CONFIG [--num-executors N] [--executor-cores C] [--queue Q] "
                         "[--overwrite] [--dry-run], or hvdtrain yarn run --num-workers N [--config CONFIG] "
                         "[--master M] [--dry-run] SCRIPT [ARGS...], or hvdtrain yarn pack ARCHIVE")
    clock = {startup.LAUNCHED_AT_ENV: f"{startup.CLOCK.start:.3f}"}  # a YARN job's ranks time their start from here
    return subprocess.call([sys.executable, "-m", modules[args.rest[0]], *args.rest[1:]], env={**child_env(), **clock})


def cmd_cluster(args: argparse.Namespace) -> int:
    """``hvdtrain cluster up|status|down|fetch``: the one-machine Hadoop (hvdtrain/hadoop/minicluster)."""
    spec = minicluster.ClusterSpec(**({"home": args.home} if args.home else {}), start_timeout=args.timeout,
                                   secure=args.secure, hive=args.hive, ha=args.ha, https=args.https,
                                   ports=minicluster.STANDARD_PORTS if args.standard_ports else minicluster.Ports())
    return minicluster.main(args.action, spec, args.json)


def cmd_tune(args: argparse.Namespace) -> int:
    """``hvdtrain tune``: successive halving over training runs (hvdtrain/tune.py owns Optuna)."""
    cfg = config_mod.load(args.config, args.overrides)
    opts = tune.TuneOptions(args.config, tuple(args.overrides), args.space, args.trials, args.parallel, args.np,
                            args.launcher, args.hosts, args.eta, args.min_epochs, args.metric)
    tune.run_study(cfg, opts)
    return 0


def cmd_env_check(args: argparse.Namespace) -> int:
    return envcheck.main()


def cmd_checkpoints(args: argparse.Namespace) -> int:
    """List or verify checkpoints: step, metric, size and status of each."""
    infos = checkpoint.scan(args.dir, verify=args.action == "verify")
    if not infos:
        raise DataError(f"no checkpoints (ckpt-*) under {args.dir}")
    print(checkpoint.to_json(infos) if args.json else checkpoint.describe(infos, args.metric))
    return 0 if args.action == "list" or all(i.valid for i in infos) else DataError.exit_code


def cmd_timeline(args: argparse.Namespace) -> int:
    """``hvdtrain timeline summarize FILE``: time per phase of a recorded Horovod timeline."""
    print(timeline.summarize(args.file))
    return 0


def cmd_check_script(args: argparse.Namespace) -> int:
    """``hvdtrain check-script SCRIPT``: Keras 2 uses that break on Keras 3 (0 none, 1 some, 2 unreadable)."""
    findings = keras3_check.check_file(args.script)
    print("\n".join(keras3_check.report(args.script, findings)))
    return 1 if findings else 0


def cmd_tensorboard(args: argparse.Namespace) -> int:
    """``hvdtrain tensorboard OUTPUT``: TensorBoard on 127.0.0.1 over a training run's events (staged from HDFS)."""
    return tensorboard.serve(args.output, args.port, ready=lambda line: print(line, flush=True))


def cmd_config_show(args: argparse.Namespace) -> int:
    print(config_mod.load(args.config, args.overrides).to_yaml(redacted=True), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand; options and ``key=value`` overrides may come in any order (see :func:`parse_args`)."""
    p = argparse.ArgumentParser(prog="hvdtrain", description="Hive/Spark ETL and Horovod training on Hadoop.",
                                epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    demo = _command(sub, "demo", cmd_demo, "sample Hive table -> ETL -> horovodrun -> MLflow, on embedded defaults")
    _np_option(demo)
    _verbose_option(demo)
    etl = _command(sub, "etl", cmd_etl, "run the Spark/Hive ETL locally (same entry point as spark-submit etl/job.py)")
    etl.add_argument("--master", help="Spark master (default: spark.master from the config)")
    etl.add_argument("--overwrite", action="store_true", help="replace an existing dataset")
    _verbose_option(etl)
    train = _command(sub, "train", cmd_train, "train locally under horovodrun with Gloo")
    _np_option(train, "local ranks (default 2; 1 runs without horovodrun)")
    train.add_argument("--json", action="store_true", help="end with the result document (JSON) on stdout "
                                                           "instead of the summary table")
    train.add_argument("--max-restarts", type=int, metavar="K",
                       help="relaunch after a lost rank, a stall or a storage failure up to K times, resuming from "
                            "the newest checkpoint (fault.max_restarts)")
    train.add_argument("--principal", help="Kerberos principal; with --keytab the ticket is renewed during the job")
    train.add_argument("--keytab", help="keytab for --principal (kinit -kt before the ticket expires)")
    score = _command(sub, "score", cmd_score, "score the config's source with a trained model into a Hive table")
    score.add_argument("--model", help="training output folder, runs:/ID/model, models:/NAME/VERSION|@ALIAS, "
                       "or a registered model name (default score.model)")
    score.add_argument("--output-table", help="Hive table db.name for the predictions (default score.output_table)")
    score.add_argument("--partition", help="k=v[,k=v] to write (default score.partition, else ds=<UTC date>)")
    score.add_argument("--overwrite", action="store_true", help="replace a non-empty partition (atomically)")
    score.add_argument("--master", help="Spark master (default: spark.master from the config)")
    tuning = _command(sub, "tune", cmd_tune, "hyperparameter search: successive halving (Optuna ASHA) over training "
                    "runs, tracked in MLflow; rerun the same command to resume")
    tuning.add_argument("--space", required=True, help="YAML of dotted config key -> {loguniform|uniform|int: "
                      "[low, high]} or {choice: [...]}")
    tuning.add_argument("--trials", type=int, required=True, help="trials in the study (a rerun tops it up)")
    tuning.add_argument("--parallel", type=int, default=1, help="trials running at once (default 1)")
    _np_option(tuning, "ranks per trial (default 2)")
    tuning.add_argument("--launcher", default="local", choices=["local", "horovodrun", "yarn"],
                      help="local: horovodrun on this host; horovodrun: on --hosts; yarn: hvdtrain yarn submit")
    tuning.add_argument("--hosts", help="horovodrun -H for --launcher horovodrun, e.g. host1:2,host2:2")
    tuning.add_argument("--eta", type=int, default=3, help="successive halving keeps 1/eta per rung (default 3)")
    tuning.add_argument("--min-epochs", type=int, default=1, help="epochs before the first pruning rung (default 1)")
    tuning.add_argument("--metric", default=None,
                        help="a validation metric of the task: multiclass validation_accuracy (default), "
                             "validation_macro_f1, validation_roc_auc, validation_loss; binary validation_roc_auc "
                             "(default), validation_pr_auc, validation_log_loss; multilabel validation_micro_f1 "
                             "(default), validation_macro_f1; regression validation_rmse (default), validation_mae, "
                             "validation_r2 (losses and errors are minimized)")
    _command(sub, "config", cmd_config_show, "print the resolved config (after overrides and path resolution)")
    yarn = _command(sub, "yarn", cmd_yarn, "train on a YARN cluster: hvdtrain yarn submit CONFIG --num-workers N ...",
                    config=False, add_help=False)
    yarn.add_argument("rest", nargs=argparse.REMAINDER, help="submit CONFIG [options]; see hvdtrain yarn submit -h")
    cl = _command(sub, "cluster", cmd_cluster, "a one-machine Hadoop (HDFS + YARN, Apache Hadoop's minicluster) for "
                  "tests and trying --master yarn: hvdtrain cluster up|status|down|fetch", config=False)
    cl.add_argument("action", choices=["up", "status", "down", "fetch"],
                    help="fetch: only get the jars with Maven and compile the launcher (what up does first, once)")
    cl.add_argument("--home", help="the cluster's folder (default $HVDTRAIN_CLUSTER_HOME or ~/.hvdtrain/cluster)")
    cl.add_argument("--json", action="store_true", help="print the cluster's details as JSON")
    cl.add_argument("--secure", action="store_true", help="up: Kerberos on every daemon, with a MiniKdc and a keytab "
                    "for the user hvdtrain@EXAMPLE.COM (submit with --principal/--keytab)")
    cl.add_argument("--hive", action="store_true", help="up: a Hive metastore service too (Hive's Thrift server, "
                    "warehouse on HDFS), named by conf/hive-site.xml: jobs with hive.embedded=false use it")
    cl.add_argument("--ha", action="store_true", help="up: HDFS as an HA nameservice (hdfs://hvdtrain): two NameNodes, "
                    "nn1 active and nn2 standby, behind Hadoop's failover proxy; hdfs haadmin -failover nn1 nn2 swaps them")
    cl.add_argument("--https", action="store_true", help="up: HDFS's web servers (WebHDFS) over TLS only "
                    "(dfs.http.policy=HTTPS_ONLY) with a key made for the cluster; the printed export line names its "
                    "CA bundle (REQUESTS_CA_BUNDLE)")
    cl.add_argument("--timeout", type=float, default=300.0, help="seconds `up` waits for the cluster (default 300)")
    cl.add_argument("--standard-ports", action="store_true", help="Hadoop's usual ports (NameNode 8020 and 9870, "
                    "ResourceManager 8032 and 8088, ...) instead of free ones")
    ckpt = _command(sub, "checkpoints", cmd_checkpoints, "list or verify checkpoints in a folder (local or hdfs://)",
                    config=False)
    ckpt.add_argument("action", choices=["list", "verify"], help="verify also checks every checksum")
    ckpt.add_argument("dir", help="checkpoint folder, e.g. work/demo/checkpoints/demo")
    ckpt.add_argument("--metric", default="validation_accuracy", help="metric column to show")
    ckpt.add_argument("--json", action="store_true", help="machine-readable output")
    tl = _command(sub, "timeline", cmd_timeline,
                  "time per phase of a Horovod timeline: hvdtrain timeline summarize FILE", config=False)
    tl.add_argument("action", choices=["summarize"])
    tl.add_argument("file", help="the timeline JSON (train.timeline writes horovod_timeline.json to train.output)")
    run = _command(sub, "run", cmd_run, "run your own Horovod script under horovodrun (Gloo) after check-script: "
                   "hvdtrain run --np N SCRIPT [args...]", config=False)
    _np_option(run, "local ranks (default 2; 1 runs without horovodrun)")
    run.add_argument("--hosts", help="horovodrun -H, e.g. host1:2,host2:2 (default localhost:N)")
    run.add_argument("--max-restarts", type=int, default=0, metavar="K",
                     help="relaunch after a lost rank or a crash up to K times (the script resumes itself)")
    run.add_argument("--start-timeout", type=int, default=120, help="seconds for all ranks to start (default 120)")
    run.add_argument("script", help="your Horovod training script, e.g. train.py")
    run.add_argument("script_args", nargs=argparse.REMAINDER, metavar="...", help="the script's own arguments")
    check = _command(sub, "check-script", cmd_check_script, "list a Horovod/Keras script's Keras 2 uses that break on "
                     "Keras 3, with line numbers and replacements (read, not run); exit 1 when there are any",
                     config=False)
    check.add_argument("script", help="the Python script, e.g. train.py")
    board = _command(sub, "tensorboard", cmd_tensorboard, "TensorBoard on 127.0.0.1 over a training run's event "
                     "files: hvdtrain tensorboard TRAIN_OUTPUT (local or hdfs://, staged locally)", config=False)
    board.add_argument("output", help="the run's train.output folder (or its tensorboard/ folder)")
    board.add_argument("--port", type=int, default=6006, help="port on 127.0.0.1 (default 6006; 0 picks a free one)")
    env = _command(sub, "env", cmd_env_check, "diagnose this host: hvdtrain env check", config=False)
    env.add_argument("what", choices=["check"])
    return p


def _command(sub: Any, name: str, fn: Callable[[argparse.Namespace], int], help_: str, config: bool = True,
             **kwargs: Any) -> argparse.ArgumentParser:
    """A subcommand running ``fn``; with ``config``, it takes CONFIG and ``key=value`` overrides."""
    sp = sub.add_parser(name, help=help_, description=help_, **kwargs)
    if config:
        sp.add_argument("config", help="job YAML, e.g. configs/demo.yaml")
        sp.add_argument("overrides", nargs="*", metavar="key=value",
                        help="config overrides, section.key=value (before, between or after the options)")
    sp.set_defaults(fn=fn, parser=sp)
    return sp


def _np_option(sp: argparse.ArgumentParser, help_: str = "local ranks (default 2)") -> None:
    sp.add_argument("--np", type=int, default=2, help=help_)


def _verbose_option(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("-v", "--verbose", action="store_true",
                    help="show Spark's own log and stage progress bars (else Spark's log goes to a file "
                         "under the job's workdir, named when a step fails)")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parse a command line where options and ``key=value`` overrides come in any order.

    argparse stops filling the ``overrides`` positional at the first option, so what
    follows comes back unparsed: words are more overrides (in order: later ones win),
    anything starting with ``-`` is an unknown option and an error naming it.
    """
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    unknown = [a for a in extra if a.startswith("-") or not hasattr(args, "overrides")]
    if unknown:
        args.parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    if getattr(args, "np", 1) < 1:
        args.parser.error(f"--np must be >= 1 (got {args.np})")
    if getattr(args, "max_restarts", None) is not None and args.max_restarts < 0:
        args.parser.error(f"--max-restarts must be >= 0 (got {args.max_restarts})")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    secrets.private_files()  # inherited by every step: checkpoints, logs, stores are the user's only
    secrets.protect_logging()
    try:
        return args.fn(args)
    except HvdtrainError as exc:
        return console.print_error(exc, "hvdtrain")
    except KeyboardInterrupt:
        print("hvdtrain: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
