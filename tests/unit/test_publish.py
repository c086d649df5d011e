"""Rank 0's outputs after training: uploaded whole or not at all, and result.json names only what exists."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from hvdtrain.core.errors import StorageError
from hvdtrain.hadoop import fs, ledger
from tests.support import faulty_fs


def _local(tmp: Path) -> Path:
    local = tmp / "local"
    (local / "saved_model" / "variables").mkdir(parents=True)
    (local / "model.keras").write_bytes(b"new model")
    (local / "eval_report.json").write_text("{}")
    (local / "saved_model" / "saved_model.pb").write_bytes(b"pb")
    (local / "saved_model" / "variables" / "v.data").write_bytes(b"v")
    return local


def _previous(tmp: Path) -> Path:
    out = tmp / "out"
    (out / "saved_model").mkdir(parents=True)
    (out / "model.keras").write_bytes(b"old model")
    (out / "result.json").write_text("{}")
    (out / "saved_model" / "stale.pb").write_bytes(b"old")
    ledger.write(str(out), ledger.Ledger("hvdtrain train", ("model.keras", "result.json", "saved_model/*")))
    return out  # a previous hvdtrain output: its ledger names its files, so it may be replaced


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_failed_upload_names_the_file_and_leaves_the_previous_outputs_whole(tmp_path: Path, monkeypatch) -> None:
    from hvdtrain.training import publish

    monkeypatch.setattr(fs, "with_retries", lambda fn, what, *a, **k: fn())  # no backoff: the fault is permanent
    local, out = _local(tmp_path), _previous(tmp_path)
    before = _tree(out)
    faulty_fs.install(faulty_fs.FaultyHandler(fail=(("write", "saved_model.pb"),),
                                              error=OSError(5, "Input/output error (injected)")))
    try:
        with pytest.raises(StorageError, match=r"^uploading saved_model/saved_model.pb to faulty://.*/out failed "
                                               r"\(OSError: .*Input/output error.*\); the previous outputs in "
                                               r"faulty://.*/out are unchanged"):
            publish.upload_dir(str(local), f"faulty://{out}")
    finally:
        faulty_fs.uninstall()
    assert _tree(out) == before
    assert sorted(os.listdir(tmp_path)) == ["local", "out"]  # no half-uploaded folder left behind


def test_an_upload_replaces_the_outputs_whole_reporting_each_file(tmp_path: Path) -> None:
    from hvdtrain.training import publish

    local, out = _local(tmp_path), _previous(tmp_path)
    heard: list[str] = []
    publish.upload_dir(str(local), str(out), heard.append)
    assert {k: v for k, v in _tree(out).items() if k != ledger.NAME} == _tree(local)  # saved_model/stale.pb gone
    assert heard[0].startswith("uploading eval_report.json (1/4) to ") and heard[-1].startswith("replacing ")
    assert sorted(os.listdir(tmp_path)) == ["local", "out"]


def test_result_json_lists_only_the_exports_that_were_written() -> None:
    from hvdtrain.training import reports

    report = {"evaluation": {"test": {"accuracy": 0.9, "macro_f1": 0.8}, "validation": {"accuracy": 0.85}},
              "rank_digest": {"agree": True}, "training": {"world_size": 2, "epochs": 3}}
    result = reports.result_record("r1", report, "hdfs://nn/out", ["model.keras", "labels.json", "result.json"])
    assert result["exports"] == {"keras": "hdfs://nn/out/model.keras", "labels": "hdfs://nn/out/labels.json"}
    assert reports.result_record("r1", report, "/o")["exports"] == {}  # the other ranks write nothing
