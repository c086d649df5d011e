"""train_vs_mwms: hvdtrain at 2 ranks vs TensorFlow's MultiWorkerMirroredStrategy at 2 workers.

Both sides train the benchmark transformer of ``bench_training`` on the same
shards with the same input pipeline, per-rank batch (64) and thread budget
(1 intra-op, 1 inter-op, 1 tf.data thread per process): hvdtrain's step under
``horovodrun -np 2 --gloo`` (``train_worker``) against the same step under
``strategy.run`` on 2 local TF_CONFIG workers with ring collectives
(``mwms_worker``). hvdtrain's ranks start with the malloc setting its launcher
gives them (``MALLOC_TOP_PAD_``, :func:`hvdtrain.runtime.launch.malloc_env`); the peer runs
as a user would start it, and a third arm gives it the same setting
(``notes.ratio_to_mwms_same_malloc``). Launches alternate (hvdtrain, MWMS, MWMS
with the setting, hvdtrain, ...); the ratio is reported as min/median/max over the pairs.
"""
from __future__ import annotations

import os
import shutil
import statistics
import tempfile

from benchmarks.common import Entry, interleaved_results
from benchmarks.launch import horovodrun, tf_workers
from hvdtrain.core.config import TrainConfig
from hvdtrain.runtime.launch import malloc_env

FIT_NOTE = ("Keras 3 model.fit on MWMS's distributed dataset fails on TensorFlow 2.21, so the peer is the "
            "custom loop TensorFlow documents for MWMS (strategy.run + GradientTape)")


MODEL_SIZES = {"train_vs_mwms": "demo", "train_vs_mwms_large": "large"}  # large: about 10x the parameters


def run(quick: bool, extra: dict) -> list[Entry]:
    from hvdtrain.data.synthetic import Layout, TextSpec, make_text_dataset

    steps, reps = ("16", 1) if quick else ("96", 5)  # a multiple of train.steps_per_call
    root = tempfile.mkdtemp(prefix="bench-mwms-")
    fit: list[str] = []
    try:
        make_text_dataset(root, TextSpec(layout=Layout(n_per_split={"train": 8192, "validation": 64, "test": 64},
                                                       shards_per_split=4), num_classes=4, max_length=64,
                                         vocab_size=2000, seed=3))
        sizes = {k: v for k, v in MODEL_SIZES.items() if not quick or v == "demo"}  # --quick: the demo size only
        return [paired_entry(name, model, root, steps, reps, fit) for name, model in sizes.items()]
    finally:
        shutil.rmtree(root, ignore_errors=True)


def paired_entry(name: str, model: str, root: str, steps: str, reps: int, fit: list[str]) -> Entry:
    """hvdtrain (default train.steps_per_call) and MWMS at 2 ranks, ``reps`` interleaved pairs; the load
    average before each pair in the notes."""
    per_call = str(TrainConfig().steps_per_call)
    loads: list[float] = []

    def hvd() -> dict:
        loads.append(round(os.getloadavg()[0], 1))
        return horovodrun(2, "benchmarks.train_worker", [root, "hvd", steps, "--threads", "1", "--model", model,
                                                          "--steps-per-call", per_call])

    def mwms() -> dict:
        result = tf_workers(2, "benchmarks.mwms_worker", [root, steps, "--threads", "1", "--model", model,
                                                         *([] if fit else ["--try-fit"])])
        if not fit:  # the model.fit attempt runs once, in the first MWMS launch
            fit.append(result["model_fit"])
        return result

    def mwms_same_malloc() -> dict:  # the peer given the malloc setting hvdtrain gives its ranks
        return tf_workers(2, "benchmarks.mwms_worker", [root, steps, "--threads", "1", "--model", model],
                          env=malloc_env({}))

    runs = interleaved_results({"hvd": hvd, "mwms": mwms, "mwms_same_malloc": mwms_same_malloc}, reps)
    same = [h["samples_per_sec"] / m["samples_per_sec"] for h, m in zip(runs["hvd"], runs["mwms_same_malloc"])]
    return Entry.paired(name, [r["samples_per_sec"] for r in runs["hvd"]], "samples/s",
                        "TF MultiWorkerMirroredStrategy, 2 workers, ring, custom loop",
                        [r["samples_per_sec"] for r in runs["mwms"]], 1.1,
                        notes={"steps": int(steps), "batch_size_per_rank": 64, "threads_per_rank": 1, "reps": reps,
                               "model": model, "params": runs["hvd"][0].get("params"),
                               "steps_per_call": int(per_call), "load_average_before_each_pair": loads,
                               "why_custom_loop": FIT_NOTE, "model_fit_attempt": fit[0] if fit else None,
                               "malloc": malloc_env({}),
                               "mwms_same_malloc_samples_per_sec": statistics.median(
                                   r["samples_per_sec"] for r in runs["mwms_same_malloc"]),
                               "ratio_to_mwms_same_malloc": {"median": round(statistics.median(same), 3),
                                                             "min": round(min(same), 3),
                                                             "max": round(max(same), 3)}})
