"""Metrics from confusion matrices, and the exact reductions training relies on."""
from __future__ import annotations

import numpy as np
import pytest

from hvdtrain.model import metrics

# Rows: true class, columns: predicted class.
CM = np.array([[5, 1, 0],
               [2, 3, 1],
               [0, 0, 4]])


def test_accuracy_and_per_class_by_hand() -> None:
    stats = metrics.per_class(CM)
    assert metrics.accuracy(CM) == pytest.approx(12 / 16)
    np.testing.assert_allclose(stats["precision"], [5 / 7, 3 / 4, 4 / 5])
    np.testing.assert_allclose(stats["recall"], [5 / 6, 3 / 6, 4 / 4])
    np.testing.assert_allclose(stats["f1"], [10 / 13, 0.6, 8 / 9])
    np.testing.assert_array_equal(stats["support"], [6, 6, 4])
    assert metrics.macro_f1(CM) == pytest.approx((10 / 13 + 0.6 + 8 / 9) / 3)


def test_confusion_matrix_counts_true_by_predicted() -> None:
    labels = [0] * 6 + [1] * 6 + [2] * 4
    preds = [0, 0, 0, 0, 0, 1] + [0, 0, 1, 1, 1, 2] + [2, 2, 2, 2]
    cm = metrics.confusion_matrix(np.array(labels), np.array(preds), 3)
    np.testing.assert_array_equal(cm, CM)
    assert cm.dtype == np.int64


def test_summed_rank_matrices_give_the_global_metrics() -> None:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, 1001)
    preds = np.where(rng.random(1001) < 0.7, labels, rng.integers(0, 4, 1001))
    whole = metrics.confusion_matrix(labels, preds, 4)
    parts = [metrics.confusion_matrix(labels[r::3], preds[r::3], 4) for r in range(3)]  # three "ranks"
    np.testing.assert_array_equal(sum(parts), whole)
    assert metrics.accuracy(sum(parts)) == pytest.approx(float((labels == preds).mean()))


def test_matches_scikit_learn() -> None:
    import sklearn.metrics as sk  # a declared test dependency (setup.py extras "dev")
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 5, 300)
    preds = np.where(rng.random(300) < 0.5, labels, rng.integers(0, 5, 300))
    cm = metrics.confusion_matrix(labels, preds, 5)
    assert metrics.macro_f1(cm) == pytest.approx(sk.f1_score(labels, preds, average="macro"))
    np.testing.assert_allclose(metrics.per_class(cm)["precision"],
                               sk.precision_score(labels, preds, average=None, zero_division=0))


def test_zero_denominators_give_zero() -> None:
    cm = np.array([[3, 0], [0, 0]])  # class 1 never occurs and is never predicted
    stats = metrics.per_class(cm)
    assert stats["precision"].tolist() == [1.0, 0.0]
    assert stats["f1"].tolist() == [1.0, 0.0]
    assert metrics.macro_f1(cm) == 0.5
    assert metrics.accuracy(np.zeros((2, 2), np.int64)) == 0.0


def test_report_is_json_ready_and_named() -> None:
    doc = metrics.report(CM, ["neg", "neu", "pos"])
    assert doc["records"] == 16
    assert doc["per_class"]["pos"] == {"precision": 0.8, "recall": 1.0, "f1": pytest.approx(8 / 9), "support": 4}
    assert doc["confusion_matrix"] == CM.tolist()
    with pytest.raises(ValueError, match="2 label names for a 3-class"):
        metrics.report(CM, ["a", "b"])


def test_out_of_range_labels_are_refused() -> None:
    with pytest.raises(ValueError, match=r"labels must be in \[0, 3\)"):
        metrics.confusion_matrix(np.array([0, 3]), np.array([0, 1]), 3)


# -- training-side reductions (hvdtrain.training's pure helpers) ---------------------------------

def test_epoch_stats_are_global_means_of_summed_totals() -> None:
    from hvdtrain.observe.events import epoch_stats

    rank_totals = [np.array([10.0, 8, 16]), np.array([2.0, 16, 16])]  # [loss sum, correct, examples]
    stats = epoch_stats(1, 4, sum(rank_totals), seconds=2.0)
    assert (stats.loss, stats.accuracy, stats.examples) == (12 / 32, 24 / 32, 32)
    assert stats.samples_per_sec == 16.0


