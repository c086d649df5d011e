"""Shard planning (pure) and the tf.data pipelines, on small synthetic datasets."""
from __future__ import annotations

import collections
import dataclasses
import itertools
import os
import shutil

import numpy as np
import pytest

from hvdtrain import data
from hvdtrain.core.config import ModelConfig
from hvdtrain.core.errors import DataError
from hvdtrain.data import contract, pipeline, staging
from hvdtrain.data import manifest as manifest_lib
from hvdtrain.data import plan as read_plan
from hvdtrain.data.manifest import FeatureSpec
from hvdtrain.data.synthetic import Layout, TabularSpec, TextSpec, make_text_dataset

ALL = ["input_ids", "attention_mask", "label", "key"]


# -- planning ----------------------------------------------------------------------------

def _check_shares(shard_records: list[int], size: int) -> list[read_plan.Share]:
    shares = [read_plan.share(shard_records, r, size) for r in range(size)]
    counts = [s.records for s in shares]
    assert max(counts) - min(counts) <= 1 and sum(counts) == sum(shard_records)
    # contiguous and disjoint: rank after rank, the ranges walk the split's records in manifest order
    walk = [(r.shard, i) for s in shares for r in s.ranges for i in range(r.first, r.first + r.count)]
    assert walk == [(shard, i) for shard, n in enumerate(shard_records) for i in range(n)]
    for s in shares:  # a rank opens only the shards its share touches, each once, in order
        assert list(s.shards) == sorted(set(s.shards)) and all(r.count > 0 for r in s.ranges)
    return shares


