"""``make bench-gpu``: NCCL all-reduce, mixed-precision throughput and scaling on the host's GPUs.

    python -m benchmarks.gpu [--quick] [--out DIR]

On a host with CUDA GPUs visible to TensorFlow and Horovod built with NCCL
(``HOROVOD_GPU_OPERATIONS=NCCL``), one process per GPU under ``horovodrun``:

gpu_allreduce_nccl   NCCL bus bandwidth at 64 MB / Gloo's on host tensors between the same ranks
gpu_bfloat16         samples/s per GPU under mixed_bfloat16 / float32, all GPUs
gpu_float16          samples/s per GPU under mixed_float16 (loss scaling) / float32, all GPUs
gpu_scaling          samples/s on all GPUs / (GPUs x one GPU), under bfloat16

Repetitions are interleaved, ratios reported as min/median/max. Writes
DIR/latest.json (the format of ``make bench``), latest.md and charts. Without
a GPU it prints one line saying so and exits 3 (no figure is made up).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from typing import Optional

from benchmarks.common import Entry, interleaved_results, markdown_table, write_reports
from benchmarks.launch import horovodrun

NO_GPU_EXIT = 3
DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "gpu")


def gpu_problem(gpus: int, nccl_built: bool) -> Optional[str]:
    """Why the GPU benchmark cannot run here (one line naming the fix), or None."""
    if gpus == 0:
        return ("bench-gpu: no CUDA GPU is visible here (no NVIDIA driver, or TensorFlow lists no GPU); run it on a "
                "host with NVIDIA GPUs after `HOROVOD_GPU_OPERATIONS=NCCL make env` and "
                "`HVDTRAIN_TF=gpu pip install -e '.[gpu]'` (the CUDA TensorFlow build)")
    if not nccl_built:
        return (f"bench-gpu: {gpus} GPU(s) found but Horovod was built without NCCL (nccl_built() is false); "
                "rebuild it with `HOROVOD_GPU_OPERATIONS=NCCL make env`")
    return None


def nvidia_present() -> bool:
    """An NVIDIA driver on this host (checked before importing TensorFlow, which is slow and talkative)."""
    return os.path.exists("/dev/nvidiactl") or shutil.which("nvidia-smi") is not None


def probe() -> tuple[int, bool]:
    """(GPUs TensorFlow sees, whether Horovod has NCCL)."""
    if not nvidia_present():
        return 0, False
    import tensorflow as tf

    gpus = len(tf.config.list_physical_devices("GPU"))
    if not gpus:
        return 0, False
    import horovod.tensorflow as hvd

    return gpus, bool(hvd.nccl_built())


def measure(gpus: int, quick: bool, extra: dict) -> list[Entry]:
    from hvdtrain.data.synthetic import Layout, TextSpec, make_text_dataset

    reps, steps = (1, "20") if quick else (5, "200")
    root = tempfile.mkdtemp(prefix="bench-gpu-")
    try:
        make_text_dataset(root, TextSpec(layout=Layout(n_per_split={"train": 65536, "validation": 64, "test": 64},
                                                       shards_per_split=max(8, gpus)), num_classes=4,
                                         max_length=128, vocab_size=30000, seed=3))

        def train(np_: int, precision: str):
            return lambda: horovodrun(np_, "benchmarks.gpu_worker", ["train", root, precision, steps])

        precisions = interleaved_results({p: train(gpus, p) for p in ("none", "bfloat16", "float16")}, reps)
        scaling = interleaved_results({"one": train(1, "bfloat16"), "all": train(gpus, "bfloat16")}, reps)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    per_gpu = {k: [r["samples_per_sec_per_gpu"] for r in v] for k, v in {**precisions, **scaling}.items()}
    notes = {"gpus": gpus, "batch_per_gpu": 128, "steps": int(steps), "reps": reps}
    entries = [
        Entry.paired("gpu_bfloat16", per_gpu["bfloat16"], "samples/s/GPU", "float32", per_gpu["none"], None,
                     notes=notes),
        Entry.paired("gpu_float16", per_gpu["float16"], "samples/s/GPU", "float32", per_gpu["none"], None,
                     notes=notes),
        # per GPU at N / per GPU at 1 = (samples/s at N) / (N x samples/s at 1)
        Entry.paired("gpu_scaling", per_gpu["all"], "samples/s/GPU", "one GPU alone", per_gpu["one"], 0.9,
                     notes={**notes, "precision": "bfloat16"}),
    ]
    if gpus >= 2:
        bw = horovodrun(gpus, "benchmarks.gpu_worker", ["allreduce", *(["--quick"] if quick else [])])
        entries.insert(0, Entry.paired("gpu_allreduce_nccl", bw["busbw_gbps"]["gpu"], "GB/s",
                                       f"Gloo on host tensors, {bw['bytes'] >> 20} MB", bw["busbw_gbps"]["host"],
                                       None, notes={"gpus": gpus, "bytes": bw["bytes"]}))
    return entries


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks.gpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes")
    p.add_argument("--out", default=DEFAULT_OUT, help="results folder")
    args = p.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    gpus, nccl = probe()
    problem = gpu_problem(gpus, nccl)
    if problem:
        print(problem, file=sys.stderr)
        return NO_GPU_EXIT
    extra: dict = {"quick": args.quick, "errors": {}, "gpus": gpus}
    entries = measure(gpus, args.quick, extra)
    paths = write_reports(entries, args.out, extra)
    print(markdown_table(entries))
    print("\n".join(f"[bench-gpu] wrote {p}" for p in paths.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
