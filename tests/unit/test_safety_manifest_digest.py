"""The manifest digest is the dataset's content: an ETL rerun of the same data keeps every checkpoint resumable.

Before, the digest hashed ``created_at`` (and the versions and the rerun's version folder), so rerunning the ETL
on unchanged data made every checkpoint of the dataset unresumable (exit 3, "resuming would mix datasets").
"""
from __future__ import annotations

import dataclasses

import pytest

from hvdtrain.core import config
from hvdtrain.core.errors import DataError
from hvdtrain.data import manifest
from hvdtrain.training import resume


def _manifest(created_at: str = "2026-01-01T00:00:00+00:00", folder: str = "", sha: str = "a" * 64,
              versions: dict | None = None) -> manifest.Manifest:
    prefix = f"{folder}/" if folder else ""
    shard = manifest.Shard(path=f"{prefix}train/part-00000-of-00001.tfrecord", records=10, bytes=100, sha256=sha,
                           class_counts={"a": 6, "b": 4})
    return manifest.Manifest(
        features={"label": manifest.FeatureSpec("int64", [])}, label_feature="label", labels=["a", "b"],
        splits={"train": manifest.Split([shard]), "validation": manifest.Split([]), "test": manifest.Split([])},
        vocab={"path": f"{prefix}vocab.txt", "tokenizer": f"{prefix}tokenizer.json", "size": 9},
        versions=versions or {"hvdtrain": "1.0"}, created_at=created_at, etl_config_hash="h")


def _cfg(tmp_path) -> config.JobConfig:
    return config.from_dict({"name": "r", "workdir": str(tmp_path), "source": {"table": "demo.t"},
                             "train": {"epochs": 3}},  # as training resolves train.epochs: auto
                            base_dir=str(tmp_path))


def test_two_manifests_differing_only_in_when_and_where_have_one_digest() -> None:
    first = _manifest()
    rerun = _manifest(created_at="2026-02-02T12:00:00+00:00", folder="v-0123abcd", versions={"hvdtrain": "1.1"})
    assert first.digest() == rerun.digest()
    assert first.digest() != _manifest(sha="b" * 64).digest()  # other data is another dataset
    other_labels = dataclasses.replace(first, labels=["b", "a"])
    assert first.digest() != other_labels.digest()


def test_a_checkpoint_resumes_after_an_etl_rerun_of_the_same_data(tmp_path) -> None:
    dataset = str(tmp_path / "data")
    manifest.write(_manifest(), dataset)
    before = manifest.read(dataset)
    cfg = _cfg(tmp_path)
    saved = {**resume.layout(cfg, 1, 5, before.digest(), before.legacy_digest()), "step": 10}
    manifest.write(_manifest(created_at="2026-03-03T00:00:00+00:00", folder="v-feedbeef"), dataset)  # the rerun
    after = manifest.read(dataset)
    assert resume.check_layout(saved, resume.layout(cfg, 1, 5, after.digest(), after.legacy_digest()),
                               "ckpt-10") == ([], 0)
    manifest.write(_manifest(sha="c" * 64), dataset)  # new data: still refused
    changed = manifest.read(dataset)
    with pytest.raises(DataError, match="resuming would mix datasets"):
        resume.check_layout(saved, resume.layout(cfg, 1, 5, changed.digest(), changed.legacy_digest()), "ckpt-10")


def test_a_checkpoint_saved_before_the_content_digest_still_resumes_on_its_unchanged_dataset(tmp_path) -> None:
    dataset = str(tmp_path / "data")
    manifest.write(_manifest(), dataset)
    m = manifest.read(dataset)
    cfg = _cfg(tmp_path)
    old_meta = {**resume.layout(cfg, 1, 5, m.legacy_digest()), "step": 10}  # what older versions saved
    old_meta.pop("manifest_digest_legacy", None)
    assert resume.check_layout(old_meta, resume.layout(cfg, 1, 5, m.digest(), m.legacy_digest()),
                               "ckpt-10") == ([], 0)
    assert m.matches_digest(m.legacy_digest()) and m.matches_digest(m.digest())
    assert not m.matches_digest("0" * 16)
