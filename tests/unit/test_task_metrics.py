"""Each task's metrics from summed counts equal scikit-learn's on the same predictions, also when the
predictions are split over "ranks" and the counts summed (as the all-reduce does)."""
from __future__ import annotations

import numpy as np
import pytest
from sklearn import metrics as skm

from hvdtrain.model import evaluation, metrics


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def _log_loss_sum(y: np.ndarray, logits: np.ndarray) -> float:
    return float(np.sum(np.logaddexp(0, logits) - y * logits))  # sigmoid cross-entropy from logits


def _counts_over_ranks(task: str, labels: np.ndarray, scores: np.ndarray, losses: np.ndarray, width: int,
                       ranks: int = 3, threshold: float = 0.5) -> evaluation.SplitCounts:
    """Counts of each rank's slice, summed as allreduce_counts sums them."""
    parts = [evaluation.empty_counts(task, width, r, ranks) for r in range(ranks)]
    for part, idx in zip(parts, np.array_split(np.arange(len(labels)), ranks)):
        evaluation.add_batch(part, labels[idx], {"scores": scores[idx], "loss": losses[idx]}, threshold)
    total = evaluation.empty_counts(task, width, 0, ranks)
    for part in parts:
        total.confusion += part.confusion
        total.loss_sum += part.loss_sum
        if total.histogram is not None:
            total.histogram += part.histogram
        for key in total.arrays:
            total.arrays[key] += part.arrays[key]
    return total


def test_binary_metrics_match_scikit_learn_2_percent_positives() -> None:
    rng = np.random.default_rng(3)
    y = (rng.random(20_000) < 0.02).astype(np.int64)
    logits = rng.normal(0, 1, y.size) + 2.5 * y - 3
    losses = np.logaddexp(0, logits) - y * logits
    counts = _counts_over_ranks("binary", y, logits, losses, 2, threshold=0.3)
    report = evaluation.split_report(counts, ["negative", "positive"], y.size)
    p = _sigmoid(logits)
    assert abs(report["roc_auc"] - skm.roc_auc_score(y, p)) <= report["roc_auc_max_binning_error"] + 1e-12
    assert report["roc_auc_max_binning_error"] < 1e-3
    binned = np.floor((np.clip(logits, -16, 16 - 1e-9) + 16) / 32 * metrics.AUC_BINS)  # the histogram's scores
    assert report["pr_auc"] == pytest.approx(skm.average_precision_score(y, binned), abs=1e-12)
    assert report["pr_auc"] == pytest.approx(skm.average_precision_score(y, p), abs=2e-3)
    assert report["log_loss"] == pytest.approx(skm.log_loss(y, p), rel=1e-9)
    predicted = (p >= 0.3).astype(int)
    assert report["accuracy"] == pytest.approx(skm.accuracy_score(y, predicted))
    assert report["f1"] == pytest.approx(skm.f1_score(y, predicted))


def test_multilabel_metrics_match_scikit_learn() -> None:
    rng = np.random.default_rng(5)
    y = (rng.random((3000, 4)) < [0.5, 0.2, 0.05, 0.3]).astype(np.float32)
    logits = rng.normal(0, 1, y.shape) + 2 * y - 1
    losses = (np.logaddexp(0, logits) - y * logits).mean(axis=1)
    counts = _counts_over_ranks("multilabel", y, logits, losses, 4)
    report = evaluation.split_report(counts, ["a", "b", "c", "d"], len(y))
    predicted = (logits >= 0).astype(int)
    assert report["micro_f1"] == pytest.approx(skm.f1_score(y, predicted, average="micro"))
    assert report["macro_f1"] == pytest.approx(skm.f1_score(y, predicted, average="macro"))
    assert report["subset_accuracy"] == pytest.approx(skm.accuracy_score(y, predicted))
    assert report["macro_roc_auc"] == pytest.approx(skm.roc_auc_score(y, _sigmoid(logits), average="macro"), abs=1e-3)
    assert report["loss"] == pytest.approx(losses.mean(), rel=1e-9)
    assert report["records"] == len(y)


def test_regression_metrics_match_scikit_learn() -> None:
    rng = np.random.default_rng(7)
    y = rng.normal(50.0, 3.0, 5001)
    pred = y + rng.normal(0.2, 1.0, y.size)
    counts = _counts_over_ranks("regression", y, pred, (y - pred) ** 2, 0)
    report = evaluation.split_report(counts, [], y.size)
    assert report["rmse"] == pytest.approx(np.sqrt(skm.mean_squared_error(y, pred)), rel=1e-9)
    assert report["mae"] == pytest.approx(skm.mean_absolute_error(y, pred), rel=1e-9)
    assert report["r2"] == pytest.approx(skm.r2_score(y, pred), abs=1e-9)
    assert report["complete"] is True
    # the residual chart's sample: each rank's first RESIDUAL_SAMPLE pairs, gathered in rank order by the sum
    k = evaluation.RESIDUAL_SAMPLE
    firsts = [idx[:k] for idx in np.array_split(np.arange(y.size), 3)]
    np.testing.assert_array_equal(report["residual_sample"], np.stack([y, pred], axis=1)[np.concatenate(firsts)])


