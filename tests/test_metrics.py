"""Metrics from confusion matrices, and the exact reductions training relies on."""
from __future__ import annotations

import numpy as np
import pytest

from hvdtrain import metrics

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
    sk = pytest.importorskip("sklearn.metrics")
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


# -- training-side reductions (hvdtrain.train's pure helpers) ---------------------------------

def test_epoch_stats_are_global_means_of_summed_totals() -> None:
    train = pytest.importorskip("hvdtrain.train")
    rank_totals = [np.array([10.0, 8, 16]), np.array([2.0, 16, 16])]  # [loss sum, correct, examples]
    stats = train.epoch_stats(1, 4, sum(rank_totals), seconds=2.0)
    assert (stats.loss, stats.accuracy, stats.examples) == (12 / 32, 24 / 32, 32)
    assert stats.samples_per_sec == 16.0


def test_warmup_ramps_linearly_to_the_scaled_rate() -> None:
    train = pytest.importorskip("hvdtrain.train")
    peak = train.scaled_learning_rate(1e-3, 4)
    assert peak == pytest.approx(4e-3)
    assert [train.warmup_learning_rate(s, peak, 4) for s in (0, 1, 3, 10)] == pytest.approx(
        [1e-3, 2e-3, 4e-3, 4e-3])
    assert train.warmup_learning_rate(0, peak, 0) == peak
    schedule = train.WarmupSchedule(peak, 4)
    assert [float(schedule(s)) for s in (0, 1, 3, 10)] == pytest.approx([1e-3, 2e-3, 4e-3, 4e-3])


def test_weight_digests_detect_any_difference_between_ranks() -> None:
    train = pytest.importorskip("hvdtrain.train")
    weights = [np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(3, np.float32)]
    same = train.weights_digest([w.copy() for w in weights])
    nudged = [weights[0].copy(), np.nextafter(weights[1], 2).astype(np.float32)]
    assert train.rank_agreement([train.weights_digest(weights), same])["agree"]
    assert not train.rank_agreement([same, train.weights_digest(nudged)])["agree"]
