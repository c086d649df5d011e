"""launch_overhead: seconds from starting a 2-rank job to its first training step, against a plain process.

The job is ``horovodrun -np 2`` of the benchmark worker; the baseline is the same worker as one plain process
(no launcher, no Horovod), in interleaved pairs. Beside it, ``hvdtrain train --np 2`` of a tiny job is run
``reps`` times and its ranks' start-up breakdown (:mod:`hvdtrain.runtime.startup`: launcher, interpreter and imports,
rendezvous, data plan, tracking, model build, first step) is reported, phase by phase, as the median over
the runs: where the time to the first step goes in the product's own path.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

from benchmarks.common import Entry
from benchmarks.launch import ROOT, horovodrun, plain


def run(quick: bool, extra: dict) -> list[Entry]:
    reps = 1 if quick else 5
    root = tempfile.mkdtemp(prefix="bench-launch-")
    try:
        job, data = tiny_job(root)
        launch_hvd, launch_plain, loads = [], [], []
        for _ in range(reps):
            loads.append(round(os.getloadavg()[0], 1))
            start = time.time()
            launch_hvd.append(horovodrun(2, "benchmarks.train_worker", [data, "hvd", "1"])["first_step_at"] - start)
            start = time.time()
            launch_plain.append(plain("benchmarks.train_worker", [data, "hvd", "1"])["first_step_at"] - start)
        breakdowns = [hvdtrain_startup(job, os.path.join(root, "work", "runs", "launch"), i) for i in range(reps)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    hvd_s, plain_s = statistics.median(launch_hvd), statistics.median(launch_plain)
    return [Entry("launch_overhead", hvd_s, "s", "plain process to first step", plain_s, 1.5, lower_is_better=True,
                  notes={"overhead_s": round(hvd_s - plain_s, 2), "np": 2, "reps": reps, "load_before": loads,
                         "hvd_s_min_max": [round(min(launch_hvd), 2), round(max(launch_hvd), 2)],
                         "plain_s_min_max": [round(min(launch_plain), 2), round(max(launch_plain), 2)],
                         "hvdtrain_train_np2_startup_median_s": median_phases(breakdowns)})]


def tiny_job(root: str, **sections: Any) -> tuple[str, str]:
    """A small text dataset and a 1-epoch job on it under ``root`` (``sections`` added to the config, e.g.
    ``yarn``); returns (the job's YAML, the dataset)."""
    from hvdtrain.core import config
    from hvdtrain.data.synthetic import Layout, TextSpec, make_text_dataset

    data = os.path.join(root, "data")
    make_text_dataset(data, TextSpec(layout=Layout(
        n_per_split={"train": 2048, "validation": 64, "test": 64}, shards_per_split=4), num_classes=4,
        max_length=64, vocab_size=2000, seed=3))
    job = os.path.join(root, "job.yaml")
    with open(job, "w") as fh:
        fh.write(config.from_dict({
            "name": "launch", "workdir": os.path.join(root, "work"), "source": {"table": "demo.reviews"},
            "etl": {"output": data}, "train": {"epochs": 1, "batch_size": 64, "progress": "log"},
            "monitoring": {"enabled": False}, **sections,
        }, base_dir=root).to_yaml())
    return job, data


def median_phases(breakdowns: list[dict[str, float]]) -> dict[str, float]:
    """The median of each start-up phase over runs (phases of the first run)."""
    return {name: round(statistics.median(b.get(name, 0.0) for b in breakdowns), 2) for name in breakdowns[0]}


LOCAL_NP2 = (("train",), ("--np", "2"))  # hvdtrain train JOB --np 2


def hvdtrain_startup(job: str, output: str, attempt: int, how: tuple[tuple[str, ...], tuple[str, ...]] = LOCAL_NP2,
                     env: Optional[dict[str, str]] = None) -> dict[str, float]:
    """``hvdtrain <how[0]> JOB <how[1]>`` (default ``train JOB --np 2``; a new output each time, MLflow's store
    created once), with ``env`` added; its ranks' start-up breakdown."""
    command, flags = how
    cmd = [os.path.join(os.path.dirname(sys.executable), "hvdtrain"), *command, job, *flags,
           f"train.output={output}-{attempt}", f"checkpoint.dir={output}-{attempt}-ckpt"]
    proc = subprocess.run(cmd, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": ROOT, **(env or {})},
                          cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    with open(os.path.join(f"{output}-{attempt}", "eval_report.json")) as fh:
        return json.load(fh)["startup"]
