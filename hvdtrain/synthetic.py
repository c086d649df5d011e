"""Small synthetic text datasets written like the ETL's output, without Spark (tests and benchmarks).

``make_text_dataset`` writes TFRecord shards with :mod:`hvdtrain.tfrecord` and
publishes a manifest with :func:`hvdtrain.manifest.write`, so training tests
do not depend on the ETL. Each class owns a handful of token ids; a document
mixes its class's tokens with shared filler tokens, so a small model separates
the classes in an epoch or two.
"""
from __future__ import annotations

import os
from typing import Optional, Union

import numpy as np

from hvdtrain import manifest as manifest_lib
from hvdtrain.manifest import FeatureSpec, Manifest, Shard, Split
from hvdtrain.tfrecord import BYTES, INT64, TFRecordWriter, encode_examples

SPECIAL = 5  # ids 0..4: [PAD] [UNK] [CLS] [SEP] [MASK], as etl/text.py lays them out
SPLITS = ("train", "validation", "test")


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


def _write_shard(root: str, rel: str, rows: dict[str, np.ndarray], labels: list[str], compression: str) -> Shard:
    records = encode_examples({
        "input_ids": (INT64, rows["input_ids"]),
        "attention_mask": (INT64, rows["attention_mask"]),
        "label": (INT64, rows["label"]),
        "key": (BYTES, rows["key"]),
    })
    os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
    with open(os.path.join(root, rel), "wb") as fh:
        writer = TFRecordWriter(fh, compression=compression)
        writer.write_many(records)
        writer.count_labels(rows["label"])
        stats = writer.finish()
    counts = {labels[k]: v for k, v in stats.class_counts.items()}
    return Shard(path=rel, records=stats.records, bytes=stats.bytes, sha256=stats.sha256, class_counts=counts)


def make_text_dataset(root: str, n_per_split: Union[int, dict[str, int]] = 200, num_classes: int = 3,
                      max_length: int = 16, vocab_size: int = 64, shards_per_split: int = 2, seed: int = 0,
                      shard_sizes: Optional[dict[str, list[int]]] = None, class_rate: float = 0.5,
                      compression: str = "none") -> Manifest:
    """Write a separable dataset under ``root`` and return its manifest (as read back).

    Args:
        n_per_split: records per split (one number for all, or per split).
        shards_per_split: shards per split, of near-equal size.
        shard_sizes: explicit records per shard for some splits (overrides the two above).
        class_rate: fraction of tokens drawn from the document's class.
    """
    rng = np.random.default_rng(seed)
    labels = [f"class{i}" for i in range(num_classes)]
    splits = {}
    for split in SPLITS:
        if shard_sizes and split in shard_sizes:
            sizes = list(shard_sizes[split])
        else:
            total = n_per_split[split] if isinstance(n_per_split, dict) else n_per_split
            sizes = _sizes(total, shards_per_split)
        ids, mask, y = _documents(rng, sum(sizes), num_classes, max_length, vocab_size, class_rate)
        keys = np.array([f"{split}-{i:06d}".encode() for i in range(sum(sizes))], dtype=object)
        shards, start = [], 0
        for i, n in enumerate(sizes):
            part = slice(start, start + n)
            rows = {"input_ids": ids[part], "attention_mask": mask[part], "label": y[part], "key": list(keys[part])}
            shards.append(_write_shard(root, f"{split}/part-{i:05d}.tfrecord", rows, labels, compression))
            start += n
        splits[split] = Split(shards)
    manifest = Manifest(
        features={"input_ids": FeatureSpec("int64", [max_length]),
                  "attention_mask": FeatureSpec("int64", [max_length]),
                  "label": FeatureSpec("int64", []),
                  "key": FeatureSpec("bytes", [])},
        label_feature="label",
        labels=labels,
        splits=splits,
        compression=compression,
        vocab={"path": "vocab.txt", "size": vocab_size, "sha256": ""},
        preprocessing={"tokenizer": "synthetic", "max_length": max_length, "lowercase": True},
        source={"synthetic": True, "seed": seed},
        etl_config_hash="synthetic",
        versions={"hvdtrain": "test"},
        created_at="1970-01-01T00:00:00Z",
    )
    manifest_lib.write(manifest, root)
    return manifest_lib.read(root)
