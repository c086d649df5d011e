"""``hvdtrain`` command line: demo, etl, train, yarn, checkpoints, env, config.

The ETL runs in its own process (``python -m etl.job``, the same entry point
spark-submit runs), and local training under ``horovodrun``; this module only
builds those commands (pure functions) and runs them. It never imports ``etl``
or ``yarn``, which import ``hvdtrain``.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import shlex
import subprocess
import sys
from typing import Mapping, Optional, Sequence

from hvdtrain import checkpoint, supervise
from hvdtrain import config as config_mod
from hvdtrain import fs
from hvdtrain.errors import HvdtrainError


def _bin(name: str) -> str:
    """A console script installed beside this interpreter (the project venv)."""
    candidate = os.path.join(os.path.dirname(sys.executable), name)
    return candidate if os.path.exists(candidate) else name


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    # The repo root on the path, so `-m etl.job` works from a source checkout too.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def etl_command(config_path: str, overrides: Sequence[str], master: Optional[str], overwrite: bool,
                create_sample_table: bool = False) -> list[str]:
    cmd = [sys.executable, "-m", "etl.job", "--config", config_path]
    if master:
        cmd += ["--master", master]
    if overwrite:
        cmd.append("--overwrite")
    if create_sample_table:
        cmd.append("--create-sample-table")
    return cmd + list(overrides)


def train_command(config_path: str, overrides: Sequence[str], np: int, start_timeout: int = 120) -> list[str]:
    """``horovodrun -np N -H localhost:N --gloo --start-timeout S python -m hvdtrain.train ...``
    (or plain python for N=1)."""
    train = [sys.executable, "-m", "hvdtrain.train", config_path, *overrides]
    if np == 1:
        return train
    return [_bin("horovodrun"), "-np", str(np), "-H", f"localhost:{np}", "--gloo",
            "--start-timeout", str(start_timeout), *train]


def _run(cmd: list[str], what: str) -> None:
    print(f"$ {shlex.join(cmd)}", flush=True)
    rc = subprocess.call(cmd, env=child_env())
    if rc != 0:
        raise HvdtrainError(f"{what} failed (exit code {rc}); see the messages above")


def _run_once(cmd: list[str], extra_env: Mapping[str, str]) -> tuple[int, str]:
    """One try of a job: its output passes through, the last lines are kept for :func:`supervise.classify`."""
    print(f"$ {shlex.join(cmd)}", flush=True)
    tail: collections.deque[str] = collections.deque(maxlen=400)
    with subprocess.Popen(cmd, env={**child_env(), **extra_env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, bufsize=1) as proc:
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            tail.append(line)
    return proc.returncode, "".join(tail)


def _train_with_restarts(cfg: config_mod.JobConfig, cmd: list[str]) -> None:
    """Run training, relaunching it after a lost rank, a stall or a storage failure (``fault.max_restarts``)."""
    if cfg.fault.max_restarts == 0:
        _run(cmd, "training")
        return
    outcome = supervise.run_with_restarts(
        lambda env: _run_once(cmd, env), cfg.fault.max_restarts,
        resume_step=lambda: checkpoint.newest_step(cfg.checkpoint.dir) if cfg.checkpoint.enabled else None,
        wait=lambda attempt: supervise.backoff(attempt, cfg.fault.restart_backoff))
    if outcome.code != 0:
        failure = outcome.failure
        raise HvdtrainError(f"training failed after {len(outcome.restarts)} restart(s): {failure.cause}"
                            f"{f' on rank {failure.rank}' if failure.rank is not None else ''}"
                            f" (exit code {outcome.code}); see the messages above")


def cmd_etl(args: argparse.Namespace) -> int:
    cfg = config_mod.load(args.config, args.overrides)
    _run(etl_command(args.config, args.overrides, args.master or cfg.spark.master, args.overwrite), "ETL")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    overrides = [*args.overrides, *train_flag_overrides(args, os.getcwd())]
    cfg = config_mod.load(args.config, overrides)  # fail on a bad config before launching ranks
    _train_with_restarts(cfg, train_command(args.config, overrides, args.np, cfg.fault.start_timeout))
    return 0


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
        raise HvdtrainError(f"{args.config} has no source.sample block; the demo generates its data from it")
    _run(etl_command(args.config, args.overrides, cfg.spark.master, overwrite=True, create_sample_table=True),
         "ETL")
    if cfg.checkpoint.enabled and fs.exists(cfg.checkpoint.dir):  # new data: a new run, not a resume
        print(f"demo: removing the previous demo run's checkpoints in {cfg.checkpoint.dir}", flush=True)
        fs.delete(cfg.checkpoint.dir)
    _run(train_command(args.config, args.overrides, args.np, cfg.fault.start_timeout), "training")
    print(demo_summary(cfg))
    return 0


def demo_summary(cfg: config_mod.JobConfig) -> str:
    """Where every output of the demo is, and how well it did."""
    from hvdtrain import fs, manifest

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
        ("MLflow", f"run {result.get('run_id')} at {result.get('tracking_uri')}"),
        ("ranks", f"{result.get('world_size')}; weights identical on every rank: {result.get('ranks_agree')}"),
        ("test accuracy", f"{result['test_accuracy']:.4f}"
         + (f" (best possible ~{ceiling:.4f} with {m.source['sample']['label_noise']:.0%} label noise)"
            if ceiling else "")),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(["", "demo finished:"] + [f"  {k:<{width}}  {v}" for k, v in rows])


def cmd_yarn(args: argparse.Namespace) -> int:
    """``hvdtrain yarn submit ...``: the launcher lives in yarn/ (which imports hvdtrain), so run it."""
    if not args.rest or args.rest[0] != "submit":
        raise HvdtrainError("usage: hvdtrain yarn submit CONFIG --num-workers N [--gpus-per-worker G] [--queue Q] "
                            "[--principal P --keytab K] [--master M] [--dry-run]")
    return subprocess.call([sys.executable, "-m", "yarn.submit", *args.rest[1:]], env=child_env())


def cmd_env_check(args: argparse.Namespace) -> int:
    from hvdtrain import envcheck

    return envcheck.main()


def cmd_checkpoints(args: argparse.Namespace) -> int:
    """List or verify checkpoints: step, metric, size and status of each."""
    from hvdtrain import checkpoint

    infos = checkpoint.scan(args.dir, verify=args.action == "verify")
    if not infos:
        raise HvdtrainError(f"no checkpoints (ckpt-*) under {args.dir}")
    print(checkpoint.to_json(infos) if args.json else checkpoint.describe(infos, args.metric))
    return 0 if args.action == "list" or all(i.valid for i in infos) else 1


def cmd_timeline(args: argparse.Namespace) -> int:
    """``hvdtrain timeline summarize FILE``: time per phase of a recorded Horovod timeline."""
    from hvdtrain import timeline

    print(timeline.summarize(args.file))
    return 0


def cmd_config_show(args: argparse.Namespace) -> int:
    print(config_mod.load(args.config, args.overrides).to_yaml(), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hvdtrain", description="Hive/Spark ETL and Horovod training on Hadoop.")
    sub = p.add_subparsers(dest="command", required=True)

    def with_config(name: str, help_: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_)
        sp.add_argument("config", help="job YAML, e.g. configs/demo.yaml")
        sp.add_argument("overrides", nargs="*", help="config overrides, section.key=value")
        return sp

    demo = with_config("demo", "sample Hive table -> ETL -> horovodrun -> MLflow, on embedded defaults")
    demo.add_argument("--np", type=int, default=2, help="local ranks (default 2)")
    demo.set_defaults(fn=cmd_demo)
    etl = with_config("etl", "run the Spark/Hive ETL locally (same entry point as spark-submit etl/job.py)")
    etl.add_argument("--master", help="Spark master (default: spark.master from the config)")
    etl.add_argument("--overwrite", action="store_true", help="replace an existing dataset")
    etl.set_defaults(fn=cmd_etl)
    train = with_config("train", "train locally under horovodrun with Gloo")
    train.add_argument("--np", type=int, default=2, help="local ranks (default 2; 1 runs without horovodrun)")
    train.add_argument("--max-restarts", type=int, metavar="K",
                       help="relaunch after a lost rank, a stall or a storage failure up to K times, resuming from "
                            "the newest checkpoint (fault.max_restarts)")
    train.add_argument("--principal", help="Kerberos principal; with --keytab the ticket is renewed during the job")
    train.add_argument("--keytab", help="keytab for --principal (kinit -kt before the ticket expires)")
    train.set_defaults(fn=cmd_train)
    show = with_config("config", "print the resolved config (after overrides and path resolution)")
    show.set_defaults(fn=cmd_config_show)
    yarn = sub.add_parser("yarn", help="train on a YARN cluster: hvdtrain yarn submit CONFIG --num-workers N ...",
                          add_help=False)
    yarn.add_argument("rest", nargs=argparse.REMAINDER, help="submit CONFIG [options]; see hvdtrain yarn submit -h")
    yarn.set_defaults(fn=cmd_yarn)
    ckpt = sub.add_parser("checkpoints", help="list or verify checkpoints in a folder (local or hdfs://)")
    ckpt.add_argument("action", choices=["list", "verify"], help="verify also checks every checksum")
    ckpt.add_argument("dir", help="checkpoint folder, e.g. work/demo/checkpoints/demo")
    ckpt.add_argument("--metric", default="validation_accuracy", help="metric column to show")
    ckpt.add_argument("--json", action="store_true", help="machine-readable output")
    ckpt.set_defaults(fn=cmd_checkpoints)
    tl = sub.add_parser("timeline", help="time per phase of a Horovod timeline: hvdtrain timeline summarize FILE")
    tl.add_argument("action", choices=["summarize"])
    tl.add_argument("file", help="the timeline JSON (train.timeline writes horovod_timeline.json to train.output)")
    tl.set_defaults(fn=cmd_timeline)
    env = sub.add_parser("env", help="diagnose this host: hvdtrain env check")
    env.add_argument("what", choices=["check"])
    env.set_defaults(fn=cmd_env_check)
    return p


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "np", 1) < 1:
        print(f"hvdtrain: error: --np must be >= 1 (got {args.np})", file=sys.stderr)
        return 2
    try:
        return args.fn(args)
    except HvdtrainError as exc:
        print(f"hvdtrain: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hvdtrain: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
