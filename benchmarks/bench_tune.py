"""``tune_efficiency``: successive halving (ASHA, as ``hvdtrain tune`` configures Optuna) against training
every configuration for the full budget.

What runs: the scheduler, not Horovod. Each trial trains a small numpy MLP (one tanh hidden layer, softmax,
SGD with momentum) in this process on a tabular dataset from :mod:`hvdtrain.data.synthetic` with a known ceiling
(the nearest true class center; 10% label noise). The study is :func:`hvdtrain.tune.make_pruner` and the
driver's sampler (TPE, seeded) in an in-memory Optuna storage, reporting validation accuracy after each epoch
as a trial run does. Every trial's training is seeded by its configuration, so ASHA's trial is exactly the
first epochs of the same configuration's full-budget run.

Figures: epochs ASHA spent over the epochs of training the same 27 configurations for the full budget (target
at most 0.40), and the test accuracy of ASHA's best trial (best validation accuracy among completed trials)
against the full-budget best (the configuration with the best validation accuracy after the full budget);
target: within 1 point.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Callable, Mapping

import numpy as np

from benchmarks.common import Entry

ETA, MIN_EPOCHS = 3, 1


def make_data(n_train: int, seed: int = 0) -> dict[str, Any]:
    """Train/validation/test splits and the ceiling (the nearest-center rule's test accuracy)."""
    from hvdtrain.data import synthetic

    classes, width, signal = 4, 8, 0.7
    rng = np.random.default_rng(seed)
    splits = {}
    for name, n in (("train", n_train), ("validation", 1000), ("test", 2000)):
        rows = synthetic._tabular_rows(rng, n, classes, width, [], signal, 0.1)
        splits[name] = (rows["numeric"], rows["label"])
    x, y = splits["test"]
    centers = synthetic.tabular_centers(classes, width, signal)
    ceiling = float(np.mean(np.argmin(((x[:, None, :] - centers[None]) ** 2).sum(-1), axis=1) == y))
    return {"splits": splits, "classes": classes, "ceiling": ceiling}


def train(params: Mapping[str, Any], data: dict[str, Any], epochs: int,
          on_epoch: Callable[[int, float], bool] = lambda e, v: False) -> dict[str, float]:
    """Train one configuration up to ``epochs``; ``on_epoch(epoch, validation accuracy)`` True stops it."""
    seed = int(hashlib.sha256(json.dumps(dict(params), sort_keys=True).encode()).hexdigest()[:8], 16)
    rng = np.random.default_rng(seed)
    (x, y), classes = data["splits"]["train"], data["classes"]
    hidden, lr, batch = int(params["hidden"]), float(params["lr"]), int(params["batch_size"])
    w1 = rng.normal(0, 1 / np.sqrt(x.shape[1]), (x.shape[1], hidden))
    w2 = rng.normal(0, 1 / np.sqrt(hidden), (hidden, classes))
    b1, b2 = np.zeros(hidden), np.zeros(classes)
    vel = [np.zeros_like(a) for a in (w1, b1, w2, b2)]
    ran = 0
    for epoch in range(1, epochs + 1):
        order = rng.permutation(len(x))
        for start in range(0, len(x) - batch + 1, batch):
            idx = order[start:start + batch]
            h = np.tanh(x[idx] @ w1 + b1)
            logits = h @ w2 + b2
            p = np.exp(logits - logits.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            p[np.arange(len(idx)), y[idx]] -= 1
            g2 = p / len(idx)
            gh = (g2 @ w2.T) * (1 - h ** 2)
            grads = (x[idx].T @ gh, gh.sum(0), h.T @ g2, g2.sum(0))
            for v, g, a in zip(vel, grads, (w1, b1, w2, b2)):
                v *= 0.9
                v -= lr * np.clip(g, -5, 5)
                a += v
        ran = epoch
        if on_epoch(epoch, _accuracy((w1, b1, w2, b2), data["splits"]["validation"])):
            break
    weights = (w1, b1, w2, b2)
    return {"epochs": ran, "validation": _accuracy(weights, data["splits"]["validation"]),
            "test": _accuracy(weights, data["splits"]["test"])}


def _accuracy(weights: tuple, split: tuple) -> float:
    w1, b1, w2, b2 = weights
    x, y = split
    return float(np.mean(np.argmax(np.tanh(x @ w1 + b1) @ w2 + b2, axis=1) == y))


def asha(data: dict[str, Any], trials: int, epochs: int) -> list[dict[str, Any]]:
    """The study as ``hvdtrain tune`` runs it (pruner, sampler), with in-process trials."""
    import optuna

    from hvdtrain import tune

    tune._quiet_optuna()
    study = optuna.create_study(direction="maximize", pruner=tune.make_pruner(ETA, MIN_EPOCHS),
                                sampler=optuna.samplers.TPESampler(seed=1234))
    records: list[dict[str, Any]] = []

    def objective(trial: Any) -> float:
        params = {"lr": trial.suggest_float("lr", 1e-4, 3.0, log=True),
                  "hidden": trial.suggest_int("hidden", 2, 64),
                  "batch_size": trial.suggest_categorical("batch_size", [16, 64, 256])}

        def report(epoch: int, value: float) -> bool:
            trial.report(value, epoch)
            return epoch < epochs and trial.should_prune()

        out = train(params, data, epochs, report)
        records.append({"params": params, **out, "pruned": out["epochs"] < epochs})
        if out["epochs"] < epochs:
            raise optuna.TrialPruned()
        return out["validation"]

    study.optimize(objective, n_trials=trials)
    return records


def run(quick: bool, extra: dict) -> list[Entry]:
    trials, epochs, n_train = (9, 9, 1000) if quick else (27, 27, 3000)
    data = make_data(n_train)
    searched = asha(data, trials, epochs)
    full = [train(r["params"], data, epochs) for r in searched]  # the same configurations, full budget each
    asha_best = max((r for r in searched if not r["pruned"]), key=lambda r: r["validation"])
    full_best = max(full, key=lambda r: r["validation"])
    spent, budget = sum(r["epochs"] for r in searched), epochs * len(full)
    gap = 100 * (full_best["test"] - asha_best["test"])
    notes = {"what": f"{trials} trials, eta {ETA}, min epochs {MIN_EPOCHS}, full budget {epochs} epochs; in-process "
                     "numpy MLP trials on a synthetic tabular dataset (the scheduler's efficiency, not Horovod's)",
             "asha_best_test_accuracy": asha_best["test"], "full_budget_best_test_accuracy": full_best["test"],
             "gap_points": round(gap, 2), "within_1_point": gap <= 1.0, "ceiling_test_accuracy": data["ceiling"],
             "asha_epochs": spent, "full_budget_epochs": budget,
             "trials_pruned": sum(r["pruned"] for r in searched), "asha_best_params": asha_best["params"]}
    return [Entry("tune_efficiency", spent, "epochs", f"the same {trials} configurations x {epochs} epochs", budget,
                  0.40, lower_is_better=True, notes=notes),
            Entry("tune_best_accuracy", asha_best["test"], "test accuracy", "the full-budget best configuration",
                  full_best["test"], (full_best["test"] - 0.01) / full_best["test"], notes=notes)]
