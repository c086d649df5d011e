"""benchmarks/scale_model.py: the ring all-reduce formula, the fit, and the published ResNet-101 point."""
from __future__ import annotations

import math

import pytest

from benchmarks import scale_model as sm


def test_ring_allreduce_is_the_textbook_formula() -> None:
    link = sm.Link(bandwidth=1e9, latency=1e-5)
    assert sm.ring_allreduce_seconds(1e9, 1, link) == 0
    assert sm.ring_allreduce_seconds(1e9, 4, link) == pytest.approx(2 * 3 / 4 * 1.0 + 2 * 3 * 1e-5)
    assert sm.ring_allreduce_seconds(1e9, 4, link, buffers=3) == pytest.approx(1.5 + 3 * 6e-5)


def test_fusion_buffers_fp16_and_overlap_enter_the_step() -> None:
    link = sm.Link(bandwidth=1e9, latency=1e-3, copy_bandwidth=4e9)
    work = sm.Workload(compute_seconds=1.0, gradient_bytes=200e6, fusion_bytes=64e6)
    comm = sm.comm_seconds(work, 2, link)
    assert comm == pytest.approx(200e6 / 1e9 + 2 * 1e-3 * 4 + 2 * 200e6 / 4e9)  # 4 buffers, two copies
    half = sm.comm_seconds(sm.Workload(1.0, 200e6, fp16=True, fusion_bytes=64e6), 2, link)
    assert half == pytest.approx(100e6 / 1e9 + 2 * 1e-3 * 2 + 2 * 100e6 / 4e9)
    assert sm.step_seconds(work, 2, link) == pytest.approx(1.0 + comm)
    hidden = sm.Workload(1.0, 200e6, overlap=0.5, fusion_bytes=64e6)
    assert sm.step_seconds(hidden, 2, link) == pytest.approx(1.0 + comm / 2)
    # never more hidden than the backward pass (2/3 of compute)
    assert sm.step_seconds(sm.Workload(0.03, 200e6, overlap=1.0), 2, link) > 0.03 + sm.comm_seconds(
        sm.Workload(0.03, 200e6), 2, link) - 0.03


def test_fit_link_recovers_bandwidth_and_latency() -> None:
    truth = sm.Link(bandwidth=0.8e9, latency=50e-6)
    points = [(s, sm.ring_allreduce_seconds(s, 2, truth)) for s in (4096, 1 << 16, 1 << 20, 1 << 24)]
    fitted = sm.fit_link(points, 2)
    assert fitted.bandwidth == pytest.approx(truth.bandwidth, rel=1e-6)
    assert fitted.latency == pytest.approx(truth.latency, rel=1e-6)
    with pytest.raises(ValueError, match="fit_link needs"):
        sm.fit_link(points[:1], 2)


def test_reproduces_horovods_resnet101_efficiency_at_512_gpus() -> None:
    """Sergeev & Del Balso 2018: ~90% at 512 GPUs over 25 Gbit/s RoCE (inputs in scale_model.RESNET101)."""
    predicted = sm.efficiency(sm.RESNET101, 512, sm.ROCE_25G)
    assert abs(predicted - sm.PAPER_EFFICIENCY_512) <= 0.05, predicted
    assert sm.efficiency(sm.RESNET101, 8, sm.ROCE_25G) > predicted  # efficiency falls with scale


def test_transformer_parameter_count_matches_keras() -> None:
    from hvdtrain.core.config import ModelConfig
    from hvdtrain.data.contract import InputShape
    from hvdtrain.model.models import build_model

    shape = InputShape(vocab_size=50, max_length=12, num_classes=3, label_feature="label")
    model = build_model(ModelConfig(embed_dim=16, num_heads=2, ff_dim=24, num_layers=2), shape)
    assert sm.transformer_parameters(50, 12, 16, 24, 2, 3) == model.count_params()


def test_chart_series_cover_both_models_and_links() -> None:
    series = sm.chart_series()
    assert len(series) == 4 and all(len(v) == len(sm.GPU_COUNTS) for v in series.values())
    assert all(v[0] == pytest.approx(1.0) and all(0 < x <= 1 + 1e-9 for x in v) for v in series.values())
    assert all(not math.isnan(x) for v in series.values() for x in v)
