"""Training never overwrites what it did not write (#28 item 4) and its uploads keep the stall clock moving (item 5)."""
from __future__ import annotations

import numpy as np
import pytest

from hvdtrain.core import config
from hvdtrain.core.errors import ConfigError, DataError
from hvdtrain.runtime import distributed
from hvdtrain.training import checkpoint, resume


def _cfg(tmp_path, **ckpt) -> config.JobConfig:
    return config.from_dict({"name": "s", "workdir": str(tmp_path), "source": {"table": "demo.t"},
                             "checkpoint": ckpt}, base_dir=str(tmp_path))


def test_resume_never_over_committed_checkpoints_is_refused_and_they_stay(tmp_path):
    cfg = _cfg(tmp_path, resume="never")
    writer = checkpoint.CheckpointWriter(cfg.checkpoint.dir, 3, 0, None, "max")
    writer.save(10, {"model/0000/w": np.ones(3, np.float32)}, {"step": 10})
    writer.wait()
    rank = distributed.init(use_horovod=False)
    with pytest.raises(DataError, match=r"checkpoint.resume=never, but checkpoint.dir .* holds committed "
                                        r"checkpoints \(ckpt-0*10\).*new folder"):
        resume.find(cfg.checkpoint, rank, {})
    assert [i.step for i in checkpoint.scan(cfg.checkpoint.dir)] == [10]
    fresh = _cfg(tmp_path / "other", resume="never")
    assert resume.find(fresh.checkpoint, rank, {}) is None  # a new folder starts fresh


def test_checkpoints_inside_train_output_are_refused_before_anything_runs(tmp_path):
    """train.output is replaced whole at the end of a run: checkpoints inside it would be refused then (after
    the training) or lost, so the config refuses them, naming both folders."""
    def job(out: str, ckpt: str, **extra) -> config.JobConfig:
        return config.from_dict({"name": "s", "workdir": str(tmp_path), "source": {"table": "demo.t"},
                                 "train": {"output": out}, "checkpoint": {"dir": ckpt, **extra}},
                                base_dir=str(tmp_path))

    with pytest.raises(ConfigError, match=r"checkpoint.dir is inside train.output \(hdfs://nn:8020/u/run/\).*"
                                          r"got 'hdfs://nn:8020/u/run/ckpt'"):
        job("hdfs://nn:8020/u/run/", "hdfs://nn:8020/u/run/ckpt")
    with pytest.raises(ConfigError, match="checkpoint.dir"):
        job("out", "out")
    for out, ckpt in (("out", "./out/ckpt"), ("out", str(tmp_path / "out" / "ckpt")), ("out", "x/../out/ckpt"),
                      (f"file:{tmp_path}/out", "out/ckpt"), ("{workdir}/runs/{name}", f"{tmp_path}/runs/s/c"),
                      ("hdfs://nn:8020/u/run", "hdfs:///u/run/ckpt"), ("hdfs://nn/u/run", "webhdfs://nn:9870/u/run/c")):
        with pytest.raises(ConfigError, match="checkpoint.dir"):  # the same folder, written another way
            job(out, ckpt)
    assert job("hdfs://nn:8020/u/run", "hdfs://nn:8020/u/run-ckpt").checkpoint.dir.endswith("run-ckpt")  # a sibling
    assert job("hdfs://a/u/run", "hdfs://b/u/run/ckpt").checkpoint.dir  # another cluster's namespace
    assert job("out", "out/ckpt", enabled=False).train.output.endswith("out")  # no checkpoints: nothing at risk


def test_train_output_replaces_only_an_empty_folder_or_a_previous_hvdtrain_output(tmp_path):
    from hvdtrain.training import publish as train

    local = tmp_path / "local"
    local.mkdir()
    (local / "result.json").write_text("{}")
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match=r"train.output .*home holds files hvdtrain did not write \(notes.txt\)"):
        train.upload_dir(str(local), str(home))
    assert (home / "notes.txt").read_text() == "mine"
    train.upload_dir(str(local), str(tmp_path / "new"))
    train.upload_dir(str(local), str(tmp_path / "new"))  # a previous output is replaced
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == ["_hvdtrain_ledger.json", "result.json"]
    failed_try = tmp_path / "failed"  # a YARN launch whose try failed left only its record of the ranks
    failed_try.mkdir()
    (failed_try / "yarn_result.json").write_text('{"ok": false}')
    train.upload_dir(str(local), str(failed_try))  # the rerun may replace it
    assert sorted(p.name for p in failed_try.iterdir()) == ["_hvdtrain_ledger.json", "result.json"]


def test_every_mlflow_upload_is_progress_the_stall_watchdog_sees(tmp_path):
    """A slow artifact store: each file and each call restarts the stall clock (the trainer's phase)."""
    from hvdtrain.observe import tracking
    from hvdtrain.runtime import watchdog

    now = [0.0]
    dog = watchdog.Watchdog(timeout=5.0, rank=0, clock=lambda: now[0])
    cfg = config.from_dict({"name": "s", "workdir": str(tmp_path), "source": {"table": "demo.t"},
                            "tracking": {"uri": str(tmp_path / "mlflow")}}, base_dir=str(tmp_path))
    tracker = tracking.Tracker(cfg)
    tracker.start({})
    folder = tmp_path / "saved_model"
    (folder / "variables").mkdir(parents=True)
    for name in ("saved_model.pb", "variables/v.index", "variables/v.data"):
        (folder / name).write_bytes(b"x")
    heard = []

    def phase(what):
        heard.append(what)
        dog.phase(what)

    mlflow = tracker._mlflow
    real = mlflow.log_artifact

    def slow_store(path, where=None):  # 4 s per file: 12 s in all, against a 5 s stall timeout
        now[0] += 4.0
        assert dog.check() is None, dog.check()
        return real(path, where)

    tracker._mlflow = type("M", (), {"log_artifact": staticmethod(slow_store)})()
    tracker.progress = phase
    try:
        tracker.log_artifact(str(folder), "serving")
    finally:
        tracker._mlflow, tracker.progress = mlflow, lambda what: None
        tracker.end()
    assert heard == ["log_artifact serving/saved_model.pb", "log_artifact serving/variables/v.data",
                     "log_artifact serving/variables/v.index"]
    assert tracker.not_logged == []
