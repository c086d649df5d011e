"""Small synthetic datasets written like the ETL's output, without Spark (tests and benchmarks).

Both writers produce TFRecord shards with :mod:`hvdtrain.data.tfrecord` and publish
a manifest with :func:`hvdtrain.data.manifest.write`, so training tests do not
depend on the ETL.

* ``make_text_dataset``: ``input_ids`` / ``attention_mask``. Each class owns a
  handful of token ids; a document mixes its class's tokens with shared filler
  tokens, so a small model separates the classes in an epoch or two.
* ``make_tabular_dataset``: ``numeric`` float32 [k] (standard-scaled, as the
  ETL leaves it) and ``categorical`` int64 [m] (0 = unknown bucket), with
  ``preprocessing["tabular"]`` laid out as ``etl/tabular.py`` writes it. Each
  class shifts the numeric means and prefers some categories.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

import numpy as np

from hvdtrain.core import tasks
from hvdtrain.data import manifest as manifest_lib
from hvdtrain.data.manifest import FeatureSpec, Manifest, Shard, Split
from hvdtrain.data.tfrecord import BYTES, FLOAT, INT64, TFRecordWriter, int_column

SPECIAL = 5  # ids 0..4: [PAD] [UNK] [CLS] [SEP] [MASK], as etl/text.py lays them out
SPLITS = ("train", "validation", "test")
IID = "iid"  # the manifest's row_order: rows are generated independently, so any order is a random one


def _documents(rng: np.random.Generator, n: int, num_classes: int, max_length: int, vocab_size: int,
               class_rate: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    per_class = max(2, (vocab_size - SPECIAL) // (2 * num_classes))
    filler_start = SPECIAL + per_class * num_classes
    if filler_start >= vocab_size:
        raise ValueError(f"vocab_size {vocab_size} is too small for {num_classes} classes")
    labels = rng.integers(0, num_classes, size=n)
    lengths = rng.integers(max(2, max_length // 2), max_length + 1, size=n)
    class_tok = SPECIAL + labels[:, None] * per_class + rng.integers(0, per_class, size=(n, max_length))
    filler = rng.integers(filler_start, vocab_size, size=(n, max_length))
    ids = np.where(rng.random((n, max_length)) < class_rate, class_tok, filler)
    mask = (np.arange(max_length)[None, :] < lengths[:, None]).astype(np.int64)
    return (ids * mask).astype(np.int64), mask, labels.astype(np.int64)


def _sizes(total: int, shards: int) -> list[int]:
    base, extra = divmod(total, shards)
    return [base + (1 if i < extra else 0) for i in range(shards)]


_KINDS = {"input_ids": INT64, "attention_mask": INT64, "numeric": FLOAT, "categorical": INT64, "label": INT64,
          "key": BYTES}


def _write_shard(root: str, rel: str, rows: dict[str, Any], labels: list[str], compression: str,
                 encodings: dict[str, str]) -> Shard:
    os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
    with open(os.path.join(root, rel), "wb") as fh:
        writer = TFRecordWriter(fh, compression=compression)
        writer.write_columns({name: int_column(values, encodings[name]) if name in encodings
                              else (FLOAT if name == "label" and np.asarray(values).dtype == np.float32
                                    else _KINDS[name], values) for name, values in rows.items()})
        if np.asarray(rows["label"]).dtype == np.int64:  # class indices (multiclass, binary)
            writer.count_labels(rows["label"])
        stats = writer.finish()
    counts = {labels[k]: v for k, v in stats.class_counts.items()}
    return Shard(path=rel, records=stats.records, bytes=stats.bytes, sha256=stats.sha256, class_counts=counts)


@dataclass(frozen=True)
class Layout:
    """How many records each split gets, in how many shards, stored how."""

    n_per_split: Union[int, dict[str, int]] = 200  # one number for all splits, or per split
    shards_per_split: int = 2  # near-equal shards per split
    shard_sizes: Optional[dict[str, list[int]]] = None  # explicit records per shard for some splits (overrides both)
    compression: str = "none"

    def sizes(self, split: str) -> list[int]:
        if self.shard_sizes and split in self.shard_sizes:
            return list(self.shard_sizes[split])
        total = self.n_per_split[split] if isinstance(self.n_per_split, dict) else self.n_per_split
        return _sizes(total, self.shards_per_split)


@dataclass(frozen=True)
class TextSpec:
    """A separable text dataset: documents draw ``class_rate`` of their tokens from their class's words."""

    layout: Layout = Layout()
    num_classes: int = 3
    max_length: int = 16
    vocab_size: int = 64
    seed: int = 0
    class_rate: float = 0.5
    packed: bool = True  # token features packed, as the ETL stores them by default (false: int64 lists)


