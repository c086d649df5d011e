"""Where scaling_np2 and hvd_overhead time goes: Horovod's knobs, interleaved A/B runs (a by-hand study).

    python -m benchmarks.np2_knobs [REPS] [STEPS]

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

from benchmarks.launch import horovodrun, plain

NP2_VARIANTS = {
    "default": {},
    "cycle 0.1 ms": {"HOROVOD_CYCLE_TIME": "0.1"},
    "cycle 5 ms": {"HOROVOD_CYCLE_TIME": "5"},
    "no fusion": {"HOROVOD_FUSION_THRESHOLD": "0"},
    "pinned": "pin",  # each rank on its own core, against a 1-rank run pinned to one core
}
NP1_VARIANTS = {"default": {}, "cycle 5 ms": {"HOROVOD_CYCLE_TIME": "5"}}


def main() -> None:
    from hvdtrain.synthetic import Layout, TextSpec, make_text_dataset

    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    steps = sys.argv[2] if len(sys.argv) > 2 else "50"
    root = tempfile.mkdtemp(prefix="np2-knobs-")
    runs: dict[str, list[float]] = {}
    try:
        make_text_dataset(root, TextSpec(layout=Layout(n_per_split={"train": 8192, "validation": 64, "test": 64},
                                                       shards_per_split=4), num_classes=4, max_length=64,
                                         vocab_size=2000, seed=3))
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
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for name, values in runs.items():
        print(f"{name:<28} median {statistics.median(values):.3f}  ({min(values):.3f}-{max(values):.3f})  "
              f"{json.dumps([round(v, 3) for v in values])}")


if __name__ == "__main__":
    main()