def test_shares_are_contiguous_equal_and_touch_few_shards_at_any_world_size() -> None:
    rng = np.random.default_rng(0)
    for size in range(1, 65):
        for shards in {1, 3, size // 2 + 1, size, 2 * size + 1}:
            uneven = rng.integers(1, 400, shards).tolist()
            if sum(uneven) >= size:
                _check_shares(uneven, size)
            equal = [97] * shards
            if sum(equal) >= size:  # the ETL writes shards of near-equal size
                bound = -(-shards // size) + 1
                assert all(len(s.shards) <= bound for s in _check_shares(equal, size)), (size, shards)
    assert read_plan.share([10, 10], 1, 4) == read_plan.Share((read_plan.ShardRange(0, 5, 5),))  # a shard, shared
    assert [read_plan.share([3], r, 4).records for r in range(4)] == [1, 1, 1, 0]  # more ranks than records
    with pytest.raises(ValueError):
        read_plan.share([1], 0, 0)


def test_steps_per_epoch_counts_whole_global_batches() -> None:
    assert data.steps_per_epoch(1000, 32, 1) == 31
    assert data.steps_per_epoch(1000, 32, 2) == 15
    assert data.steps_per_epoch(64, 32, 2) == 1
    with pytest.raises(DataError, match=r"train.batch_size 32 x 4 ranks = 128"):
        data.steps_per_epoch(100, 32, 4)


def test_shard_warning_names_the_etl_setting_when_ranks_outnumber_shards() -> None:
    assert read_plan.shard_warning("train", 64, 64) is None and read_plan.shard_warning("train", 3, 2) is None
    line = read_plan.shard_warning("train", 3, 8)
    assert "3 shards for 8 ranks" in line and "etl.min_shards_per_split >= 8" in line and "etl.min_shard_mb" in line


def test_training_warns_once_on_rank_0_when_the_train_split_has_fewer_shards_than_ranks(
        dataset: manifest_lib.Manifest, caplog: pytest.LogCaptureFixture) -> None:
    from hvdtrain.core import config as config_mod
    from hvdtrain.runtime import distributed
    from hvdtrain.training import train

    cfg = config_mod.from_dict({"etl": {"output": dataset.location, "max_length": 12},
                                "train": {"batch_size": 4}})
    for rank, size, warned in ((0, 8, 1), (3, 8, 0), (0, 3, 0)):
        caplog.clear()
        with caplog.at_level("WARNING", logger="hvdtrain"):
            train.plan(cfg, distributed.RankInfo(rank, size, rank, size, "localhost", "local"))
        lines = [r.getMessage() for r in caplog.records if "etl.min_shards_per_split" in r.getMessage()]
        assert len(lines) == warned, (rank, size, lines)
        if warned:
            assert lines[0].startswith("the train split has 3 shards for 8 ranks")


def test_auto_epochs_fall_with_the_square_root_of_the_train_split() -> None:
    # The two tables the rule was fitted to (docs/models.md "How many epochs"), then its ends.
    assert read_plan.auto_epochs(269_420) == 8 and read_plan.auto_epochs(43_152) == 20
    assert read_plan.auto_epochs(1_000_000) == 4 and read_plan.auto_epochs(16_000_000) == 1
    assert read_plan.auto_epochs(10**10) == 1 and read_plan.auto_epochs(100) == 100 == read_plan.auto_epochs(0)


def test_train_epochs_auto_is_the_default_and_is_resolved_from_the_manifest(dataset: manifest_lib.Manifest) -> None:
    from hvdtrain.core import config as config_mod
    from hvdtrain.core.errors import ConfigError
    from hvdtrain.training import train

    cfg = config_mod.from_dict({"etl": {"output": dataset.location, "max_length": 12}})
    assert cfg.train.epochs == "auto"
    with pytest.raises(RuntimeError, match="still auto"):
        cfg.train.epoch_count  # noqa: B018  # nothing may train on an unresolved auto
    resolved = train.with_epochs(cfg.train, dataset)
    assert resolved.epochs == resolved.epoch_count == read_plan.auto_epochs(90) == 100  # 90 train records
    assert resolved == dataclasses.replace(cfg.train, epochs=100)
    fixed = config_mod.from_dict({"etl": {"output": dataset.location}, "train": {"epochs": 2}}).train
    assert train.with_epochs(fixed, dataset) is fixed
    for bad in (0, "many"):
        with pytest.raises(ConfigError, match="train.epochs"):
            config_mod.from_dict({"train": {"epochs": bad}})


# -- pipelines ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> manifest_lib.Manifest:
    root = tmp_path_factory.mktemp("ds")
    return make_text_dataset(str(root), TextSpec(layout=Layout(n_per_split={"train": 90, "validation": 31,
                                                                            "test": 29}, shards_per_split=3), max_length=12, seed=3))


def _keys(batches) -> list[str]:
    return [k.decode() for batch in batches for k in batch["key"].numpy()]


def test_train_stream_parses_with_the_manifest_spec(dataset: manifest_lib.Manifest) -> None:
    ds = data.train_dataset(dataset, data.TrainStream(rank=0, size=1, batch_size=8, shuffle_buffer=16, seed=1),
                            features=ALL)
    batch = next(iter(ds))
    assert set(batch) == set(ALL)
    assert batch["input_ids"].shape == (8, 12) and batch["input_ids"].dtype.name == "int64"
    assert batch["attention_mask"].shape == (8, 12)
    assert batch["label"].shape == (8,)
    assert batch["key"].dtype.name == "string"


def test_train_stream_repeats_reshuffles_and_covers_every_record(dataset: manifest_lib.Manifest) -> None:
    ds = data.train_dataset(dataset, data.TrainStream(rank=0, size=1, batch_size=10, shuffle_buffer=32, seed=1),
                            features=ALL)
    keys = _keys(itertools.islice(iter(ds), 27))  # three passes of 90 records
    counts = collections.Counter(keys)
    assert set(counts) == {f"train-{i:06d}" for i in range(90)}
    assert max(counts.values()) <= 5  # no record starved or hogged across pass boundaries
    assert keys[:90] != keys[90:180]  # a new order each pass
    again = _keys(itertools.islice(iter(data.train_dataset(dataset, data.TrainStream(rank=0, size=1, batch_size=10,
                                                                                     shuffle_buffer=32, seed=1), features=ALL)), 27))
    assert again == keys  # deterministic for a seed


def test_shuffle_windows_are_uniform_local_and_move_from_pass_to_pass(tmp_path) -> None:
    # One shard of 90 records in key order, windows of 30: each pass is a permutation of the shard in
    # which a record moves less than two windows, and the boundaries move, so records 0 and 31 share
    # the first batches in some passes and not in others.
    m = make_text_dataset(str(tmp_path), TextSpec(layout=Layout(n_per_split={"train": 90, "validation": 4, "test": 4},
                                                                shards_per_split=1)))
    ds = data.train_dataset(m, data.TrainStream(rank=0, size=1, batch_size=10, shuffle_buffer=30, seed=3),
                            features=["key"])
    keys = [int(k.split("-")[1]) for k in _keys(itertools.islice(iter(ds), 9 * 12))]
    passes = [keys[i:i + 90] for i in range(0, len(keys), 90)]
    assert all(sorted(p) == list(range(90)) for p in passes)
    assert all(abs(pos - k) < 60 for p in passes for pos, k in enumerate(p))
    first_window = [set(p[:30]) for p in passes]
    assert any(k >= 30 for w in first_window for k in w)  # a boundary other than 30
    assert len({frozenset(w) for w in first_window}) > 1
    assert len({tuple(p) for p in passes}) == len(passes)
    # A window smaller than a read chunk still spans every file of the cycle (2 shards, windows of 8).
    two = make_text_dataset(str(tmp_path / "two"), TextSpec(layout=Layout(n_per_split={"train": 90, "validation": 4,
                                                                                       "test": 4}, shards_per_split=2)))
    ds = data.train_dataset(two, data.TrainStream(rank=0, size=1, batch_size=8, shuffle_buffer=8, seed=3),
                            features=["key"])
    first = [int(k.split("-")[1]) for k in _keys(itertools.islice(iter(ds), 1))]
    assert min(first) < 45 <= max(first)


@pytest.mark.parametrize("size", [1, 2, 4])  # 4 ranks share 3 shards at record granularity
def test_packed_and_int64_token_features_read_the_same(tmp_path, size: int) -> None:
    kw = dict(layout=Layout(n_per_split=40, shards_per_split=3), num_classes=3, max_length=12, vocab_size=300, seed=4)
    packed = make_text_dataset(str(tmp_path / "packed"), TextSpec(packed=True, **kw))
    plain = make_text_dataset(str(tmp_path / "plain"), TextSpec(packed=False, **kw))
    assert packed.features["input_ids"].encoding == "u16le" and packed.features["attention_mask"].encoding == "u8"
    assert plain.features["input_ids"].encoding == ""
    for rank in range(size):
        a, b = (list(data.eval_dataset(m, "test", rank=rank, size=size, batch_size=7, features=ALL))
                for m in (packed, plain))
        stream = data.TrainStream(rank=rank, size=size, batch_size=5, shuffle_buffer=8, seed=2)
        b_train, a_train = (next(iter(data.train_dataset(m, stream, features=ALL))) for m in (plain, packed))
        for x, y in [*zip(a, b), (a_train, b_train)]:
            for name in ALL:
                assert x[name].dtype == y[name].dtype
                assert x[name].numpy().tolist() == y[name].numpy().tolist()
    import tensorflow as tf

    parser = pipeline.Parser(packed)
    records = next(iter(tf.data.TFRecordDataset(packed.shard_uri(packed.split("test").shards[0])).batch(3)))
    one, three = parser.single(records[1]), parser.batch(records)
    assert all(np.asarray(one[name]).tolist() == np.asarray(three[name][1]).tolist() for name in ALL)


def test_manifest_formats_and_encodings(dataset: manifest_lib.Manifest) -> None:
    body = dataset.to_dict()
    assert body["format_version"] == 2 and "encoding" not in body["features"]["label"]
    old = {**body, "format_version": 1,
           "features": {k: {"dtype": v["dtype"], "shape": v["shape"]} for k, v in body["features"].items()}}
    assert manifest_lib.Manifest.from_dict(old).features["input_ids"] == FeatureSpec("int64", [12])
    with pytest.raises(DataError, match="format_version 3"):
        manifest_lib.Manifest.from_dict({**body, "format_version": 3})
    bad = {**body, "features": {**body["features"], "input_ids": {"dtype": "int64", "shape": [12], "encoding": "u128"}}}
    with pytest.raises(DataError, match="'input_ids' is int64 stored as 'u128'"):
        manifest_lib.Manifest.from_dict(bad)
    unpacked = dataclasses.replace(dataset, features={k: dataclasses.replace(v, encoding="")
                                                      for k, v in dataset.features.items()})
    assert unpacked.to_dict()["format_version"] == 1  # nothing packed: older readers can still read it
    assert manifest_lib.packed_encoding(255) == "u8" and manifest_lib.packed_encoding(65535) == "u16le"
    assert manifest_lib.packed_encoding(65536) == "i32le"


def test_train_streams_of_two_ranks_read_disjoint_shards(dataset: manifest_lib.Manifest) -> None:
    # 3 shards of 30: rank 0 gets two, rank 1 one; each rank's first pass holds only its own records.
    streams = [data.TrainStream(rank=r, size=2, batch_size=10, shuffle_buffer=4, seed=5) for r in range(2)]
    first = [set(_keys(itertools.islice(iter(data.train_dataset(dataset, s, features=["key"])), 3))) for s in streams]
    assert first[0] and first[1] and not first[0] & first[1]


def test_resume_point() -> None:
    assert read_plan.resume_point(0, 50) == (0, 0)
    assert read_plan.resume_point(130, 50) == (2, 30)
    with pytest.raises(ValueError):
        read_plan.resume_point(5, 0)


@pytest.mark.parametrize("size", [1, 2, 4])
def test_an_epoch_reads_each_record_at_most_once_and_the_left_out_ones_rotate(dataset, size: int) -> None:
    """90 records, batches of 4: each epoch takes 88 // (4 x size) steps; every rank's epoch holds distinct
    records of its own share, and the records left out differ between epochs."""
    steps = data.steps_per_epoch(90, 4, size)
    per_epoch = steps * 4
    epochs = []
    for rank in range(size):
        stream = data.TrainStream(rank=rank, size=size, batch_size=4, shuffle_buffer=16, seed=3,
                                  records_per_epoch=per_epoch)
        keys = _keys(itertools.islice(iter(data.train_dataset(dataset, stream, features=["key"])), 3 * steps))
        epochs.append([keys[e * per_epoch:(e + 1) * per_epoch] for e in range(3)])
    for e in range(3):
        seen = [k for rank in epochs for k in rank[e]]
        assert len(seen) == len(set(seen))  # at most once per epoch, across every rank
        assert 90 - len(seen) < size * 4  # fewer than size x batch left out
    left_out = [frozenset(f"train-{i:06d}" for i in range(90)) - {k for rank in epochs for k in rank[e]}
                for e in range(3)]
    assert size == 1 or len(set(left_out)) > 1  # which records sit out rotates


@pytest.mark.parametrize("rank,size", [(0, 1), (1, 2), (0, 4)])  # 4 ranks share 3 shards
@pytest.mark.parametrize("batches_done", [0, 4, 9, 20])  # start, mid pass, a pass boundary (90 / 10), pass 2
def test_resumed_train_stream_equals_the_rest_of_the_uninterrupted_one(dataset, rank: int, size: int,
                                                                       batches_done: int) -> None:
    def stream(start_record: int):
        return data.train_dataset(dataset, data.TrainStream(rank=rank, size=size, batch_size=5, shuffle_buffer=16,
                                                            seed=7), features=["key"], start_record=start_record)

    full = _keys(itertools.islice(iter(stream(0)), batches_done + 12))
    resumed = _keys(itertools.islice(iter(stream(batches_done * 5)), 12))
    assert resumed == full[batches_done * 5:]


@pytest.mark.parametrize("shards,size", [(3, 2), (1, 2), (2, 3), (3, 3)])
def test_eval_reads_every_record_exactly_once_across_ranks(tmp_path, shards: int, size: int) -> None:
    m = make_text_dataset(str(tmp_path), TextSpec(layout=Layout(n_per_split=23, shards_per_split=shards),
                                                  max_length=6, seed=shards))
    keys = []
    for rank in range(size):
        keys += _keys(data.eval_dataset(m, "test", rank=rank, size=size, batch_size=4, features=["key"]))
    assert sorted(keys) == [f"test-{i:06d}" for i in range(23)]


def test_gzip_shards_are_read(tmp_path) -> None:
    m = make_text_dataset(str(tmp_path), TextSpec(layout=Layout(n_per_split=10, shards_per_split=2,
                                                                compression="gzip"), max_length=6))
    keys = _keys(data.eval_dataset(m, "validation", rank=0, size=1, batch_size=3, features=["key"]))
    assert len(keys) == 10


def test_missing_shard_is_named(tmp_path) -> None:
    m = make_text_dataset(str(tmp_path), TextSpec(layout=Layout(n_per_split=10, shards_per_split=2), max_length=6))
    os.remove(os.path.join(str(tmp_path), "test", "part-00001.tfrecord"))
    with pytest.raises(DataError, match=r"shard test/part-00001.tfrecord of split 'test' is missing"):
        data.eval_dataset(m, "test", rank=0, size=1, batch_size=3)


def _remote(tmp_path, m):
    """The same dataset, addressed as if it lived on HDFS; copies come from the local folder."""
    remote = dataclasses.replace(m, location="hdfs://namenode:8020/data/ds/manifest.json")
    copied = []

    def copy(uri: str, local: str) -> None:
        copied.append(uri)
        shutil.copyfile(uri.replace("hdfs://namenode:8020/data", str(tmp_path)), local)

    return remote, copied, copy


def test_remote_shards_are_staged_ahead_and_released_after_their_last_record(tmp_path) -> None:
    m = make_text_dataset(str(tmp_path / "ds"), TextSpec(layout=Layout(n_per_split=40, shards_per_split=4),
                                                         max_length=6))
    remote, copied, copy = _remote(tmp_path, m)
    stage = tmp_path / "stage"
    stage.mkdir()
    source = staging.file_paths(remote, "test", lambda: iter([3, 1, 0, 2]), str(stage), copy=copy)
    got = list(source.paths())
    assert copied == [f"hdfs://namenode:8020/data/ds/test/part-0000{i}.tfrecord" for i in (3, 1, 0, 2)]
    assert [os.path.basename(p).split("-", 1)[1] for p in got] == [f"part-0000{i}.tfrecord" for i in (3, 1, 0, 2)]
    assert os.listdir(stage) == []  # the folder goes when the reader is done
    with pytest.raises(DataError, match="remote shards .* pass a local stage_dir"):
        staging.file_paths(remote, "test", lambda: iter([0]), None, copy=copy)


def test_staged_training_stream_reads_every_record_and_keeps_disk_bounded(tmp_path) -> None:
    import pyarrow.fs as pafs

    from hvdtrain.hadoop import fs

    m = make_text_dataset(str(tmp_path / "data" / "ds"), TextSpec(layout=Layout(n_per_split=80, shards_per_split=8),
                                                                  max_length=6))
    remote = dataclasses.replace(m, location="hdfs://namenode:8020/data/ds/manifest.json")
    # hdfs:// served from a local folder: the real staging path, no cluster needed.
    fs.register_scheme("hdfs", lambda netloc: pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem()))
    stage = tmp_path / "stage"
    stage.mkdir()
    try:
        ds = data.train_dataset(remote, data.TrainStream(rank=0, size=1, batch_size=8, shuffle_buffer=4, seed=3,
                                                         cycle_length=2), stage_dir=str(stage))
        local = data.train_dataset(m, data.TrainStream(rank=0, size=1, batch_size=8, shuffle_buffer=4, seed=3,
                                                       cycle_length=2))
        most = 0
        staged_keys, local_keys = [], []
        for a, b in zip(ds.take(30), local.take(30)):  # three passes over 80 records
            staged_keys += a["key"].numpy().tolist()
            local_keys += b["key"].numpy().tolist()
            most = max(most, sum(len(files) for _, _, files in os.walk(stage)))
    finally:
        fs.register_scheme("hdfs", None)
    assert staged_keys == local_keys  # staging changes where bytes come from, never the data order
    assert 0 < most <= staging.STAGE_AHEAD + 2 * 2 + 2, most


def test_corrupt_and_truncated_shards_are_named_with_expected_and_actual(tmp_path) -> None:
    import pyarrow.fs as pafs

    from hvdtrain.hadoop import fs

    m = make_text_dataset(str(tmp_path / "data" / "ds"), TextSpec(layout=Layout(n_per_split=40, shards_per_split=2),
                                                                  max_length=6))
    shard = m.split("train").shards[1]
    path = tmp_path / "data" / "ds" / shard.path
    body = path.read_bytes()
    path.write_bytes(body[:100] + bytes([body[100] ^ 1]) + body[101:])  # one flipped bit, same size
    remote = dataclasses.replace(m, location="hdfs://namenode:8020/data/ds/manifest.json")
    fs.register_scheme("hdfs", lambda netloc: pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem()))
    stage = tmp_path / "stage"
    stage.mkdir()
    try:
        ds = data.train_dataset(remote, data.TrainStream(rank=0, size=1, batch_size=8, shuffle_buffer=4, seed=3),
                                stage_dir=str(stage))
        with pytest.raises(Exception, match=rf"part-00001.tfrecord has SHA-256 [0-9a-f]{{64}}, expected "
                                            rf"{shard.sha256}"):
            list(ds.take(20))
    finally:
        fs.register_scheme("hdfs", None)
    path.write_bytes(body[:-7])  # truncated in place: found when the plan is made, before any read
    with pytest.raises(DataError, match=rf"shard {shard.path} of split 'train' at .* has {len(body) - 7} bytes but "
                                        rf"the manifest says {len(body)}"):
        data.train_dataset(m, data.TrainStream(rank=0, size=1, batch_size=8, shuffle_buffer=4, seed=3))


