"""``etl --overwrite`` deletes only what a ledger or a published manifest names, never by name (#54 item 1).

Before, any folder named like one hvdtrain writes (``train/``, ``test/``, ``rejects/``, ``v-*``) under
etl.output counted as hvdtrain's: ``--overwrite`` deleted a user's raw CSV files in ``/proj/train/``.
The publish is driven as etl.job.run drives it (check_output, then plan_publish and act).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from etl import job as etl_job
from etl import publish, writer
from etl.accounting import RowCounts
from hvdtrain.core import config
from hvdtrain.core.errors import DataError
from hvdtrain.data import manifest
from hvdtrain.hadoop import fs, ledger
from tests.unit.test_safety_etl_output import ROWS, stage_shards

SHARDS = writer.ShardPlan({"train": 1, "validation": 1, "test": 1})


def _publish(out: Path, tag: str, tmp: Path, rejects: bool = False) -> dict:
    cfg = config.from_dict({"name": "ow", "workdir": str(tmp), "source": {"table": "db.t"},
                            "etl": {"output": str(out), "max_length": 8, "overwrite": True}}, base_dir=str(tmp))
    replacing = etl_job.check_output(cfg.etl)
    staging = fs.join(str(out), "_staging", tag)
    results = stage_shards(out, tag)
    rejected = {}
    if rejects:
        fs.write_bytes_atomic(fs.join(staging, "rejects", "part-0.parquet"), f"rejects of {tag}".encode())
        rejected = {"text_null": 1}
    counts = RowCounts(rows_in=10 + len(rejected), rejected=rejected, before_dedup=10, after_dedup=10,
                       label_unknown=0, by_split=dict(ROWS), written=dict(ROWS))
    fitted = publish.Fitted(labels=["a"], text_specs=manifest.text_features(8, 4), vocab=["[PAD]", "[UNK]"],
                            tokenizer_json="{}")
    facts = publish.RunFacts(staging=staging, stage_seconds={}, created_at=tag, versions={},
                             generation=f"v-{tag}" if replacing else "")
    try:
        report = publish.act(publish.plan_publish(cfg, SHARDS, results, fitted, counts, facts))
    except BaseException:
        fs.delete(staging)  # as etl.job.run cleans up
        raise
    fs.delete(fs.join(str(out), "_staging"))
    return report


def _raw_project(tmp: Path) -> Path:
    proj = tmp / "proj"
    for split in ("train", "test"):
        (proj / split).mkdir(parents=True)
        (proj / split / "raw.csv").write_text(f"id,text\n1,{split} rows\n")
    return proj


def test_overwrite_never_deletes_raw_files_in_folders_named_like_a_dataset(tmp_path: Path) -> None:
    proj = _raw_project(tmp_path)
    with pytest.raises(DataError, match=r"^etl.output .*proj holds files hvdtrain did not write "
                                        r"\(test/raw.csv, train/raw.csv\).*move them out of .*proj, or choose"):
        _publish(proj, "A", tmp_path)
    assert (proj / "train" / "raw.csv").read_text() == "id,text\n1,train rows\n"
    assert (proj / "test" / "raw.csv").read_text() == "id,text\n1,test rows\n"
    assert not (proj / "manifest.json").exists() and not (proj / "validation").exists()  # nothing moved in


def test_a_users_file_inside_a_published_datasets_folder_is_refused_and_kept(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    _publish(out, "A", tmp_path, rejects=True)
    (out / "train" / "README.md").write_text("how I made these")  # beside hvdtrain's shard
    with pytest.raises(DataError, match=r"holds files hvdtrain did not write \(train/README.md\)"):
        _publish(out, "B", tmp_path)
    assert (out / "train" / "README.md").read_text() == "how I made these"
    assert manifest.read(str(out)).created_at == "A"
    (out / "train" / "README.md").unlink()
    _publish(out, "B", tmp_path, rejects=True)
    assert manifest.read(str(out)).created_at == "B"
    assert sorted(p.name for p in out.iterdir()) == [ledger.NAME, "etl_report.json", "manifest.json", "rejects",
                                                     "v-B"]
    assert (out / "rejects" / "part-0.parquet").read_text() == "rejects of B"


def test_only_a_version_folder_a_ledger_recorded_is_deleted(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    _publish(out, "A", tmp_path)
    recorded = ledger.read(str(out))
    assert recorded is not None and recorded.writer == "hvdtrain etl"
    (out / "v-dead" / "train").mkdir(parents=True)  # a run killed mid-publish: its ledger named its folder
    (out / "v-dead" / "train" / "part-0.tfrecord").write_bytes(b"half")
    ledger.write(str(out), recorded.adding(ledger.tree("v-dead")))
    _publish(out, "B", tmp_path)
    assert not (out / "v-dead").exists() and not (out / "train").exists()
    (out / "v-mine").mkdir()  # a user's folder that only looks like a version folder
    (out / "v-mine" / "data.csv").write_text("mine")
    with pytest.raises(DataError, match=r"v-mine/data.csv"):
        _publish(out, "C", tmp_path)
    assert (out / "v-mine" / "data.csv").read_text() == "mine" and manifest.read(str(out)).created_at == "B"


def test_a_dataset_written_before_ledgers_is_replaced_by_what_its_manifest_names(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    _publish(out, "A", tmp_path, rejects=True)
    (out / ledger.NAME).unlink()  # as an older hvdtrain left it
    assert json.loads((out / "etl_report.json").read_text())["rows_rejected"] == 1
    _publish(out, "B", tmp_path, rejects=True)
    assert sorted(p.name for p in out.iterdir()) == [ledger.NAME, "etl_report.json", "manifest.json", "rejects",
                                                     "v-B"]


# -- the refusal before any Spark work, and the run's own staging (#54 item 1, etl.job) -------------------

class _NoSpark:
    """A SparkSession that must not be used: the refusal comes before any Spark work."""

    def __getattr__(self, name: str):
        raise AssertionError(f"Spark was used ({name}) before etl.output was checked")


def _job(out: Path, tmp: Path, overwrite: bool) -> config.JobConfig:
    return config.from_dict({"name": "ow", "workdir": str(tmp), "source": {"table": "db.t"},
                             "etl": {"output": str(out), "max_length": 8, "overwrite": overwrite}}, base_dir=str(tmp))


@pytest.mark.parametrize("overwrite", [False, True])
def test_raw_files_are_refused_in_one_line_before_any_spark_work(tmp_path: Path, overwrite: bool) -> None:
    proj = _raw_project(tmp_path)
    with pytest.raises(DataError) as err:
        etl_job.run(_NoSpark(), _job(proj, tmp_path, overwrite))
    message = str(err.value)
    assert "\n" not in message and "holds files hvdtrain did not write (test/raw.csv, train/raw.csv)" in message
    assert "pass --overwrite" not in message and "unfinished" not in message  # never suggested for foreign files
    assert sorted(str(p.relative_to(proj)) for p in proj.rglob("*")) == ["test", "test/raw.csv", "train",
                                                                          "train/raw.csv"]  # nothing written


def test_a_file_named_like_hvdtrains_but_unrecorded_is_foreign_and_never_suggests_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    out.mkdir()
    (out / "vocab.txt").write_text("a user's vocabulary")  # a name hvdtrain writes, but no ledger names it
    with pytest.raises(DataError, match=r"did not write \(vocab.txt\)") as err:
        etl_job.check_output(_job(out, tmp_path, overwrite=False).etl)
    assert "pass --overwrite" not in str(err.value)


def test_the_ledger_names_the_runs_staging_before_anything_is_staged(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    _publish(out, "A", tmp_path)
    (out / "_staging" / "other").mkdir(parents=True)  # another run's staging: never this run's to delete
    (out / "_staging" / "other" / "0.tf").write_bytes(b"theirs")
    seen = {}

    class Spark:
        def __getattr__(self, name: str):  # the first Spark work: the ledger must already name this run's staging
            found = ledger.read(str(out))
            seen["entries"] = [e for e in found.entries if e.startswith("_staging/")] if found else []
            raise RuntimeError("the cluster went away")

    with pytest.raises(RuntimeError, match="went away"):
        etl_job.run(Spark(), _job(out, tmp_path, overwrite=True))
    assert len(seen["entries"]) == 1 and re.fullmatch(r"_staging/[0-9a-f]{12}/\*", seen["entries"][0])
    assert (out / "_staging" / "other" / "0.tf").read_bytes() == b"theirs"
    assert manifest.read(str(out)).created_at == "A"


def test_finishing_a_run_removes_only_its_own_staging_then_the_folder_if_empty(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    for run_id in ("a1", "b2"):
        (out / "_staging" / run_id / "rejects").mkdir(parents=True)
        (out / "_staging" / run_id / "rejects" / "part-0").write_text(run_id)
    etl_job.clean_staging(str(out), "a1")
    assert sorted(p.name for p in (out / "_staging").iterdir()) == ["b2"]
    assert (out / "_staging" / "b2" / "rejects" / "part-0").read_text() == "b2"
    etl_job.clean_staging(str(out), "b2")
    assert not (out / "_staging").exists()
