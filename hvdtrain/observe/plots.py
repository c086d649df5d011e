"""Charts written next to the evaluation report (matplotlib, Agg backend: no display needed)."""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np


def confusion_matrix_png(cm: np.ndarray, labels: Sequence[str], path: str, title: str = "") -> str:
    """Draw ``cm[true, predicted]`` with counts in the cells and save a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure  # a Figure without pyplot: no global state, no GUI

    cm = np.asarray(cm, dtype=np.int64)
    n = cm.shape[0]
    size = min(3.0 + 0.6 * n, 14.0)
    fig = Figure(figsize=(size, size * 0.85), dpi=100)
    ax = fig.add_subplot()
    shown = ax.imshow(cm, cmap="Blues")
    fig.colorbar(shown, ax=ax, fraction=0.046, pad=0.04)
    ax.set(xticks=range(n), yticks=range(n), xticklabels=list(labels), yticklabels=list(labels),
           xlabel="predicted", ylabel="true", title=title)
    ax.tick_params(axis="x", labelrotation=45)
    if n <= 30:  # counts stay legible up to about this many classes
        threshold = cm.max() / 2 if cm.size else 0
        for i in range(n):
            for j in range(n):
                ax.text(j, i, str(cm[i, j]), ha="center", va="center", fontsize=8,
                        color="white" if cm[i, j] > threshold else "black")
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path


def trial_curves_png(curves: Mapping[str, Sequence[tuple[int, float]]], path: str, metric: str,
                     title: str = "") -> str:
    """One line per trial of ``metric`` by epoch (a hyperparameter search); saves a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5), dpi=100)
    ax = fig.add_subplot()
    for label, points in curves.items():
        if points:
            epochs, values = zip(*points)
            ax.plot(epochs, values, marker="o", linewidth=1, markersize=3, label=label)
    ax.set(xlabel="epoch", ylabel=metric, title=title)
    ax.grid(alpha=0.3)
    if len(curves) <= 30:  # a legend stays legible up to about this many trials
        ax.legend(fontsize=7, loc="best", ncol=2 if len(curves) > 10 else 1)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path


def residuals_png(pairs: Sequence[Sequence[float]], path: str, title: str = "") -> str:
    """A regression's (target, prediction) pairs: predicted against true with the y = x line, and the residual
    (true - predicted) against the prediction with the zero line; saves a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    xy = np.asarray(pairs, dtype=np.float64).reshape(-1, 2)
    y, p = xy[:, 0], xy[:, 1]
    fig = Figure(figsize=(10, 4.5), dpi=100)
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    left.scatter(y, p, s=6, alpha=0.4, linewidths=0)
    lo, hi = (float(min(y.min(), p.min())), float(max(y.max(), p.max()))) if len(xy) else (0.0, 1.0)
    left.plot([lo, hi], [lo, hi], color="black", linewidth=1)
    left.set(xlabel="true", ylabel="predicted", title="predicted vs true")
    right.scatter(p, y - p, s=6, alpha=0.4, linewidths=0)
    right.axhline(0.0, color="black", linewidth=1)
    right.set(xlabel="predicted", ylabel="residual (true - predicted)", title="residuals")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.suptitle(f"{title} ({len(xy):,} records shown)" if title else f"{len(xy):,} records shown")
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path