def test_stager_reports_copy_failures_naming_the_shard(tmp_path) -> None:
    from hvdtrain.data.staging import ShardStager

    def broken(uri: str, local: str) -> None:
        raise ConnectionError("namenode went away")

    bad = ShardStager([("hdfs://nn/x/s0", "s0")], str(tmp_path / "bad"), copy=broken)
    with pytest.raises(DataError, match="could not stage shard hdfs://nn/x/s0 .* namenode went away"):
        bad.get(0)


# -- manifest vs model ----------------------------------------------------------------------

def _with_feature(m: manifest_lib.Manifest, name: str, spec) -> manifest_lib.Manifest:
    features = dict(m.features)
    if spec is None:
        features.pop(name)
    else:
        features[name] = spec
    return dataclasses.replace(m, features=features)


def test_check_manifest_accepts_the_etl_contract(dataset: manifest_lib.Manifest) -> None:
    shape = data.check_manifest(dataset, ModelConfig())
    assert shape == data.InputShape(max_length=12, vocab_size=64, num_classes=3, label_feature="label")


@pytest.mark.parametrize("name,spec,have,want", [
    ("attention_mask", None, "missing", "int64[12]"),
    ("input_ids", FeatureSpec("float32", [12]), "float32[12]", "int64[12]"),
    ("label", FeatureSpec("int64", [1]), "int64[1]", "int64[]"),
    ("attention_mask", FeatureSpec("int64", [8]), "int64[8]", "int64[12]"),
    ("input_ids", FeatureSpec("int64", []), "int64[]", "int64[max_length]"),
])
def test_check_manifest_names_feature_and_both_specs(dataset: manifest_lib.Manifest, name: str, spec,
                                                      have: str, want: str) -> None:
    with pytest.raises(DataError) as info:
        data.check_manifest(_with_feature(dataset, name, spec), ModelConfig())
    message = str(info.value)
    assert repr(name) in message and have in message and want in message


