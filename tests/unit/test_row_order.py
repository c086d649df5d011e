"""Row order (issue 53, item 1): batches never follow the key.

Real tables are ordered (auto-increment IDs, timestamps, sorted exports): a key that follows time or the label
put near-identical rows side by side in a shard, and batches drawn from small shuffle windows of them were biased
samples. These tests hold the batches of a key-sorted split against what i.i.d. batches would give.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from hvdtrain import data
from hvdtrain.core.config import TrainConfig
from hvdtrain.data import manifest as manifest_lib
from hvdtrain.data import pipeline
from hvdtrain.data import plan as read_plan
from hvdtrain.data.manifest import FeatureSpec
from hvdtrain.data.synthetic import Layout, _write_splits

POSITIVE_RATE = 0.3


def sorted_label_dataset(root: str, per_shard: int, shards: int, row_order: str = "") -> manifest_lib.Manifest:
    """A binary split whose labels are sorted by key inside every shard, as a table whose key follows the label
    came out of the ETL before rows were hash-ordered: ``train-000000 ..`` negatives, then the positives."""
    rng = np.random.default_rng(5)

    def rows(n: int) -> dict[str, np.ndarray]:
        label = np.sort((rng.random(n) < POSITIVE_RATE).astype(np.int64))
        return {"numeric": rng.normal(size=(n, 2)).astype(np.float32), "label": label}

    features = {"numeric": FeatureSpec("float32", [2]), "label": FeatureSpec("int64", []),
                "key": FeatureSpec("bytes", [])}
    layout = Layout(n_per_split={"train": per_shard * shards, "validation": 8, "test": 8}, shards_per_split=shards)
    splits = _write_splits(root, rows, ["negative", "positive"], layout, features)
    m = manifest_lib.Manifest(features=features, label_feature="label", labels=["negative", "positive"],
                              splits=splits, task="binary", etl_config_hash="test", row_order=row_order)
    manifest_lib.write(m, root)
    return manifest_lib.read(root)


def batch_mean_variance_ratio(m: manifest_lib.Manifest, stream: data.TrainStream, batches: int) -> float:
    """Variance of the label mean over consecutive batches, divided by what i.i.d. batches drawn without
    replacement from the rank's share would give: 1 for a good shuffle, up to ``batch_size`` for sorted batches."""
    ds = data.train_dataset(m, stream, features=["label"])
    means = np.array([float(np.mean(b["label"].numpy())) for b in itertools.islice(iter(ds), batches)])
    share = read_plan.share([s.records for s in m.split("train").shards], stream.rank, stream.size)
    p = float(np.mean(means))
    n, b = share.records, stream.batch_size
    iid = p * (1 - p) / b * (n - b) / (n - 1)
    return float(np.var(means, ddof=1)) / iid


@pytest.mark.parametrize("rank,size", [(0, 1), (1, 2)])
def test_batches_of_a_key_sorted_split_vary_as_iid_batches_would(tmp_path, rank: int, size: int) -> None:
    # 2 shards of 12,000 records, labels sorted by key in each; the default training stream, 400 batches of 64.
    # With 400 batch means the ratio's standard error is about sqrt(2 / 399) = 0.07, so [0.7, 1.4] is over 4
    # standard errors wide either way. The shuffle windows of 2,048 records used before gave about 30 here:
    # most windows held one class only.
    m = sorted_label_dataset(str(tmp_path), per_shard=12_000, shards=2)
    stream = data.TrainStream(rank=rank, size=size, batch_size=64, shuffle_buffer=TrainConfig().shuffle_buffer,
                              seed=TrainConfig().seed)
    ratio = batch_mean_variance_ratio(m, stream, batches=400)
    assert 0.7 < ratio < 1.4, ratio
    # the measure itself sees sorted batches: windows of 64 records leave every batch one class or two
    small = data.TrainStream(rank=rank, size=size, batch_size=64, shuffle_buffer=64, seed=1)
    assert batch_mean_variance_ratio(m, small, batches=400) > 10