@dataclass(frozen=True)
class TabularSpec:
    """A tabular dataset: class-dependent numeric means and category preferences."""

    layout: Layout = Layout()
    num_classes: int = 3
    num_numeric: int = 6  # width of ``numeric`` (0: no numeric feature)
    cardinalities: Optional[tuple[int, ...]] = None  # per categorical column, unknown bucket included
    # (default (5, 8, 3); (): no categorical feature)
    seed: int = 0
    signal: float = 1.5  # spread of the per-class numeric means, in standard deviations
    label_noise: float = 0.0  # fraction of labels replaced by another class
    # binary: class 0 vs the rest (labels negative/positive); multilabel: each row has its class's label and,
    # when its first numeric value is > 1, the next one; regression: the target is the sum of the numeric
    # values plus noise of standard deviation 0.1 (hvdtrain.core.tasks)
    task: str = "multiclass"


def _task_labels(task: str, table: dict[str, np.ndarray], num_classes: int, rng: np.random.Generator) -> np.ndarray:
    """The ``label`` column of a tabular table for ``task`` (see :class:`TabularSpec`)."""
    y = table["label"]
    if task == "binary":
        return (y != 0).astype(np.int64)
    if task == "multilabel":
        multi = np.eye(num_classes, dtype=np.float32)[y]
        extra = table["numeric"][:, 0] > 1
        multi[extra, (y[extra] + 1) % num_classes] = 1.0
        return multi
    if task == "regression":
        return (table["numeric"].sum(axis=1) + rng.normal(0, 0.1, len(y))).astype(np.float32)
    return y


def _write_splits(root: str, make_rows: Callable[[int], dict[str, np.ndarray]], labels: list[str], layout: Layout,
                  features: dict[str, FeatureSpec]) -> dict[str, Split]:
    """Generate each split's rows and write them as shards, stored as ``features`` say; keys are ``<split>-<index>``."""
    encodings = manifest_lib.encodings(features)
    splits = {}
    for split in SPLITS:
        sizes = layout.sizes(split)
        table = make_rows(sum(sizes))
        keys = [f"{split}-{i:06d}".encode() for i in range(sum(sizes))]
        shards, start = [], 0
        for i, n in enumerate(sizes):
            part: dict[str, Any] = {name: values[start:start + n] for name, values in table.items()}
            part["key"] = keys[start:start + n]
            shards.append(_write_shard(root, f"{split}/part-{i:05d}.tfrecord", part, labels, layout.compression,
                                        encodings))
            start += n
        splits[split] = Split(shards)
    return splits


def make_text_dataset(root: str, spec: TextSpec = TextSpec()) -> Manifest:
    """Write a separable text dataset under ``root`` and return its manifest (as read back)."""
    s = spec
    rng = np.random.default_rng(s.seed)
    labels = [f"class{i}" for i in range(s.num_classes)]

    def rows(n: int) -> dict[str, np.ndarray]:
        ids, mask, y = _documents(rng, n, s.num_classes, s.max_length, s.vocab_size, s.class_rate)
        return {"input_ids": ids, "attention_mask": mask, "label": y}

    features = {**manifest_lib.text_features(s.max_length, s.vocab_size, s.packed),
                "label": FeatureSpec("int64", []), "key": FeatureSpec("bytes", [])}
    splits = _write_splits(root, rows, labels, s.layout, features)
    manifest = Manifest(
        features=features,
        label_feature="label",
        labels=labels,
        splits=splits,
        compression=s.layout.compression,
        vocab={"path": "vocab.txt", "size": s.vocab_size, "sha256": ""},
        preprocessing={"text": {"tokenizer": "synthetic", "max_length": s.max_length, "lowercase": True}},
        source={"synthetic": True, "seed": s.seed},
        etl_config_hash="synthetic",
        versions={"hvdtrain": "test"},
        created_at="1970-01-01T00:00:00Z", row_order=IID,
    )
    manifest_lib.write(manifest, root)
    return manifest_lib.read(root)


def tabular_centers(num_classes: int, num_numeric: int, signal: float) -> np.ndarray:
    """Each class's mean of the numeric features: the nearest center is the best possible classifier of the
    numeric part (unit-variance noise, equal class sizes), which gives a dataset's accuracy ceiling."""
    return np.random.default_rng(1000 + num_classes).normal(0.0, signal, size=(num_classes, num_numeric))


