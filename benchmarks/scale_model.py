"""A model of data-parallel scale: step time and scaling efficiency for 1-512 GPUs.

    python -m benchmarks.scale_model [--out docs/scaling_model.png]

Step time on N workers, from the time one worker needs for a step's compute
(forward + backward + update) and the bytes of gradients it all-reduces:

* ring all-reduce of S bytes over N workers at link bandwidth B and per-hop
  latency alpha: ``2(N-1)/N * S/B + 2(N-1) * alpha`` per fused buffer
  (Horovod's tensor fusion packs the gradients into ``ceil(S / threshold)``
  buffers, so the latency term is paid once per buffer, not per tensor);
* fusion copies the gradients into and out of the buffer: ``2 * S / copy_bw``
  (0 for GPUs, where the copy runs at device memory speed and is negligible);
* float16 compression halves S;
* overlap: ``overlap`` is the fraction of the communication hidden under the
  backward pass (at most the backward pass itself, taken as 2/3 of compute);
  0 when the all-reduce starts after backprop (``train.allreduce: grouped``).

Scaling efficiency is ``step(1) / step(N)`` at a fixed per-worker batch
(weak scaling): the throughput of N workers over N times one worker's.
Everything here is pure; :func:`main` only draws the chart.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, replace
from typing import Sequence

GBIT = 1e9 / 8  # bytes per second in one Gbit/s
HOROVOD_FUSION_BYTES = 128 * 1024 * 1024  # HOROVOD_FUSION_THRESHOLD default (horovodrun --help: 128 MB)


@dataclass(frozen=True)
class Link:
    """The network between workers."""

    bandwidth: float  # bytes/s each way per worker (B)
    latency: float  # seconds per ring hop (alpha)
    copy_bandwidth: float = math.inf  # bytes/s of the fusion-buffer copy (inf: free, as on GPUs)


@dataclass(frozen=True)
class Workload:
    """One worker's step."""

    compute_seconds: float  # forward + backward + update on one worker, no communication
    gradient_bytes: float  # float32 gradient bytes all-reduced per step (S)
    fp16: bool = False  # gradients sent as float16 (halves S)
    overlap: float = 0.0  # fraction of the all-reduce hidden under backprop (0..1)
    fusion_bytes: float = HOROVOD_FUSION_BYTES


def ring_allreduce_seconds(nbytes: float, workers: int, link: Link, buffers: int = 1) -> float:
    """2(N-1)/N * S/B + 2(N-1) * alpha per buffer; 0 for one worker (pure)."""
    if workers <= 1:
        return 0.0
    n = workers
    return 2 * (n - 1) / n * nbytes / link.bandwidth + 2 * (n - 1) * link.latency * buffers


def comm_seconds(work: Workload, workers: int, link: Link) -> float:
    """The step's all-reduce: fused buffers, their copies, float16 on the wire (pure)."""
    if workers <= 1:
        return 0.0
    wire = work.gradient_bytes / 2 if work.fp16 else work.gradient_bytes
    buffers = max(1, math.ceil(wire / work.fusion_bytes)) if work.fusion_bytes > 0 else 1
    return ring_allreduce_seconds(wire, workers, link, buffers) + 2 * wire / link.copy_bandwidth


def step_seconds(work: Workload, workers: int, link: Link) -> float:
    """Compute plus the communication not hidden under the backward pass (pure)."""
    comm = comm_seconds(work, workers, link)
    hidden = min(work.overlap * comm, work.compute_seconds * 2 / 3)
    return work.compute_seconds + comm - hidden


def efficiency(work: Workload, workers: int, link: Link) -> float:
    """Weak-scaling efficiency: step time on one worker / on ``workers`` (pure)."""
    return step_seconds(work, 1, link) / step_seconds(work, workers, link)