def test_shuffle_window_is_the_buffer_capped_by_the_pass_and_by_memory() -> None:
    cap = read_plan.WINDOW_BYTES
    assert read_plan.shuffle_window(262_144, 1_000_000, 100, 64) == 262_144
    assert read_plan.shuffle_window(262_144, 50_000, 100, 64) == 50_000  # the whole pass, shuffled whole
    assert read_plan.shuffle_window(262_144, 1_000_000, 2_000, 64) == cap // 2_000  # long records: fewer
    assert read_plan.shuffle_window(262_144, 1_000_000, cap, 64) == 64  # never less than a batch
    assert read_plan.shuffle_window(30, 90, 100, 8) == 30  # an explicit small buffer is kept


def test_a_pass_that_fits_one_window_is_shuffled_whole(tmp_path) -> None:
    # One shard of 600 sorted records, one window: the first and last records of the shard share the first batches
    # of some pass (with windows cut inside the pass, the last ones could only come after the first window).
    m = sorted_label_dataset(str(tmp_path), per_shard=600, shards=1)
    ds = data.train_dataset(m, data.TrainStream(rank=0, size=1, batch_size=100, shuffle_buffer=10_000, seed=2),
                            features=["key"])
    keys = [int(k.decode().split("-")[1]) for b in itertools.islice(iter(ds), 18) for k in b["key"].numpy()]
    passes = [keys[i:i + 600] for i in range(0, len(keys), 600)]
    assert all(sorted(p) == list(range(600)) for p in passes) and len({tuple(p) for p in passes}) == 3
    assert all(min(p[:100]) < 100 and max(p[:100]) >= 500 for p in passes)


def test_record_bytes_follows_the_stored_widths(tmp_path) -> None:
    m = sorted_label_dataset(str(tmp_path), per_shard=10, shards=1)
    assert pipeline.record_bytes(m, ["numeric", "label"]) == 2 * 4 + 8
    text = manifest_lib.text_features(128, 30_000, packed=True)  # ids u16, mask u8
    m = manifest_lib.Manifest(features={**text, "label": FeatureSpec("int64", [])}, label_feature="label",
                              labels=["a", "b"], splits=m.splits)
    assert pipeline.record_bytes(m) == 128 * 2 + 128 + 8


def test_training_warns_on_a_dataset_sorted_by_key_and_not_on_a_hash_ordered_one(tmp_path) -> None:
    legacy = sorted_label_dataset(str(tmp_path / "legacy"), per_shard=10, shards=1)
    line = manifest_lib.order_warning(legacy)
    assert line is not None and "sorted each shard's rows by key" in line and "rerun the ETL" in line
    assert str(tmp_path / "legacy") in line
    ordered = sorted_label_dataset(str(tmp_path / "ordered"), per_shard=10, shards=1, row_order="hash:1")
    assert ordered.row_order == "hash:1" and manifest_lib.order_warning(ordered) is None
    assert "row_order" not in legacy.to_dict()  # older datasets keep their layout and digest


def test_reading_the_keys_too_does_not_change_the_order(tmp_path) -> None:
    # train.record_trace reads the key feature as well: the window (sized by bytes) and so the order stay the same.
    m = sorted_label_dataset(str(tmp_path), per_shard=3000, shards=1)
    stream = data.TrainStream(rank=0, size=1, batch_size=50, shuffle_buffer=10_000, seed=4)
    import hvdtrain.data.plan as plan_mod

    old = plan_mod.WINDOW_BYTES
    plan_mod.WINDOW_BYTES = 30 * pipeline.record_bytes(m)  # a window the bytes bound decides: 30 records
    try:
        plain = [b["numeric"].numpy().tolist() for b in itertools.islice(iter(data.train_dataset(
            m, stream, features=["numeric"])), 20)]
        traced = [b["numeric"].numpy().tolist() for b in itertools.islice(iter(data.train_dataset(
            m, stream, features=["numeric", "key"])), 20)]
    finally:
        plan_mod.WINDOW_BYTES = old
    assert plain == traced