def test_the_residual_chart_is_a_png(tmp_path) -> None:
    from hvdtrain.observe import plots

    path = plots.residuals_png([[1.0, 1.2], [2.0, 1.9], [3.0, 3.3]], str(tmp_path / "r.png"), "job")
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_regression_r2_of_a_constant_target_follows_scikit_learn() -> None:
    y = np.full(10, 2.0)
    assert metrics.regression_report(metrics.regression_moments(y, y))["r2"] == skm.r2_score(y, y) == 1.0
    assert metrics.regression_report(metrics.regression_moments(y, y + 1))["r2"] == 0.0


def test_scalar_metrics_follow_the_task() -> None:
    moments = metrics.regression_moments(np.array([1.0, 2.0, 4.0]), np.array([1.5, 2.0, 3.0]))
    report = evaluation.split_report(evaluation.SplitCounts(np.zeros((0, 0), np.int64), 0.0, task="regression",
                                                            arrays={"moments": moments}), [], 3)
    assert set(evaluation.scalar_metrics(report, "val")) == {"val_rmse", "val_mae", "val_r2", "val_loss"}


def test_regression_metrics_of_a_large_mean_target_are_exact() -> None:
    """A target of mean 1e8 and spread 1: the one-pass sum y^2 - (sum y)^2 / n gave R^2 0.0 for 0.75."""
    y = 1e8 + np.tile([-1.0, 1.0], 500)
    pred = 1e8 + np.tile([-0.5, 0.5], 500)
    report = metrics.regression_report(metrics.regression_moments(y, pred))
    assert skm.r2_score(y, pred) == pytest.approx(0.75, abs=1e-12)
    assert report["r2"] == pytest.approx(0.75, abs=1e-6)
    assert report["rmse"] == pytest.approx(0.5, abs=1e-6) and report["mae"] == pytest.approx(0.5, abs=1e-6)
    assert report["target_std"] == pytest.approx(1.0, abs=1e-6)
    # over ranks, batch by batch, as evaluation counts it
    counts = _counts_over_ranks("regression", y, pred, (y - pred) ** 2, 0)
    assert evaluation.split_report(counts, [], y.size)["r2"] == pytest.approx(0.75, abs=1e-6)


def test_regression_moments_of_parts_merge_to_the_whole() -> None:
    """Per-rank moments of unequal parts with far-apart means, merged, equal the one-pass moments of the whole."""
    rng = np.random.default_rng(11)
    parts = [rng.normal(mean, spread, size) for mean, spread, size in ((1e8, 1.0, 7), (1e8 + 3, 2.0, 1000),
                                                                       (-5.0, 0.1, 64), (0.0, 1.0, 0))]
    preds = [y + rng.normal(0, 0.3, y.size) for y in parts]
    merged = np.zeros(metrics.MOMENTS)
    for y, p in zip(parts, preds):
        merged = metrics.merge_moments(merged, metrics.regression_moments(y, p))
    y_all, p_all = np.concatenate(parts), np.concatenate(preds)
    whole = metrics.regression_moments(y_all, p_all)
    np.testing.assert_allclose(merged, whole, rtol=1e-12)
    gathered = np.stack([metrics.regression_moments(y, p) for y, p in zip(parts, preds)])  # the all-reduce's rows
    report = metrics.regression_report(gathered)
    assert report["r2"] == pytest.approx(skm.r2_score(y_all, p_all), abs=1e-9)
    assert report["rmse"] == pytest.approx(np.sqrt(skm.mean_squared_error(y_all, p_all)), rel=1e-12)
    assert report["mae"] == pytest.approx(skm.mean_absolute_error(y_all, p_all), rel=1e-12)
    assert report["records"] == y_all.size


@pytest.mark.parametrize("task", ["binary", "multiclass"])
def test_log_loss_is_scikit_learns_unweighted_with_class_weights(task: str) -> None:
    """``loss`` is the class-weighted objective; ``log_loss`` is scikit-learn's, which weighs no class."""
    from hvdtrain.model.heads import Head

    rng = np.random.default_rng(13)
    y = (rng.random(4000) < 0.1).astype(np.int64)
    margin = rng.normal(0, 1, y.size) + 2 * y - 2
    weights = (0.55, 5.0)
    head = Head(task, class_weights=weights)
    logits = margin[:, None] if task == "binary" else np.stack([np.zeros_like(margin), margin], axis=1)
    counts = evaluation.empty_counts(task, 2)
    for idx in np.array_split(np.arange(y.size), 4):
        out = {k: v.numpy() for k, v in head.eval_outputs(y[idx], logits[idx].astype(np.float32)).items()}
        evaluation.add_batch(counts, y[idx], out)
    report = evaluation.split_report(counts, ["no", "yes"], y.size)
    assert report["log_loss"] == pytest.approx(skm.log_loss(y, _sigmoid(margin)), rel=1e-5)
    weighted = skm.log_loss(y, _sigmoid(margin), sample_weight=np.take(weights, y)) * np.take(weights, y).mean()
    assert report["loss"] == pytest.approx(weighted, rel=1e-5)
    assert report["loss"] != pytest.approx(report["log_loss"], rel=1e-2)
