"""A deterministic synthetic text-classification table with a known accuracy ceiling.

Each document mixes words specific to its class with filler words shared by
all classes. Then a fixed fraction ``label_noise`` of labels is replaced by a
different class chosen uniformly. A classifier can at best recover the true
class from the words, so the best expected accuracy is

    (1 - label_noise) * P(doc has a class word) + P(doc has none) / num_classes

which :func:`accuracy_ceiling` computes exactly for the configured lengths.
Every row depends only on (seed, row id), so Spark executors generate their
partitions independently and reruns give the same table.

The other tasks (``task`` in the job config) use the same words:

* ``binary``: ``positive_rate`` of the rows are positive; only they draw class
  words (class 0's), so a positive with at least one is recognisable and one
  without looks like any negative. The best ROC AUC is
  ``1 - P(positive has no class word) / 2``.
* ``multilabel``: each topic is present with probability ``1 / num_classes``
  (at least one per row); class words come from the present topics. The best
  classifier names exactly the topics whose words appear (no false positives),
  so the best micro F1 follows from how often a present topic leaves no word.
* ``regression``: the target is ``20 x`` the fraction of class-0 words plus
  Gaussian noise of ``noise_std``: the best RMSE is ``noise_std``.

:func:`best_score` gives the task's best value (computed on the rows
themselves where no closed form is simple). Pure Python: no Spark import here
(etl/session.py owns pyspark).
"""
from __future__ import annotations

import random
from typing import Iterator

from hvdtrain.core.config import SampleConfig

TOPICS = ["sports", "science", "politics", "music", "travel", "cooking", "finance", "health",
          "gaming", "movies", "fashion", "weather"]
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


def label_names(num_classes: int) -> list[str]:
    return [TOPICS[i] if i < len(TOPICS) else f"topic_{i}" for i in range(num_classes)]


def vocabularies(cfg: SampleConfig) -> tuple[list[list[str]], list[str]]:
    """Class word lists and the shared filler list: distinct pseudo-words."""
    rng = random.Random(cfg.seed)
    seen: set[str] = set()

    def word() -> str:
        while True:
            n = rng.randint(2, 3)
            w = "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(n))
            if w not in seen:
                seen.add(w)
                return w

    classes = [[word() for _ in range(cfg.words_per_class)] for _ in range(cfg.num_classes)]
    filler = [word() for _ in range(cfg.filler_words)]
    return classes, filler


def make_row(row_id: int, cfg: SampleConfig, classes: list[list[str]], filler: list[str]) -> tuple[str, str, str]:
    """(key, text, label) for one row id."""
    rng = random.Random((cfg.seed << 32) ^ row_id)
    true_class = rng.randrange(cfg.num_classes)
    n = rng.randint(cfg.min_words, cfg.max_words)
    words = [rng.choice(classes[true_class]) if rng.random() < cfg.class_word_rate else rng.choice(filler)
             for _ in range(n)]
    label = true_class
    if rng.random() < cfg.label_noise:
        label = (true_class + rng.randrange(1, cfg.num_classes)) % cfg.num_classes
    return f"doc-{row_id:09d}", " ".join(words), label_names(cfg.num_classes)[label]


def _words(rng: random.Random, n: int, rate: float, topic_words: list[list[str]], filler: list[str]) -> list[str]:
    """``n`` words: each from one of ``topic_words`` (uniformly) with probability ``rate``, else filler."""
    return [rng.choice(rng.choice(topic_words)) if topic_words and rng.random() < rate else rng.choice(filler)
            for _ in range(n)]


def make_task_row(row_id: int, cfg: SampleConfig, task: str, classes: list[list[str]],
                  filler: list[str]) -> tuple[str, str, str]:
    """(key, text, label) for one row id of a binary, multilabel or regression table (see the module doc)."""
    if task == "multiclass":
        return make_row(row_id, cfg, classes, filler)
    rng = random.Random((cfg.seed << 32) ^ row_id ^ 0x5EED)
    n = rng.randint(cfg.min_words, cfg.max_words)
    if task == "binary":
        positive = rng.random() < cfg.positive_rate
        words = _words(rng, n, cfg.class_word_rate, [classes[0]] if positive else [], filler)
        label = "positive" if positive else "negative"
    elif task == "multilabel":
        present = [t for t in range(cfg.num_classes) if rng.random() < 1 / cfg.num_classes] or \
            [rng.randrange(cfg.num_classes)]
        words = _words(rng, n, cfg.class_word_rate, [classes[t] for t in present], filler)
        label = "|".join(label_names(cfg.num_classes)[t] for t in present)
    else:
        words = _words(rng, n, cfg.class_word_rate, [classes[0], filler], filler)
        up = set(classes[0])
        label = f"{20.0 * sum(w in up for w in words) / n + rng.gauss(0.0, cfg.noise_std):.5f}"
    return f"doc-{row_id:09d}", " ".join(words), label


def generate(cfg: SampleConfig, start: int = 0, stop: int | None = None,
             task: str = "multiclass") -> Iterator[tuple[str, str, str]]:
    """Rows start..stop-1 (all rows by default) of a ``task`` table."""
    classes, filler = vocabularies(cfg)
    for row_id in range(start, cfg.rows if stop is None else stop):
        yield make_task_row(row_id, cfg, task, classes, filler)


def best_score(cfg: SampleConfig, task: str = "multiclass") -> tuple[str, float]:
    """(metric, its best possible value) on this table: what the demo prints beside the result."""
    lengths = range(cfg.min_words, cfg.max_words + 1)
    if task == "multiclass":
        return "accuracy", accuracy_ceiling(cfg)
    if task == "binary":
        p_none = sum((1 - cfg.class_word_rate) ** n for n in lengths) / len(lengths)
        return "roc_auc", 1 - p_none / 2
    if task == "regression":
        return "rmse", cfg.noise_std
    return "micro_f1", _best_multilabel_f1(cfg)


def _best_multilabel_f1(cfg: SampleConfig, rows: int = 20_000) -> float:
    """Micro F1 of naming exactly the topics whose words appear, over (up to ``rows``) generated rows."""
    classes, filler = vocabularies(cfg)
    owner = {w: t for t, words in enumerate(classes) for w in words}
    names = label_names(cfg.num_classes)
    tp = fn = 0
    for _, text, label in generate(cfg, 0, min(cfg.rows, rows), "multilabel"):
        seen = {names[owner[w]] for w in text.split() if w in owner}
        truth = set(label.split("|"))
        tp += len(seen & truth)
        fn += len(truth - seen)
    return 2 * tp / (2 * tp + fn) if tp + fn else 0.0


def accuracy_ceiling(cfg: SampleConfig) -> float:
    """Best expected accuracy of any classifier on this data (see module doc)."""
    lengths = range(cfg.min_words, cfg.max_words + 1)
    p_none = sum((1 - cfg.class_word_rate) ** n for n in lengths) / len(lengths)
    return (1 - cfg.label_noise) * (1 - p_none) + p_none / cfg.num_classes