def test_check_manifest_needs_a_vocabulary_size(dataset: manifest_lib.Manifest) -> None:
    with pytest.raises(DataError, match="vocab.size"):
        data.check_manifest(dataclasses.replace(dataset, vocab={}), ModelConfig())


# -- the tabular contract (model.kind: mlp) ---------------------------------------------------

MLP = ModelConfig(kind="mlp")


@pytest.fixture(scope="module")
def tabular(tmp_path_factory: pytest.TempPathFactory) -> manifest_lib.Manifest:
    from hvdtrain.data.synthetic import make_tabular_dataset

    return make_tabular_dataset(str(tmp_path_factory.mktemp("tab")), TabularSpec(layout=Layout(n_per_split=20),
                                                                                 num_numeric=4, cardinalities=[3,
                                                                                                               6], seed=1))


def test_model_inputs_per_kind() -> None:
    assert contract.MODEL_INPUTS["transformer"] == ("input_ids", "attention_mask")
    assert contract.model_inputs("mlp", ["numeric", "label"]) == ("numeric",)
    assert contract.model_inputs("mlp", ["categorical", "numeric"]) == ("numeric", "categorical")
    with pytest.raises(DataError, match="model.kind 'cnn' has no input contract"):
        contract.model_inputs("cnn", [])


