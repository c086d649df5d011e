"""Sparse embedding gradients at ``-np 2``.

embedding_sparse_vs_dense  step time with a 1M x 16 embedding (256 examples x 8 ids per rank per step), the
                           mode hvdtrain picks (sparse: Horovod allgather of the touched rows, by
                           model.sparse_embedding_rows) / the other (the whole table densified and
                           all-reduced); interleaved repetitions, median with min-max of the pair ratios.
"""
from __future__ import annotations

from benchmarks.common import Entry
from benchmarks.launch import horovodrun


def run(quick: bool, extra: dict) -> list[Entry]:
    out = horovodrun(2, "benchmarks.embedding_worker", ["--quick"] if quick else [])
    picked = "sparse" if out["choice"][0] else "dense"
    other = "dense" if picked == "sparse" else "sparse"
    notes = {k: out[k] for k in ("rows", "dim", "batch", "ids_per_row", "ranks")} | {"picked": picked}
    # value = the other mode's step time, baseline = the picked mode's: the ratio is how much the choice saves.
    return [Entry.paired("embedding_sparse_vs_dense", out["seconds"][other], "s",
                         f"step time with the picked mode ({picked})", out["seconds"][picked], 1.5, notes=notes)]
