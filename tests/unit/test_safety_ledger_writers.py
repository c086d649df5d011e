"""A ledger speaks for the command that wrote it only (issue 54, "a ledger before every delete").

train.output pointed at a dataset, or etl.output at a run's outputs, must be refused in one line: each
command's ledger names every file of its folder, so accepting another command's ledger as its own would let
training replace a dataset (its manifest and shards deleted) or an ETL --overwrite delete a trained model.
"""
from __future__ import annotations

import os

import pytest

from etl import publish as etl_publish
from hvdtrain.core.errors import DataError
from hvdtrain.hadoop import ledger
from hvdtrain.training import publish as train_publish


def _folder(root, writer: str, names: list[str]) -> str:
    out = os.path.join(root, "shared")
    for name in names:
        os.makedirs(os.path.dirname(os.path.join(out, name)), exist_ok=True)
        with open(os.path.join(out, name), "w") as fh:
            fh.write(name)
    ledger.write(out, ledger.Ledger(writer, tuple(ledger.exact(n) for n in names)))
    return out


def _contents(out: str) -> dict[str, str]:
    found = {}
    for root, _, names in os.walk(out):
        for name in names:
            with open(os.path.join(root, name)) as fh:
                found[os.path.relpath(os.path.join(root, name), out)] = fh.read()
    return found


def test_training_refuses_a_dataset_folder_as_its_output_and_deletes_nothing(tmp_path) -> None:
    out = _folder(tmp_path, etl_publish.WRITER, ["manifest.json", "train/part-00000-of-00001.tfrecord"])
    before = _contents(out)
    with pytest.raises(DataError) as info:
        train_publish.claim_output(out, write=True)
    message = str(info.value)
    assert "train.output" in message and "'hvdtrain etl'" in message and "choose another folder" in message
    assert "\n" not in message and _contents(out) == before


def test_the_etl_refuses_a_run_output_as_its_dataset_and_deletes_nothing(tmp_path) -> None:
    out = _folder(tmp_path, train_publish.WRITER, ["model.keras", "result.json", "eval_report.json"])
    before = _contents(out)
    with pytest.raises(DataError) as info:
        etl_publish.check_claim(out)
    message = str(info.value)
    assert "etl.output" in message and "'hvdtrain train'" in message and "\n" not in message
    assert _contents(out) == before


def test_each_command_still_takes_its_own_ledger(tmp_path) -> None:
    run = _folder(tmp_path / "run", train_publish.WRITER, ["model.keras"])
    train_publish.claim_output(run, write=False)  # its own earlier output: replaceable
    data = _folder(tmp_path / "data", etl_publish.WRITER, ["manifest.json"])
    assert etl_publish.check_claim(data) == ["manifest.json"]


def test_the_leases_own_temporary_files_are_not_taken_for_a_users(tmp_path) -> None:
    # A lease renewal writes <lease>.tmp-* then renames it; a broken stale lease is moved to <lease>.broken-*.
    # Seen by the publish's walk (or left by a run killed mid-renewal), neither may make etl.output "foreign".
    from hvdtrain.hadoop import lease

    data = _folder(tmp_path, etl_publish.WRITER, ["manifest.json"])
    for name in (lease.NAME, lease.NAME + ".tmp-1a2b3c4d", lease.NAME + ".broken-5e6f7a8b"):
        with open(os.path.join(data, name), "w") as fh:
            fh.write("{}")
    assert etl_publish.check_claim(data) == ["manifest.json"]
