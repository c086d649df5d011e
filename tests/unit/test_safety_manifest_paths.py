"""A manifest names files only inside its dataset folder (#28 item 9)."""
from __future__ import annotations

import json

import pytest

from hvdtrain.core.errors import DataError
from hvdtrain.data import manifest
from hvdtrain.hadoop import fs


def test_a_uri_join_never_leaves_its_base():
    assert fs.join("hdfs://nn/ds", "/x") == "hdfs://nn/ds/x"
    assert fs.join("webhdfs://nn:9870/ds/", "train", "/part-0") == "webhdfs://nn:9870/ds/train/part-0"


def _doc(shard_path: str = "train/part-00000", tokenizer: str = "tokenizer.json") -> dict:
    return {"format_version": 1, "features": {"label": {"dtype": "int64", "shape": []}}, "label_feature": "label",
            "labels": ["a"], "splits": {"train": {"shards": [{"path": shard_path, "records": 1, "bytes": 1, "sha256": "0" * 64}]}},
            "vocab": {"path": "vocab.txt", "tokenizer": tokenizer}}


@pytest.mark.parametrize("path", ["/etc/krb5.keytab", "../../secrets/keytab", "train/../../x", "hdfs://nn/x",
                                  "file:/etc/passwd", "~/x", "", "train//x", "..\\\\x"])
def test_shard_paths_outside_the_dataset_are_a_data_error_naming_the_entry(tmp_path, path):
    (tmp_path / "manifest.json").write_text(json.dumps(_doc(shard_path=path)))
    with pytest.raises(DataError, match=r"manifest.json: splits.train.shards\[0\].path is .*inside its dataset"):
        manifest.read(str(tmp_path))


def test_a_tokenizer_outside_the_dataset_is_refused(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps(_doc(tokenizer="/home/alice/.ssh/id_rsa")))
    with pytest.raises(DataError, match=r"vocab.tokenizer is '/home/alice/.ssh/id_rsa'"):
        manifest.read(str(tmp_path))
    (tmp_path / "manifest.json").write_text(json.dumps(_doc(shard_path="v-abc/train/part-00000")))
    assert manifest.read(str(tmp_path)).split("train").shards[0].path == "v-abc/train/part-00000"
