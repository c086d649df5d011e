"""Run a user's own Horovod script on YARN: the same submission as ``hvdtrain yarn submit``.

    python -m yarn.run [--config CONFIG] [--set KEY=VALUE ...] --num-workers N [--gpus-per-worker G]
        [--queue Q] [--principal P --keytab K] [--master yarn|local[N]] [--max-restarts K] [--output DIR]
        [--dry-run] SCRIPT [ARGS ...]

(also ``hvdtrain yarn run ...``). What ``yarn submit`` does for hvdtrain's trainer
(:mod:`yarn.submit`: the packed environment, the code zip, ``yarn.env``, Kerberos, queue, GPU
resources, ``--dry-run``, the application released on an error or Ctrl-C, ``--max-restarts``
inside the application) it does here for any script: the script's folder is zipped and shipped
with ``--files``; every rank (:func:`yarn.executor.run_script`) unpacks it and runs
``python SCRIPT ARGS`` from there with the environment Horovod sets for a rank, its output written as it
comes to ``rank<N>.log`` in the container's log folder (YARN's log aggregation keeps it, a killed container's
too) and copied to ``<output>/logs/rank<N>.log`` when the script ends. The command's exit code is the worst
rank's. The config (optional) supplies the ``yarn:`` and ``fault:`` blocks; the script is checked for Keras 2 uses first
(:mod:`hvdtrain.model.keras3_check`).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import zipfile
from typing import Any, Optional, Sequence

from hvdtrain.core import config as config_mod
from hvdtrain.core.config import JobConfig
from hvdtrain.core.errors import ANY_ERROR, ConfigError, StepFailed
from hvdtrain.hadoop import fs
from hvdtrain.model import keras3_check
from yarn import submit

MAX_FOLDER_BYTES = 200 << 20  # a script's folder is code; data belongs on HDFS


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hvdtrain yarn run", description="Run your own Horovod script on YARN: "
                                "spark-submit running horovod.spark.run on N executors, each running the script.")
    p.add_argument("--config", help="job YAML whose yarn: and fault: blocks apply (default: built-in defaults)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="config override, e.g. --set yarn.executor_memory=4g (repeatable)")
    p.add_argument("--output", help="where rank logs and the job record go, local or hdfs:// "
                                    "(default <workdir>/script-runs/<name>-<UTC time>)")
    submit.add_submission_flags(p)
    p.add_argument("script", help="your Horovod training script; its folder is shipped with it")
    p.add_argument("script_args", nargs=argparse.REMAINDER, metavar="...", help="the script's own arguments")
    return p.parse_args(argv)


def job_name(script: str) -> str:
    """A config name from the script's file name (pure): ``train-v2.py`` -> ``train-v2``."""
    stem = re.sub(r"[^A-Za-z0-9_-]", "_", os.path.splitext(os.path.basename(script))[0])
    return stem if stem[:1].isalpha() else f"script_{stem}"


def load_config(args: argparse.Namespace, overrides: list[str]) -> JobConfig:
    """The job config: ``--config`` with overrides, else defaults named after the script."""
    if args.config:
        return config_mod.load(args.config, overrides)
    data: dict[str, Any] = {"name": job_name(args.script), "tracking": {"enabled": False}}
    for item in overrides:
        config_mod.apply_override(data, item)
    return config_mod.from_dict(data, base_dir=os.getcwd())


def folder_files(folder: str) -> list[tuple[str, str]]:
    """(absolute path, path in the zip) of every file under ``folder``, hidden and cache folders left out."""
    out = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
        out += [(os.path.join(root, name), os.path.relpath(os.path.join(root, name), folder).replace(os.sep, "/"))
                for name in sorted(files) if not name.startswith(".")]
    return out


def zip_folder(folder: str, output: str, limit: int = MAX_FOLDER_BYTES) -> str:
    """Zip the script's folder (refused over ``limit`` bytes, naming the folder)."""
    files = folder_files(folder)
    size = sum(os.path.getsize(path) for path, _ in files)
    if size > limit:
        raise ConfigError("SCRIPT", folder, f"is the script's folder, shipped to every rank, and holds "
                          f"{size / 2**20:.0f} MB (limit {limit / 2**20:.0f} MB): put the script in a folder of its "
                          "own and read data from HDFS")
    with zipfile.ZipFile(output, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for path, arcname in files:
            zf.write(path, arcname)
    return output


def script_summary(uri: str) -> tuple[int, str]:
    """The job's exit code and a line per rank, from the driver's record (``yarn_result.json``)."""
    try:
        doc = json.loads(fs.read_bytes(uri))
    except ANY_ERROR as exc:  # the record is missing when the job never started
        return 0, f"hvdtrain: could not read the job record {uri} ({exc})"
    ranks = doc.get("ranks", [])
    code = max((int(r.get("exit_code", 0)) for r in ranks), default=0)
    lines = [f"  rank {r.get('rank')} on {r.get('host')}: exit {r.get('exit_code')}, log {r.get('log')}"
             + (f" (as written: yarn logs -containerId {r['container']} -log_files {r['container_log']})"
                if r.get("container_log") and r.get("container") else "") for r in ranks]
    return code, "\n".join([f"hvdtrain: the script ran on {len(ranks)} rank(s); record: {uri}", *lines])


def run(args: argparse.Namespace, deps: submit.Collaborators) -> int:
    script = os.path.abspath(keras3_check.script_path(args.script))
    keras3_check.print_findings(args.script, sys.stderr)
    cfg, build = submit.prepare(args, deps, lambda overrides: load_config(args, overrides))
    output = args.output or fs.join(cfg.workdir, "script-runs", f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    with submit.staged_inputs(cfg, args, deps, build, "run") as inputs:
        job = submit.ScriptJob(os.path.join(os.path.dirname(inputs.code_zip), "script.zip"),
                               os.path.basename(script), tuple(args.script_args), output)
        plan = submit.build_plan(cfg, args.master, inputs, script=job)
        if not args.dry_run:
            zip_folder(os.path.dirname(script), job.zip_path)
        try:
            launched = submit.launch(cfg, plan, inputs, args, deps, job=f" of {args.script}")
        except StepFailed as exc:
            code, summary = script_summary(plan.result_uri)
            print(summary, file=deps.out)
            if code:
                print(f"hvdtrain: error: {args.script} failed (the worst rank exited {code})", file=sys.stderr)
                return code
            raise exc
    if not launched:
        return 0
    code, summary = script_summary(plan.result_uri)
    print(summary, file=deps.out)
    return code


def main(argv: Optional[Sequence[str]] = None, deps: Optional[submit.Collaborators] = None) -> int:
    return submit.guarded(run, parse_args(argv), deps or submit.Collaborators())


if __name__ == "__main__":
    sys.exit(main())
