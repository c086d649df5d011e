"""train_vs_mwms: hvdtrain at 2 ranks vs TensorFlow's MultiWorkerMirroredStrategy at 2 workers.

Both sides train the benchmark transformer of ``bench_training`` on the same
shards with the same input pipeline, per-rank batch (64) and thread budget
(1 intra-op, 1 inter-op, 1 tf.data thread per process): hvdtrain's step under
``horovodrun -np 2 --gloo`` (``train_worker``) against the same step under
``strategy.run`` on 2 local TF_CONFIG workers with ring collectives
(``mwms_worker``). Launches alternate (hvdtrain, MWMS, hvdtrain, ...); the
ratio is reported as min/median/max over the pairs.
"""
from __future__ import annotations

import shutil
import tempfile

from benchmarks.common import Entry, interleaved_results
from benchmarks.launch import horovodrun, tf_workers

FIT_NOTE = ("Keras 3 model.fit on MWMS's distributed dataset fails on TensorFlow 2.21, so the peer is the "
            "custom loop TensorFlow documents for MWMS (strategy.run + GradientTape)")


def run(quick: bool, extra: dict) -> list[Entry]:
    from hvdtrain.synthetic import Layout, TextSpec, make_text_dataset

    steps, reps = ("10", 1) if quick else ("100", 5)
    root = tempfile.mkdtemp(prefix="bench-mwms-")
    fit: list[str] = []

    def mwms() -> dict:
        result = tf_workers(2, "benchmarks.mwms_worker", [root, steps, "--threads", "1",
                                                         *([] if fit else ["--try-fit"])])
        if not fit:  # the model.fit attempt runs once, in the first MWMS launch
            fit.append(result["model_fit"])
        return result

    try:
        make_text_dataset(root, TextSpec(layout=Layout(n_per_split={"train": 8192, "validation": 64, "test": 64},
                                                       shards_per_split=4), num_classes=4, max_length=64,
                                         vocab_size=2000, seed=3))
        runs = interleaved_results({
            "hvd": lambda: horovodrun(2, "benchmarks.train_worker", [root, "hvd", steps, "--threads", "1"]),
            "mwms": mwms,
        }, reps)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return [Entry.paired("train_vs_mwms", [r["samples_per_sec"] for r in runs["hvd"]], "samples/s",
                         "TF MultiWorkerMirroredStrategy, 2 workers, ring, custom loop",
                         [r["samples_per_sec"] for r in runs["mwms"]], 1.3,
                         notes={"steps": int(steps), "batch_size_per_rank": 64, "threads_per_rank": 1, "reps": reps,
                                "why_custom_loop": FIT_NOTE, "model_fit_attempt": fit[0] if fit else None})]