def _tabular_rows(rng: np.random.Generator, n: int, num_classes: int, num_numeric: int,
                  cardinalities: list[int], signal: float, label_noise: float) -> dict[str, np.ndarray]:
    """Class-dependent numeric means and category preferences; ``label_noise`` of labels replaced."""
    y = rng.integers(0, num_classes, size=n)
    centers = tabular_centers(num_classes, num_numeric, signal)
    numeric = (centers[y] + rng.normal(0.0, 1.0, size=(n, num_numeric))).astype(np.float32)
    categorical = np.zeros((n, len(cardinalities)), np.int64)
    for j, card in enumerate(cardinalities):
        known = card - 1  # index 0 is the unknown bucket
        preferred = 1 + (y * 7 + j) % known  # each class leans to one category per column
        uniform = rng.integers(0, card, size=n)  # includes some unknowns (0)
        categorical[:, j] = np.where(rng.random(n) < 0.5, preferred, uniform)
    noisy = rng.random(n) < label_noise
    y = np.where(noisy, (y + rng.integers(1, num_classes, size=n)) % num_classes, y)
    return {"numeric": numeric, "categorical": categorical, "label": y.astype(np.int64)}


def tabular_preprocessing(num_numeric: int, cardinalities: list[int]) -> dict[str, Any]:
    """``preprocessing["tabular"]`` as etl/tabular.py writes it (fitted on standard-normal columns)."""
    numeric_columns = [f"x{i}" for i in range(num_numeric)]
    categorical_columns = [f"c{j}" for j in range(len(cardinalities))]
    return {
        "numeric_columns": numeric_columns, "categorical_columns": categorical_columns,
        "impute": "mean", "impute_value": 0.0, "scale": True,
        "numeric": {c: {"mean": 0.0, "std": 1.0, "median": 0.0, "count": 0.0} for c in numeric_columns},
        "categories": {c: [f"{c}_v{k}" for k in range(1, card)] for c, card in zip(categorical_columns, cardinalities)},
        "fill_values": [0.0] * num_numeric,
        "cardinalities": list(cardinalities),
    }


def make_tabular_dataset(root: str, spec: TabularSpec = TabularSpec()) -> Manifest:
    """Write a tabular classification dataset under ``root`` and return its manifest (as read back)."""
    s, num_numeric = spec, spec.num_numeric
    cards = [5, 8, 3] if s.cardinalities is None else list(s.cardinalities)
    if num_numeric <= 0 and not cards:
        raise ValueError("a tabular dataset needs num_numeric > 0 or some cardinalities")
    if any(c < 2 for c in cards):
        raise ValueError(f"cardinalities include the unknown bucket, so each must be >= 2 (got {cards})")
    rng = np.random.default_rng(s.seed)
    labels = {"binary": ["negative", "positive"], "regression": []}.get(
        s.task, [f"class{i}" for i in range(s.num_classes)])

    def rows(n: int) -> dict[str, np.ndarray]:
        table = _tabular_rows(rng, n, s.num_classes, max(num_numeric, 1), cards or [2], s.signal, s.label_noise)
        table["label"] = _task_labels(s.task, table, s.num_classes, rng)
        return {name: table[name] for name in ("numeric", "categorical", "label")
                if (name != "numeric" or num_numeric > 0) and (name != "categorical" or cards)}

    features: dict[str, FeatureSpec] = {}
    if num_numeric > 0:
        features["numeric"] = FeatureSpec("float32", [num_numeric])
    if cards:
        features["categorical"] = FeatureSpec("int64", [len(cards)])
    features["label"] = FeatureSpec(*tasks.label_spec(s.task, len(labels)))
    features["key"] = FeatureSpec("bytes", [])
    splits = _write_splits(root, rows, labels, s.layout, features)
    manifest = Manifest(
        features=features, task=s.task,
        label_feature="label", labels=labels, splits=splits, compression=s.layout.compression,
        preprocessing={"tabular": tabular_preprocessing(num_numeric, cards)},
        source={"synthetic": True, "seed": s.seed, "kind": "tabular"}, etl_config_hash="synthetic",
        versions={"hvdtrain": "test"}, created_at="1970-01-01T00:00:00Z", row_order=IID,
    )
    manifest_lib.write(manifest, root)
    return manifest_lib.read(root)
