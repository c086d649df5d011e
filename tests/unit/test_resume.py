"""What a training checkpoint holds and how it comes back (single process, real Keras model and optimizer)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from hvdtrain import data
from hvdtrain.core import config
from hvdtrain.core.errors import DataError
from hvdtrain.data.contract import InputShape
from hvdtrain.observe.events import EpochStats, LoopState
from hvdtrain.runtime import distributed
from hvdtrain.training import checkpoint, resume
from hvdtrain.training.context import TrainContext

SHAPE = InputShape(max_length=8, vocab_size=50, num_classes=2, label_feature="label")
TINY = {"embed_dim": 8, "num_heads": 2, "ff_dim": 16, "num_layers": 1, "dropout": 0.2}


def _cfg(tmp_path, **checkpoint_cfg) -> config.JobConfig:
    return config.from_dict({"name": "r", "workdir": str(tmp_path), "source": {"table": "demo.t"}, "model": TINY,
                             "train": {"epochs": 3},  # as training resolves train.epochs: auto
                             "checkpoint": {"every_steps": 2, **checkpoint_cfg}}, base_dir=str(tmp_path))


def _trained(cfg: config.JobConfig, n: int = 3):
    from hvdtrain.training import state, steps

    model, optimizer = state.build_state(cfg, SHAPE, 1, total_steps=10)
    step = steps.make_train_step(model, optimizer, "label", ["input_ids", "attention_mask"])
    rng = np.random.default_rng(0)
    for _ in range(n):  # dropout draws advance the seed generators, Adam fills its moments
        batch = {"input_ids": rng.integers(1, 50, (4, 8)), "attention_mask": np.ones((4, 8), np.int64),
                 "label": rng.integers(0, 2, 4)}
        step(batch)
    return model, optimizer


def _layout(cfg, digest="d1", world=1):
    return resume.layout(cfg, world, 5, digest)


class _Tracker:  # what the checkpointer reads of the MLflow run
    def __init__(self, run_id=None):
        self.run_id = run_id


def _saver(cfg, rank, model, optimizer, layout, run_id=None) -> resume.Checkpointer:
    """A checkpointer for 5 steps per epoch, in a run context without data (it reads none)."""
    ctx = TrainContext(cfg, None, SHAPE, rank, 5, "", _Tracker(run_id), layout)
    return resume.Checkpointer(ctx, model, optimizer)


def test_a_saved_state_comes_back_exactly_in_a_fresh_model(tmp_path) -> None:
    from hvdtrain.training import state

    rank = distributed.init(use_horovod=False)
    cfg = _cfg(tmp_path)
    model, optimizer = _trained(cfg)
    saver = _saver(cfg, rank, model, optimizer, _layout(cfg), run_id="abc")
    history = [EpochStats(1, 5, 20, 0.7, 0.5, 1.0)]
    saver.after_step(LoopState(8, 2, False, lambda: np.array([1.5, 3.0, 8.0]), 2.5, history))
    saver.after_step(LoopState(9, 2, False, lambda: np.zeros(3), 0.0, history))  # not due: no save
    saver.close()
    assert saver.saved == [8] and [i.step for i in checkpoint.scan(cfg.checkpoint.dir)] == [8]

    found = resume.find(cfg.checkpoint, rank, _layout(cfg))
    assert found is not None and found.step == 8 and found.run_id == "abc"
    fresh, fresh_opt = state.build_state(cfg, SHAPE, 1, total_steps=10)
    resume.apply(found, fresh, fresh_opt, rank, None)
    for a, b in ((model.weights, fresh.weights), (optimizer.variables, fresh_opt.variables),
                 (resume.seed_variables(model), resume.seed_variables(fresh))):
        assert len(a) == len(b) > 0
        for x, y in zip(resume.to_numpy(a), resume.to_numpy(b)):
            np.testing.assert_array_equal(x, y)
    start = found.start(rank)
    assert start.step == 8 and list(start.carried) == [1.5, 3.0, 8.0] and start.carried_seconds == 2.5
    assert [h.epoch for h in start.history] == [1] and not start.stopped


def test_resume_never_and_an_empty_folder_start_fresh(tmp_path) -> None:
    rank = distributed.init(use_horovod=False)
    assert resume.find(_cfg(tmp_path).checkpoint, rank, _layout(_cfg(tmp_path))) is None
    cfg = _cfg(tmp_path, resume="never")
    os.makedirs(cfg.checkpoint.dir)
    assert resume.find(cfg.checkpoint, rank, _layout(cfg)) is None


def test_a_changed_dataset_is_refused_and_a_changed_seed_or_model_warned(tmp_path) -> None:
    cfg = _cfg(tmp_path)
    saved = {**_layout(cfg), "step": 12}
    with pytest.raises(DataError, match="dataset digest d1 but the manifest now has d2"):
        resume.check_layout(saved, _layout(cfg, digest="d2"), "ckpt-12")
    assert resume.check_layout(saved, _layout(cfg), "ckpt-12") == ([], 0)
    reseeded = config.from_dict({**cfg.to_dict(), "train": {**cfg.to_dict()["train"], "seed": 7,
                                                            "shuffle_buffer": 64}}, base_dir=str(tmp_path))
    warnings, step = resume.check_layout(saved, _layout(reseeded), "ckpt-12")
    assert step == 0 and len(warnings) == 1
    assert f"seed {cfg.train.seed} -> 7" in warnings[0] and "shuffle_buffer" in warnings[0] and "data order" in warnings[0]
    warnings, step = resume.check_layout({**saved, "input_order": 1}, _layout(cfg), "ckpt-12")  # older reader
    assert step == 0 and len(warnings) == 1 and f"input_order 1 -> {data.INPUT_ORDER}" in warnings[0]
    wider = config.from_dict({**cfg.to_dict(), "model": {**TINY, "dropout": 0.3}}, base_dir=str(tmp_path))
    warnings, step = resume.check_layout(saved, _layout(wider), "ckpt-12")
    assert step == 0 and len(warnings) == 1 and "changed model config" in warnings[0]
    # another objective (issue 53: task.target_transform, class weights, the positive label) is named too
    other = config.from_dict({**cfg.to_dict(), "task": {"kind": "multiclass", "class_weights": "balanced"}},
                             base_dir=str(tmp_path))
    warnings, step = resume.check_layout(saved, _layout(other), "ckpt-12")
    assert step == 0 and len(warnings) == 1 and "changed task config" in warnings[0]
    assert resume.check_layout({k: v for k, v in saved.items() if k != "task_digest"}, _layout(other),
                               "ckpt-12") == ([], 0)  # a checkpoint from before the task digest: nothing to compare


def test_a_changed_world_or_batch_size_resumes_only_from_an_epoch_end(tmp_path) -> None:
    cfg = _cfg(tmp_path)
    mid = {**_layout(cfg), "step": 12}  # 5 steps per epoch: 2 of 5 steps into epoch 3
    b = cfg.train.batch_size
    with pytest.raises(DataError, match=rf"ckpt-12 stopped 2 of 5 steps into epoch 3 with world_size 1, batch_size "
                                        rf"{b}, grad_accum_steps 1, steps_per_epoch 5; this run has world_size 4, "
                                        rf"batch_size {b}, grad_accum_steps 1, steps_per_epoch 2\..*epoch-end"):
        resume.check_layout(mid, resume.layout(cfg, 4, 2, "d1"), "ckpt-12")
    end = {**_layout(cfg), "step": 10, "epoch_end": True}  # the end of epoch 2
    warnings, offset = resume.check_layout(end, resume.layout(cfg, 4, 2, "d1"), "ckpt-10")
    assert offset == 10 - 2 * 2  # step numbers go on from 10; the loop counts two finished epochs of 2 steps
    assert len(warnings) == 1 and "world_size 1 -> 4" in warnings[0]
    assert "epoch 3 with 2 steps per epoch, step numbers going on from 10" in warnings[0]
    # a second change counts epochs from the offset the first one left
    again = {**resume.layout(cfg, 4, 2, "d1"), "step": 12, "step_offset": 6}  # epoch 3 done: 6 + 3 x 2
    assert resume.check_layout(again, resume.layout(cfg, 2, 4, "d1"), "ckpt-12")[1] == 12 - 3 * 4
    with pytest.raises(DataError, match="stopped 1 of 2 steps into epoch 4"):
        resume.check_layout({**again, "step": 13}, resume.layout(cfg, 2, 4, "d1"), "ckpt-13")


def test_a_resume_in_another_layout_moves_the_schedule_to_its_step(tmp_path) -> None:
    from hvdtrain.training import state

    rank = distributed.init(use_horovod=False)
    cfg = _cfg(tmp_path)
    model, optimizer = _trained(cfg, n=10)
    optimizer.iterations.assign(8)  # as if float16 loss scaling had skipped 2 of the 10 steps
    saver = _saver(cfg, rank, model, optimizer, _layout(cfg))
    saver.after_step(LoopState(10, 2, True, lambda: np.zeros(3), 0.0, []))
    saver.close()
    found = resume.find(cfg.checkpoint, rank, resume.layout(cfg, 1, 3, "d1"))  # batch size changed: 3 steps/epoch
    assert found.step == 10 and found.layout_step == 6 and found.step_offset == 4
    start = found.start(rank)
    assert start.step == 10 and start.step_offset == 4
    fresh, fresh_opt = state.build_state(cfg, SHAPE, 1, total_steps=10)
    resume.apply(found, fresh, fresh_opt, rank, None)
    assert int(fresh_opt.iterations.numpy()) == 6 - 2  # two epochs of 3 steps, the 2 skipped steps still skipped
    assert found.arrays is None


def test_an_older_explicit_checkpoint_is_refused_while_newer_ones_exist(tmp_path) -> None:
    rank = distributed.init(use_horovod=False)
    cfg = _cfg(tmp_path)
    model, optimizer = _trained(cfg, n=1)
    saver = _saver(cfg, rank, model, optimizer, _layout(cfg))
    for step in (2, 4):
        saver.after_step(LoopState(step, 1, False, lambda: np.zeros(3), 0.0, []))
        saver.close()
    older = os.path.join(cfg.checkpoint.dir, "ckpt-0000000002")
    explicit = _cfg(tmp_path, resume=older)
    with pytest.raises(DataError, match=r"at step 2, but checkpoint.dir .* holds later checkpoints "
                                        r"\(ckpt-0000000004\).*move them out"):
        resume.find(explicit.checkpoint, rank, _layout(explicit))
    newest = _cfg(tmp_path, resume=os.path.join(cfg.checkpoint.dir, "ckpt-0000000004"))
    assert resume.find(newest.checkpoint, rank, _layout(newest)).step == 4


def test_an_unreadable_checkpoint_folder_is_one_clear_error(tmp_path, monkeypatch) -> None:
    rank = distributed.init(use_horovod=False)
    cfg = _cfg(tmp_path)

    def denied(root):
        raise PermissionError(13, "Permission denied", root)

    monkeypatch.setattr(checkpoint, "restore_latest", denied)
    with pytest.raises(DataError, match=r"reading checkpoint.dir .*checkpoints.* failed: PermissionError.*"
                                        r"permissions, or set checkpoint.resume=never"):
        resume.find(cfg.checkpoint, rank, _layout(cfg))


def test_an_explicit_invalid_checkpoint_and_a_changed_model_are_named(tmp_path) -> None:
    from hvdtrain.training import state

    rank = distributed.init(use_horovod=False)
    cfg = _cfg(tmp_path, resume=str(tmp_path / "nope" / "ckpt-0000000003"))
    with pytest.raises(DataError, match=r"checkpoint.resume=.*ckpt-0000000003: (uncommitted|unreadable|missing)"):
        resume.find(cfg.checkpoint, rank, _layout(cfg))

    cfg = _cfg(tmp_path)
    model, optimizer = _trained(cfg, n=1)
    saver = _saver(cfg, rank, model, optimizer, _layout(cfg))
    saver.after_step(LoopState(2, 1, False, lambda: np.zeros(3), 0.0, []))
    saver.close()
    found = resume.find(cfg.checkpoint, rank, _layout(cfg))
    bigger = config.from_dict({**cfg.to_dict(), "model": {**TINY, "embed_dim": 16}}, base_dir=str(tmp_path))
    other, other_opt = state.build_state(bigger, SHAPE, 1, total_steps=10)
    before = resume.to_numpy(other.weights)
    with pytest.raises(DataError, match="shape .* the model config changed since it was saved"):
        resume.apply(found, other, other_opt, rank, None)
    for x, y in zip(before, resume.to_numpy(other.weights)):  # nothing was half-assigned
        np.testing.assert_array_equal(x, y)


def test_more_epochs_on_resume_moves_the_schedule_horizon_with_a_warning(tmp_path) -> None:
    cfg = _cfg(tmp_path)
    saved = {**_layout(cfg), "step": 10}
    longer = config.from_dict({**cfg.to_dict(), "train": {**cfg.to_dict()["train"], "epochs": 6,
                                                          "lr_schedule": "cosine"}}, base_dir=str(tmp_path))
    plan = resume.plan_resume(saved, _layout(longer), "ckpt-10")
    assert plan.step_offset == 0 and plan.optimizer_shift == 0 and plan.first_record == 10 * 64
    [warning] = plan.warnings
    assert f"train.epochs {cfg.train.epochs} -> 6" in warning and "horizon moves" in warning
    assert f"decay steps {cfg.train.epochs * 5} -> 30" in warning
    older = {k: v for k, v in saved.items() if k not in ("epochs", "lr_schedule")}  # saved before the field
    assert resume.plan_resume(older, _layout(longer), "ckpt-10").warnings == ()