def test_check_manifest_accepts_a_tabular_dataset(tabular: manifest_lib.Manifest) -> None:
    shape = data.check_manifest(tabular, MLP)
    assert shape == data.InputShape(0, 0, 3, "label", kind="mlp", inputs=("numeric", "categorical"),
                                    numeric_features=4, cardinalities=(3, 6), hash_buckets=(0, 0))
    assert shape.input_specs() == {"numeric": ("float32", [4]), "categorical": ("int64", [2])}
    batch = next(iter(data.eval_dataset(tabular, "test", rank=0, size=1, batch_size=5,
                                        features=[*shape.inputs, "label"])))
    assert batch["numeric"].dtype.name == "float32" and batch["numeric"].shape == (5, 4)
    assert batch["categorical"].shape == (5, 2) and int(batch["categorical"].numpy().max()) < 6


def test_numeric_only_tabular_dataset(tmp_path) -> None:
    from hvdtrain.data.synthetic import make_tabular_dataset

    m = make_tabular_dataset(str(tmp_path), TabularSpec(layout=Layout(n_per_split=8), num_numeric=3, cardinalities=[],
                                                        seed=2))
    shape = data.check_manifest(m, MLP)
    assert shape.inputs == ("numeric",) and shape.cardinalities == ()


@pytest.mark.parametrize("name,spec,have,want", [
    ("numeric", FeatureSpec("int64", [4]), "int64[4]", "float32[n]"),
    ("categorical", FeatureSpec("float32", [2]), "float32[2]", "int64[n]"),
    ("categorical", FeatureSpec("int64", []), "int64[]", "int64[n]"),
])
def test_tabular_mismatch_names_feature_and_both_specs(tabular, name: str, spec, have: str, want: str) -> None:
    with pytest.raises(DataError) as info:
        data.check_manifest(_with_feature(tabular, name, spec), MLP)
    message = str(info.value)
    assert repr(name) in message and have in message and want in message and "model.kind=mlp" in message


def test_wrong_model_kind_says_which_kind_fits(tabular, dataset) -> None:
    with pytest.raises(DataError, match="feature 'input_ids' is missing .* set model.kind=mlp"):
        data.check_manifest(tabular, ModelConfig())
    with pytest.raises(DataError, match="needs feature 'numeric' float32\\[n\\] and/or 'categorical' int64\\[n\\]"):
        data.check_manifest(dataset, MLP)


def test_categorical_needs_the_etl_cardinalities(tabular) -> None:
    stats = dict(tabular.preprocessing["tabular"], cardinalities=[3])
    broken = dataclasses.replace(tabular, preprocessing={"tabular": stats})
    with pytest.raises(DataError, match=r"cardinalities is \[3\], but feature 'categorical' is int64\[2\]"):
        data.check_manifest(broken, MLP)
