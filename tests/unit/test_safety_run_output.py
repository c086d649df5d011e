"""train.output: replaced only where its ledger says hvdtrain wrote, refused before training otherwise (#54 item 2).

Before, any folder holding a file named ``result.json`` counted as "a previous hvdtrain output" and was replaced
whole: the user's ``thesis.tex`` beside a stray ``result.json`` was deleted at the end of the run.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from hvdtrain.core import config
from hvdtrain.core.errors import DataError
from hvdtrain.hadoop import ledger
from hvdtrain.runtime import distributed


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _local(tmp: Path, model: bytes = b"new model") -> Path:
    local = tmp / f"local-{model.decode().replace(' ', '-')}"
    (local / "saved_model").mkdir(parents=True)
    (local / "model.keras").write_bytes(model)
    (local / "result.json").write_text("{}")
    (local / "saved_model" / "saved_model.pb").write_bytes(b"pb")
    return local


def _users_folder(tmp: Path) -> Path:
    out = tmp / "thesis"
    out.mkdir()
    (out / "result.json").write_text(json.dumps({"x": 1}))
    (out / "thesis.tex").write_text("years of work")
    return out


def test_a_stray_result_json_does_not_make_a_users_folder_replaceable(tmp_path: Path) -> None:
    from hvdtrain.training import publish

    out = _users_folder(tmp_path)
    with pytest.raises(DataError, match=r"^train.output .*thesis holds files hvdtrain did not write "
                                        r"\(result.json, thesis.tex\).*move them out of .*thesis, or choose a new.*"
                                        r"this run's outputs are kept in .*\.thesis\.incoming-"):
        publish.upload_dir(str(_local(tmp_path)), str(out))
    assert (out / "thesis.tex").read_text() == "years of work"
    kept = [p for p in tmp_path.iterdir() if p.name.startswith(".thesis.incoming-")]  # the outputs, not lost
    assert len(kept) == 1 and (kept[0] / "model.keras").read_bytes() == b"new model"
    # The next run (the same pid: in a container rank 0 often is) is refused too, and leaves the kept outputs be.
    with pytest.raises(DataError, match="this run's outputs are kept in"):
        publish.upload_dir(str(_local(tmp_path, b"second model")), str(out))
    assert (kept[0] / "model.keras").read_bytes() == b"new model"


def test_the_refusal_comes_before_training_starts(tmp_path: Path) -> None:
    from hvdtrain.training import train

    out = _users_folder(tmp_path)
    cfg = config.from_dict({"name": "r", "workdir": str(tmp_path), "source": {"table": "demo.t"},
                            "train": {"output": str(out)}, "etl": {"output": str(tmp_path / "no-dataset")}},
                           base_dir=str(tmp_path))
    with pytest.raises(DataError, match=r"thesis holds files hvdtrain did not write .*thesis.tex"):
        train.plan(cfg, distributed.init(use_horovod=False))  # before the manifest is even read
    assert sorted(p.name for p in out.iterdir()) == ["result.json", "thesis.tex"]


def test_a_dataset_that_cannot_be_read_leaves_no_claimed_output(tmp_path: Path) -> None:
    """The output is checked first, but claimed (its ledger written) only once the dataset is read: a dataset
    that is missing, or that HDFS refuses this user (#56 item 2), leaves no new output folder behind."""
    from hvdtrain.training import train

    cfg = config.from_dict({"name": "r", "workdir": str(tmp_path), "source": {"table": "demo.t"},
                            "train": {"output": str(tmp_path / "new-run")},
                            "etl": {"output": str(tmp_path / "no-dataset")}}, base_dir=str(tmp_path))
    with pytest.raises(DataError, match="no dataset at"):
        train.plan(cfg, distributed.init(use_horovod=False))
    assert not (tmp_path / "new-run").exists()


def test_a_run_records_its_output_before_writing_and_replaces_exactly_that(tmp_path: Path, caplog) -> None:
    from hvdtrain.training import publish

    out = tmp_path / "run"
    publish.claim_output(str(out), write=True)  # rank 0, before training
    assert ledger.read(str(out)) is not None
    (out / "tensorboard").mkdir()
    (out / "tensorboard" / "events.out.tfevents.1.host").write_bytes(b"e")  # published while it trains
    publish.upload_dir(str(_local(tmp_path)), str(out))
    assert _tree(out).keys() == {"model.keras", "result.json", "saved_model/saved_model.pb", ledger.NAME}
    publish.claim_output(str(out), write=True)  # the next run on the same output
    (out / "yarn_result.json").write_text("{}")  # its launcher's record
    (out / "model.keras").write_bytes(b"touched")  # a named file: hvdtrain's, whatever is in it
    publish.upload_dir(str(_local(tmp_path, b"second model")), str(out))
    assert (out / "model.keras").read_bytes() == b"second model"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["local-new-model", "local-second-model", "run"]

    (out / "notes.md").write_text("mine")  # appears while the third run trains: refused at the end, kept
    with pytest.raises(DataError, match="notes.md"):
        publish.upload_dir(str(_local(tmp_path, b"third model")), str(out))
    assert (out / "notes.md").read_text() == "mine" and (out / "model.keras").read_bytes() == b"second model"


def test_a_file_put_there_after_the_last_check_is_moved_aside_never_deleted(tmp_path: Path, monkeypatch,
                                                                           caplog) -> None:
    from hvdtrain.training import publish

    out = tmp_path / "run"
    publish.upload_dir(str(_local(tmp_path)), str(out))
    checked = publish.check_replaceable

    def check_then_race(output: str):
        owns = checked(output)
        (out / "notes.md").write_text("mine")  # between the check and the swap
        return owns
    monkeypatch.setattr(publish, "check_replaceable", check_then_race)
    with caplog.at_level(logging.WARNING):
        publish.upload_dir(str(_local(tmp_path, b"second model")), str(out))
    aside = [p for p in tmp_path.iterdir() if ".previous-" in p.name]
    assert len(aside) == 1 and _tree(aside[0]) == {"notes.md": b"mine"}
    assert "notes.md" in caplog.text and str(aside[0]) in caplog.text


def test_an_output_of_an_older_hvdtrain_is_replaced_but_not_with_a_users_file_in_it(tmp_path: Path) -> None:
    from hvdtrain.hadoop import fs
    from hvdtrain.training import publish

    old = tmp_path / "old"
    (old / "saved_model").mkdir(parents=True)
    (old / "result.json").write_text(json.dumps({"report": fs.join(str(old), "eval_report.json")}))
    (old / "eval_report.json").write_text("{}")
    (old / "saved_model" / "saved_model.pb").write_bytes(b"old pb")
    (old / "tensorboard").mkdir()
    (old / "tensorboard" / "events.out.tfevents.0.host").write_bytes(b"e")
    (old / "tensorboard" / "my_plot.png").write_bytes(b"mine")
    with pytest.raises(DataError, match=r"tensorboard/my_plot.png"):
        publish.check_replaceable(str(old))
    (old / "tensorboard" / "my_plot.png").unlink()
    publish.upload_dir(str(_local(tmp_path)), str(old))
    assert _tree(old).keys() == {"model.keras", "result.json", "saved_model/saved_model.pb", ledger.NAME}
