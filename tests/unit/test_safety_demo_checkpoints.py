"""``hvdtrain demo`` deletes only the checkpoints a previous demo run recorded, never a user's files (#54 item 9)."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from hvdtrain import cli
from hvdtrain.core.errors import DataError
from hvdtrain.hadoop import lease, ledger
from hvdtrain.training import demo, leases

DEMO = str(Path(__file__).resolve().parents[2] / "configs" / "demo.yaml")


@pytest.fixture
def run_demo(tmp_path, monkeypatch):
    """``cmd_demo`` with its steps (ETL, training, scoring) and summary faked: what it deletes is real."""
    steps: list[str] = []
    def step(cmd, what, spark_log=None, extra_env=None):
        steps.append(what)
        if what == "training":  # the demo holds the leases for its ranks, taken before it cleared anything
            assert set(extra_env or {}) == {leases.HELD_ENV}

    monkeypatch.setattr(cli, "_step", step)
    monkeypatch.setattr(cli, "demo_summary", lambda cfg: "")

    def run(folder: Path) -> list[str]:
        args = argparse.Namespace(config=DEMO, overrides=[f"workdir={tmp_path / 'work'}",
                                                         f"checkpoint.dir={folder}"], np=2, verbose=False)
        cli.cmd_demo(args)
        return steps
    return run


def test_a_checkpoint_dir_of_the_users_files_is_refused_and_kept(tmp_path, run_demo):
    folder = tmp_path / "mine"
    (folder / "ckpt-0000000010").mkdir(parents=True)
    (folder / "ckpt-0000000010" / "COMMIT").write_text("")
    (folder / "notes.txt").write_text("three weeks of training")
    with pytest.raises(DataError) as refused:
        run_demo(folder)
    assert (folder / "notes.txt").read_text() == "three weeks of training"
    assert (folder / "ckpt-0000000010" / "COMMIT").exists()
    assert "\n" not in str(refused.value) and str(folder) in str(refused.value) and "notes.txt" in str(refused.value)


def test_the_previous_demo_runs_checkpoints_go_and_a_file_it_did_not_write_stays(tmp_path, run_demo):
    folder = tmp_path / "ckpt"
    assert run_demo(folder) == ["the ETL", "training", "scoring the test split"]
    assert ledger.read(str(folder)).writer == demo.WRITER  # recorded before training wrote there
    (folder / "ckpt-0000000040").mkdir()
    (folder / "ckpt-0000000040" / "state.bin").write_bytes(b"x")
    (folder / ".staging-50-abc").mkdir()
    (folder / ".staging-50-abc" / "meta.json").write_text("{}")
    (folder / "notes.txt").write_text("mine")
    run_demo(folder)
    assert sorted(p.name for p in folder.iterdir()) == [ledger.NAME, "notes.txt"]


def test_plan_reset_is_pure():
    owned = demo.checkpoint_ledger()
    assert demo.plan_reset("/c", [], None) == demo.Reset((), owned)
    files = ["ckpt-0000000040/state.bin", ".staging-9-x/meta.json", "notes.txt", ledger.NAME]
    assert demo.plan_reset("/c", files, owned).delete == ("ckpt-0000000040/state.bin", ".staging-9-x/meta.json")
    with pytest.raises(DataError, match="no demo run recorded"):
        demo.plan_reset("/c", ["ckpt-0000000040/state.bin"], None)
    with pytest.raises(DataError, match="hvdtrain etl"):
        demo.plan_reset("/c", [ledger.NAME], ledger.Ledger("hvdtrain etl", ("*",)))


def test_a_demo_never_clears_checkpoints_from_under_a_job_that_holds_them(tmp_path, run_demo):
    folder = tmp_path / "ckpt"
    run_demo(folder)
    (folder / "ckpt-0000000040").mkdir()
    (folder / "ckpt-0000000040" / "state.bin").write_bytes(b"x")
    with lease.acquire(str(folder), f"checkpoint.dir {folder}"):  # the previous demo's training still runs
        with pytest.raises(lease.LeaseHeld, match=f"checkpoint.dir {folder} is being written by"):
            run_demo(folder)
        assert (folder / "ckpt-0000000040" / "state.bin").read_bytes() == b"x"