def fit_link(points: Sequence[tuple[float, float]], workers: int, copy_bandwidth: float = math.inf) -> Link:
    """B and alpha from measured (bytes, seconds) all-reduces on ``workers`` ranks, one tensor each (pure).

    Least squares of ``t = a + b * S`` then ``B = 2(N-1)/N / b`` and ``alpha = a / (2(N-1))``.
    """
    if workers < 2 or len(points) < 2:
        raise ValueError(f"fit_link needs >= 2 points on >= 2 workers (got {len(points)} on {workers})")
    xs, ys = [float(p[0]) for p in points], [float(p[1]) for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    intercept = max(my - slope * mx, 0.0)
    n = workers
    return Link(2 * (n - 1) / n / slope, intercept / (2 * (n - 1)), copy_bandwidth)


def transformer_parameters(vocab: int, max_length: int, dim: int, ff_dim: int, layers: int, classes: int) -> int:
    """Trainable parameters of hvdtrain's transformer classifier (hvdtrain.model.models) (pure)."""
    attention = 4 * (dim * dim + dim)  # query, key, value, output projections with biases
    block = attention + (dim * ff_dim + ff_dim) + (ff_dim * dim + dim) + 2 * 2 * dim  # + 2 layer norms
    return vocab * dim + max_length * dim + layers * block + dim * classes + classes


# -- the published reference point and the chart's models ---------------------------------------

# Sergeev & Del Balso 2018 (arXiv:1802.05799), and Horovod's README: ResNet-101 scales at ~90% on 512
# Pascal GPUs (128 servers x 4 P100) over 25 Gbit/s RoCE. ResNet-101 has 44.5 M parameters: ~170 MB of
# float32 gradients. Compute per step (batch 64 per GPU) is ASSUMED from TensorFlow's published
# tf_cnn_benchmarks for a DGX-1 P100 (ResNet-50, batch 64, synthetic: ~219 images/s), scaled by the
# models' FLOPs (ResNet-50 ~4.1, ResNet-101 ~7.8 GFLOPs per image): ~115 images/s, 0.56 s per step.
RESNET101 = Workload(compute_seconds=64 / (219 * 4.1 / 7.8), gradient_bytes=170e6, overlap=0.5)
ROCE_25G = Link(bandwidth=25 * GBIT, latency=10e-6)  # alpha ASSUMED: ~10 us per hop for NCCL over RoCE
PAPER_EFFICIENCY_512 = 0.90
# ASSUMED for the chart: a GPU sustains 30 TFLOP/s on these models (mixed precision, a V100/A100-class
# part well below peak); a transformer step costs ~6 FLOPs per parameter per token (forward + backward).
GPU_FLOPS = 30e12


def transformer_workload(params: int, tokens_per_step: int, overlap: float = 0.5) -> Workload:
    """A transformer's step on one GPU: 6 * params * tokens FLOPs at GPU_FLOPS; float32 gradients (pure)."""
    return Workload(compute_seconds=6 * params * tokens_per_step / GPU_FLOPS, gradient_bytes=4 * params,
                    overlap=overlap)


CHART_MODELS = {
    # configs/demo.yaml's shape (embed 64, 2 heads, ff 128, 1 layer, vocab 1000, 48 tokens, 4 classes), batch 64
    "demo transformer": (transformer_parameters(1000, 48, 64, 128, 1, 4), 64 * 48),
    # DistilBERT's shape (ModelConfig docstring: 768, 12 heads, 3072, 6 layers; vocab 30522), batch 32 x 128
    "DistilBERT-shaped": (transformer_parameters(30522, 512, 768, 3072, 6, 2), 32 * 128),
}
GPU_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def chart_series() -> dict[str, list[float]]:
    """Scaling efficiency per GPU count for each chart model at 25 and 100 Gbit/s (pure)."""
    series = {}
    for name, (params, tokens) in CHART_MODELS.items():
        work = transformer_workload(params, tokens)
        for gbit in (25, 100):
            link = replace(ROCE_25G, bandwidth=gbit * GBIT)
            series[f"{name}, {gbit} Gbit/s"] = [efficiency(work, n, link) for n in GPU_COUNTS]
    return series


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="benchmarks.scale_model", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="docs/scaling_model.png")
    args = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, values in chart_series().items():
        ax.plot(GPU_COUNTS, [100 * v for v in values], marker="o", ms=3,
                linestyle="-" if "100" in label else "--", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("GPUs (one worker each)")
    ax.set_ylabel("scaling efficiency (%)")
    ax.set_ylim(0, 105)
    ax.grid(alpha=0.3)
    ax.set_title("Modelled weak scaling (ring all-reduce, fusion, half the comm. hidden)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(args.out)


if __name__ == "__main__":
    main()
