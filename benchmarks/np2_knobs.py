"""Where scaling_np2, hvd_overhead and train_vs_mwms time goes: Horovod's knobs, interleaved runs (by hand).

    python -m benchmarks.np2_knobs [REPS] [STEPS]          scaling_np2 and hvd_overhead
    python -m benchmarks.np2_knobs mwms [REPS] [STEPS]     train_vs_mwms: each hvdtrain variant at 2 ranks
                                                           against the MWMS run of the same repetition

Runs bench_training's worker in every variant once per repetition, in the same order each time, and
prints the median (min-max) of each figure with the load average before each repetition.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile

from benchmarks.launch import horovodrun, plain, tf_workers

NP2_VARIANTS = {
    "default": {},
    "cycle 0.1 ms": {"HOROVOD_CYCLE_TIME": "0.1"},
    "cycle 5 ms": {"HOROVOD_CYCLE_TIME": "5"},
    "no fusion": {"HOROVOD_FUSION_THRESHOLD": "0"},
    "pinned": "pin",  # each rank on its own core, against a 1-rank run pinned to one core
}
NP1_VARIANTS = {"default": {}, "cycle 5 ms": {"HOROVOD_CYCLE_TIME": "5"}}
# (environment, worker flags) of hvdtrain's step at 2 ranks, each against MWMS at 2 workers
MWMS_VARIANTS: dict[str, tuple[dict[str, str], list[str]]] = {
    "default": ({}, []),
    "cycle 5 ms": ({"HOROVOD_CYCLE_TIME": "5"}, []),
    "response cache off": ({"HOROVOD_CACHE_CAPACITY": "0"}, []),
    "no fusion": ({"HOROVOD_FUSION_THRESHOLD": "0"}, []),
    "overlap": ({}, ["--allreduce", "overlap"]),
    "fp16 all-reduce": ({}, ["--fp16"]),
}


def main() -> None:
    from hvdtrain.data.synthetic import Layout, TextSpec, make_text_dataset

    argv = sys.argv[1:]
    study = mwms_study if argv[:1] == ["mwms"] else np2_study
    argv = argv[1:] if study is mwms_study else argv
    reps = int(argv[0]) if argv else 3
    steps = argv[1] if len(argv) > 1 else "50"
    root = tempfile.mkdtemp(prefix="np2-knobs-")
    runs: dict[str, list[float]] = {}
    try:
        make_text_dataset(root, TextSpec(layout=Layout(n_per_split={"train": 8192, "validation": 64, "test": 64},
                                                       shards_per_split=4), num_classes=4, max_length=64,
                                         vocab_size=2000, seed=3))
        study(root, reps, steps, runs)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for name, values in runs.items():
        print(f"{name:<36} median {statistics.median(values):.3f}  ({min(values):.3f}-{max(values):.3f})  "
              f"{json.dumps([round(v, 3) for v in values])}")


def mwms_study(root: str, reps: int, steps: str, runs: dict[str, list[float]]) -> None:
    """hvdtrain's step at 2 ranks in each variant over MWMS at 2 workers, one MWMS run per repetition."""
    for _ in range(reps):
        runs.setdefault("loadavg", []).append(os.getloadavg()[0])
        mwms = tf_workers(2, "benchmarks.mwms_worker", [root, steps, "--threads", "1"])["samples_per_sec"]
        runs.setdefault("mwms samples/s", []).append(mwms)
        for name, (env, flags) in MWMS_VARIANTS.items():
            hvd = horovodrun(2, "benchmarks.train_worker", [root, "hvd", steps, "--threads", "1", *flags], env=env)
            runs.setdefault(f"train_vs_mwms {name}", []).append(hvd["samples_per_sec"] / mwms)
            print(f"train_vs_mwms {name}: {runs[f'train_vs_mwms {name}'][-1]:.3f}", flush=True)


def np2_study(root: str, reps: int, steps: str, runs: dict[str, list[float]]) -> None:
    """scaling_np2 variants at 2 ranks against 1 rank, and hvd_overhead variants against model.fit."""
    for _ in range(reps):
        runs.setdefault("loadavg", []).append(os.getloadavg()[0])
        print(f"loadavg {os.getloadavg()}", flush=True)
        one = horovodrun(1, "benchmarks.train_worker", [root, "hvd", steps, "--threads", "1"])
        one_pinned = horovodrun(1, "benchmarks.train_worker", [root, "hvd", steps, "--threads", "1", "--pin"])
        runs.setdefault("np1 samples/s", []).append(one["samples_per_sec"])
        runs.setdefault("np1 pinned samples/s", []).append(one_pinned["samples_per_sec"])
        for name, env in NP2_VARIANTS.items():
            pin = env == "pin"
            two = horovodrun(2, "benchmarks.train_worker", [root, "hvd", steps, "--threads", "1",
                                                            *(["--pin"] if pin else [])], env=None if pin else env)
            runs.setdefault(f"scaling_np2 {name}", []).append(
                two["samples_per_sec"] / (2 * (one_pinned if pin else one)["samples_per_sec"]))
            print(f"scaling_np2 {name}: {runs[f'scaling_np2 {name}'][-1]:.3f}", flush=True)
        keras_fit = plain("benchmarks.train_worker", [root, "keras", steps])["samples_per_sec"]
        for name, env in NP1_VARIANTS.items():
            np1 = horovodrun(1, "benchmarks.train_worker", [root, "hvd", steps], env=env)
            runs.setdefault(f"hvd_overhead {name}", []).append(np1["samples_per_sec"] / keras_fit)
            print(f"hvd_overhead {name}: {runs[f'hvd_overhead {name}'][-1]:.3f}", flush=True)


if __name__ == "__main__":
    main()
