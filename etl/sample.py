"""A deterministic synthetic text-classification table with a known accuracy ceiling.

Each document mixes words specific to its class with filler words shared by
all classes. Then a fixed fraction ``label_noise`` of labels is replaced by a
different class chosen uniformly. A classifier can at best recover the true
class from the words, so the best expected accuracy is

    (1 - label_noise) * P(doc has a class word) + P(doc has none) / num_classes

which :func:`accuracy_ceiling` computes exactly for the configured lengths.
Every row depends only on (seed, row id), so Spark executors generate their
partitions independently and reruns give the same table.

Pure Python: no Spark import here (etl/session.py owns pyspark).
"""
from __future__ import annotations

import random
from typing import Iterator

from hvdtrain.config import SampleConfig

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


def generate(cfg: SampleConfig, start: int = 0, stop: int | None = None) -> Iterator[tuple[str, str, str]]:
    """Rows start..stop-1 (all rows by default)."""
    classes, filler = vocabularies(cfg)
    for row_id in range(start, cfg.rows if stop is None else stop):
        yield make_row(row_id, cfg, classes, filler)


def accuracy_ceiling(cfg: SampleConfig) -> float:
    """Best expected accuracy of any classifier on this data (see module doc)."""
    lengths = range(cfg.min_words, cfg.max_words + 1)
    p_none = sum((1 - cfg.class_word_rate) ** n for n in lengths) / len(lengths)
    return (1 - cfg.label_noise) * (1 - p_none) + p_none / cfg.num_classes