def test_warmup_ramps_linearly_to_the_scaled_rate() -> None:
    from hvdtrain.model import schedules as train  # the schedules' owner

    peak = train.scaled_learning_rate(1e-3, 4)
    assert peak == pytest.approx(4e-3)
    assert [train.warmup_learning_rate(s, peak, 4) for s in (0, 1, 3, 10)] == pytest.approx(
        [1e-3, 2e-3, 4e-3, 4e-3])
    assert train.warmup_learning_rate(0, peak, 0) == peak
    schedule = train.WarmupSchedule(peak, 4)
    assert [float(schedule(s)) for s in (0, 1, 3, 10)] == pytest.approx([1e-3, 2e-3, 4e-3, 4e-3])


def test_weight_digests_detect_any_difference_between_ranks() -> None:
    from hvdtrain.training import reports
    weights = [np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(3, np.float32)]
    same = reports.weights_digest([w.copy() for w in weights])
    nudged = [weights[0].copy(), np.nextafter(weights[1], 2).astype(np.float32)]
    assert reports.rank_agreement([reports.weights_digest(weights), same])["agree"]
    assert not reports.rank_agreement([same, reports.weights_digest(nudged)])["agree"]


# -- ROC-AUC from summed score histograms ---------------------------------------------------------

def _scores(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    return labels, rng.normal(1.2 * labels - 0.6, 1.5)  # overlapping classes: an AUC near 0.7


def test_binned_auc_is_within_its_bound_of_scikit_learn() -> None:
    import sklearn.metrics as sk  # a declared test dependency (setup.py extras "dev")
    labels, scores = _scores(5000, 3)
    hist = metrics.score_histogram(labels, scores)
    exact = sk.roc_auc_score(labels, scores)
    bound = metrics.auc_binning_error(hist)
    assert bound < 1e-3
    assert abs(metrics.roc_auc_from_histogram(hist) - exact) <= bound + 1e-12
    assert metrics.roc_auc_from_histogram(hist) == pytest.approx(exact, abs=1e-3)


def test_auc_equals_scikit_learn_exactly_when_scores_sit_on_the_grid() -> None:
    import sklearn.metrics as sk  # a declared test dependency (setup.py extras "dev")
    rng = np.random.default_rng(4)
    labels = rng.integers(0, 2, 800)
    width = 2 * metrics.AUC_LIMIT / metrics.AUC_BINS
    bins = rng.integers(3000, 3040, 800) + labels * 5  # few distinct scores, many ties, as sklearn counts them
    scores = -metrics.AUC_LIMIT + (bins + 0.5) * width
    hist = metrics.score_histogram(labels, scores)
    assert metrics.roc_auc_from_histogram(hist) == pytest.approx(sk.roc_auc_score(labels, scores), abs=1e-12)


def test_rank_histograms_sum_to_the_whole_splits_histogram() -> None:
    labels, scores = _scores(1001, 5)
    whole = metrics.score_histogram(labels, scores)
    parts = [metrics.score_histogram(labels[r::2], scores[r::2]) for r in range(2)]  # two "ranks"
    np.testing.assert_array_equal(sum(parts), whole)
    assert metrics.roc_auc_from_histogram(sum(parts)) == metrics.roc_auc_from_histogram(whole)
    assert whole.dtype == np.int64 and whole.shape == (2, metrics.AUC_BINS) and whole.sum() == 1001


def test_auc_edge_cases() -> None:
    perfect = metrics.score_histogram(np.array([0, 0, 1, 1]), np.array([-30.0, -1.0, 1.0, 40.0]))  # out of range
    assert metrics.roc_auc_from_histogram(perfect) == 1.0
    assert metrics.roc_auc_from_histogram(metrics.score_histogram(np.array([1, 1]), np.array([0.1, 0.2]))) is None
    ties = metrics.score_histogram(np.array([0, 1]), np.array([0.5, 0.5]))
    assert metrics.roc_auc_from_histogram(ties) == 0.5 and metrics.auc_binning_error(ties) == 0.5
    with pytest.raises(ValueError, match="binary labels"):
        metrics.score_histogram(np.array([0, 2]), np.array([0.1, 0.2]))


def test_split_report_has_loss_and_auc_for_two_classes() -> None:
    from hvdtrain.model.evaluation import SplitCounts, scalar_metrics, split_report

    labels, scores = _scores(100, 6)
    cm = metrics.confusion_matrix(labels, (scores > 0).astype(int), 2)
    report = split_report(SplitCounts(cm, 25.0, metrics.score_histogram(labels, scores)), ["a", "b"], 100)
    assert report["loss"] == 0.25 and report["complete"] and 0.5 < report["roc_auc"] <= 1.0
    assert set(scalar_metrics(report, "val")) == {"val_accuracy", "val_macro_f1", "val_loss", "val_roc_auc"}
    three = split_report(SplitCounts(np.eye(3, dtype=np.int64), 0.0), ["a", "b", "c"], 4)
    assert "roc_auc" not in three and not three["complete"]
