"""``hvdtrain tune`` without training: the space file's checks, trial overrides and commands, the table,
the pruning hook, and a trial's reports against a real (SQLite) Optuna study."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hvdtrain import cli, tune
from hvdtrain.core import config
from hvdtrain.core.errors import ConfigError
from hvdtrain.observe.events import EpochStats
from hvdtrain.training import hooks

REPO = Path(__file__).resolve().parents[2]


def _cfg(tmp_path: Path, **tune_cfg) -> config.JobConfig:
    return config.from_dict({"name": "t", "workdir": str(tmp_path / "work"), "train": {"epochs": 3},
                             "tune": tune_cfg}, base_dir=str(tmp_path))


def _space(tmp_path: Path, text: str) -> str:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return str(path)


def test_a_good_space_parses_every_kind(tmp_path):
    params = tune.load_space(_space(tmp_path, "train.learning_rate: {loguniform: [1.0e-5, 1.0e-2]}\n"
                                              "model.dropout: {uniform: [0.0, 0.3]}\n"
                                              "train.batch_size: {int: [8, 32]}\n"
                                              "model.hidden_units: {choice: [[32], [64, 32]]}\n"), _cfg(tmp_path))
    assert [(p.key, p.kind) for p in params] == [("train.learning_rate", "loguniform"), ("model.dropout", "uniform"),
                                                 ("train.batch_size", "int"), ("model.hidden_units", "choice")]
    assert params[3].choices == ([32], [64, 32])


@pytest.mark.parametrize("text,named", [
    ("train.learnin_rate: {loguniform: [1.0e-5, 1.0e-2]}\n",
     "train.learnin_rate is not a config key; did you mean 'train.learning_rate'?"),
    ("train.output: {choice: [a, b]}\n", "train.output is set by hvdtrain tune for every trial"),
    ("tune.study: {choice: [a, b]}\n", "tune.study is set by hvdtrain tune for every trial"),
    ("train.learning_rate: {lognormal: [1, 2]}\n", "train.learning_rate must be one of"),
])
def test_a_bad_key_is_named(tmp_path, text, named):
    with pytest.raises(ConfigError) as exc:
        tune.load_space(_space(tmp_path, text), _cfg(tmp_path))
    assert named in str(exc.value) and "space.yaml" in str(exc.value)


@pytest.mark.parametrize("text,named", [
    ("train.learning_rate: {loguniform: [0, 1.0e-2]}\n", "loguniform range must be > 0"),
    ("train.learning_rate: {uniform: [0.1, 0.01]}\n", "uniform range is empty: low must be < high"),
    ("train.batch_size: {int: [8.5, 32]}\n", "int needs [low, high], two integers"),
    ("train.batch_size: {int: [0, 32]}\n", "gives a bad config at 0: train.batch_size must be > 0"),
    ("model.dropout: {uniform: [0.0, 1.5]}\n", "gives a bad config at 1.5: model.dropout must be in [0, 1)"),
    ("train.batch_size: {uniform: [8, 32]}\n", "gives a bad config at 8.0: train.batch_size must be an integer"),
    ("model.kind: {choice: []}\n", "choice needs a non-empty list"),
])
def test_a_bad_range_is_named_with_its_key(tmp_path, text, named):
    with pytest.raises(ConfigError) as exc:
        tune.load_space(_space(tmp_path, text), _cfg(tmp_path))
    key = text.split(":")[0]
    assert named in str(exc.value) and key in str(exc.value), str(exc.value)


def test_the_command_fails_on_a_bad_space_before_any_trial(tmp_path):
    cfg_path = tmp_path / "job.yaml"
    cfg_path.write_text(_cfg(tmp_path).to_yaml())
    space = _space(tmp_path, "train.batch_size: {int: [0, 32]}\n")
    proc = subprocess.run([sys.executable, "-m", "hvdtrain.cli", "tune", str(cfg_path), "--space", space,
                           "--trials", "9"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"hvdtrain: error: {space}: train.batch_size gives a bad config at 0: train.batch_size must be > 0 "
        "(got 0) (got {'int': [0, 32]})"]
    assert not (tmp_path / "work" / "tune").exists()  # no study, no trial


def test_values_survive_the_override_round_trip():
    for value in (1e-05, 0.03, 3, True, None, [64, 32], "0123", "1e5", "sqlite:////tmp/a.db"):
        data: dict = {}
        config.apply_override(data, tune.override("a.b", value))
        assert data["a"]["b"] == value


def test_trial_overrides_give_each_trial_its_folders_and_the_study(tmp_path):
    cfg = _cfg(tmp_path)
    out = tune.trial_overrides(cfg.tune, 7, {"train.learning_rate": 0.001}, "sqlite:////s.db", "abc123")
    folder = f"{tmp_path}/work/tune/t/trial-0007"
    assert out == ["train.learning_rate=0.001", f"train.output={folder}/model", f"checkpoint.dir={folder}/checkpoints",
                   "train.validate_every_epoch=true", "tracking.registered_model_name=null",
                   "tune.storage=sqlite:////s.db", "tune.study=t", "tune.trial=7", "tune.metric=validation_accuracy",
                   "tune.parent_run_id=abc123"]
    trial_cfg = config.from_dict(cfg.to_dict() | {}, base_dir=str(tmp_path))
    data = trial_cfg.to_dict()
    for item in out:
        config.apply_override(data, item)
    assert config.from_dict(data).tune.trial == 7  # the overrides make a valid config


def _opts(**kw) -> tune.TuneOptions:
    return tune.TuneOptions("job.yaml", ("train.epochs=3",), "space.yaml", 9, **kw)


def test_trial_commands_for_each_launcher():
    over = ["tune.trial=1"]
    local = tune.trial_command(_opts(np=2), over, 60)
    assert local[1:9] == ["-np", "2", "-H", "localhost:2", "--gloo", "--start-timeout", "60", sys.executable]
    assert local[9:] == ["-m", "hvdtrain.runtime.rank_env", sys.executable, "-m", "hvdtrain.training.train", "job.yaml",
                         "train.epochs=3", "tune.trial=1"]
    hosts = tune.trial_command(_opts(np=4, launcher="horovodrun", hosts="h1:2,h2:2"), over, 60)
    assert hosts[1:5] == ["-np", "4", "-H", "h1:2,h2:2"]
    assert tune.trial_command(_opts(np=4, launcher="yarn"), over, 60) == [
        sys.executable, "-m", "yarn.submit", "job.yaml", "--num-workers", "4", "train.epochs=3", "tune.trial=1"]


@pytest.mark.parametrize("kw,named", [
    ({"eta": 1}, "--eta must be >= 2"), ({"min_epochs": 4}, "--min-epochs must be in [1, 3], the epochs each trial"),
    ({"metric": "accuracy"}, "--metric must be one of"), ({"launcher": "horovodrun"}, "--hosts is needed"),
])
def test_bad_options_are_named(tmp_path, kw, named):
    with pytest.raises(ConfigError, match=named.replace("[", r"\[").replace("]", r"\]")):
        _opts(**kw).check(_cfg(tmp_path).task, 3)


def test_auto_epochs_are_resolved_from_the_dataset_as_each_trial_resolves_them(tmp_path):
    from hvdtrain.data.synthetic import Layout, TextSpec, make_text_dataset

    make_text_dataset(str(tmp_path / "data"), TextSpec(layout=Layout(n_per_split={"train": 90, "validation": 8,
                                                                                   "test": 8})))
    train = config.TrainConfig()  # the default, auto
    assert tune.trial_epochs(train, str(tmp_path / "data")) == 100  # 90 train records (hvdtrain.data.plan)
    assert tune.trial_epochs(config.TrainConfig(epochs=3), str(tmp_path / "nowhere")) == 3  # no dataset read
    with pytest.raises(ConfigError, match=r"--min-epochs must be in \[1, 100\]"):
        _opts(min_epochs=101).check(_cfg(tmp_path).task, tune.trial_epochs(train, str(tmp_path / "data")))


def test_cli_parses_the_tune_command():
    args = cli.parse_args(["tune", "job.yaml", "--space", "s.yaml", "--trials", "9", "--eta", "3", "--np", "2",
                           "--parallel", "2", "train.epochs=4", "--launcher", "yarn"])
    assert (args.space, args.trials, args.eta, args.parallel, args.launcher, args.overrides) == (
        "s.yaml", 9, 3, 2, "yarn", ["train.epochs=4"])


def test_the_table_sorts_by_metric_and_lists_errors():
    trials = [{"number": 0, "state": "PRUNED", "value": 0.4, "epochs": 1, "params": {"lr": 0.1}},
              {"number": 1, "state": "COMPLETE", "value": 0.9, "epochs": 3, "params": {"lr": 0.01}},
              {"number": 2, "state": "FAIL", "value": None, "epochs": 0, "params": {"lr": 1.0}, "error": "OOM"}]
    lines = tune.table(trials, "validation_accuracy", maximize=True).splitlines()
    assert [line.split()[0] for line in lines[1:4]] == ["1", "0", "2"]
    assert lines[-1] == "  trial 2: OOM"
    assert [line.split()[0] for line in tune.table(trials, "validation_loss", maximize=False).splitlines()[1:3]] \
        == ["0", "1"]


def _stats(epoch: int, accuracy: float) -> EpochStats:
    stats = EpochStats(epoch=epoch, steps=1, loss=1.0, accuracy=0.5, examples=8, seconds=1.0)
    stats.validation = {"loss": 1.0, "accuracy": accuracy, "macro_f1": accuracy, "records": 8}
    return stats


def test_pruning_hook_stops_every_rank_on_rank_0s_decision():
    reported, shared = [], []
    chief = hooks.PruningHook("val_accuracy", lambda e, v: reported.append((e, v)) or e == 2,
                              lambda stop, epoch: shared.append(stop) or stop)
    assert chief.end_epoch(_stats(1, 0.5)) is False and chief.end_epoch(_stats(2, 0.25)) is True
    assert reported == [(1, 0.5), (2, 0.25)] and chief.pruned_at == 2
    other = hooks.PruningHook("val_accuracy", None, lambda stop, epoch: epoch == 2)  # rank 1: the broadcast decides
    assert other.end_epoch(_stats(1, 0.9)) is False and other.end_epoch(_stats(2, 0.9)) is True


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
@pytest.mark.parametrize("study_epochs", [3, "auto"])  # auto: the study holds it, each trial resolves it
def test_reporter_prunes_through_the_study_and_stops_a_given_up_trial(tmp_path, study_epochs):
    import optuna

    cfg = _cfg(tmp_path, heartbeat_seconds=5)
    cfg.train.epochs = study_epochs
    space = tune.load_space(_space(tmp_path, "train.learning_rate: {loguniform: [1.0e-5, 1.0e-2]}\n"), cfg)
    opts = tune.TuneOptions(str(tmp_path / "job.yaml"), (), "s", 9, eta=3, min_epochs=1)
    study = tune.open_study(cfg, opts, space)
    for value in (0.9, 0.8, 0.7):  # three trials reached epoch 1: only the top third goes on
        done = study.ask()
        for epoch in (1, 3):  # rungs at epochs 1 and 3; should_prune records the trial at each (as TrialReporter)
            done.report(value, epoch)
            if done.should_prune():
                break
        study.tell(done, value)
    trial = study.ask()
    cfg.tune.storage, cfg.tune.trial = tune.storage_url(cfg.tune), trial.number
    reporter = tune.TrialReporter(cfg.tune, 3)
    assert reporter.report(1, 0.2) is True  # worse than the top third at the first rung
    assert study.trials[trial.number].user_attrs["pruned_at_epoch"] == 1
    good = study.ask()
    cfg.tune.trial = good.number
    assert tune.TrialReporter(cfg.tune, 3).report(1, 0.95) is False
    assert tune.TrialReporter(cfg.tune, 3).report(3, 0.1) is False  # worse than 0.9 at the second rung, but
    assert "pruned_at_epoch" not in study.trials[good.number].user_attrs  # at the full budget: it completes
    study.tell(good, state=optuna.trial.TrialState.FAIL)
    assert tune.TrialReporter(cfg.tune, 3).report(2, 0.95) is True  # the driver gave it up: stop


def test_done_count_skips_failures_queued_again():
    class T:
        def __init__(self, number, state, retry=None):
            self.number, self.state = number, type("S", (), {"name": state})
            self.system_attrs = {"retry_history": retry} if retry else {}

    trials = [T(0, "COMPLETE"), T(1, "FAIL"), T(2, "PRUNED"), T(3, "RUNNING", retry=[1]), T(4, "FAIL")]
    assert tune.done_count(trials) == 3  # 0, 2 and the crashed 4; 1 is being retried as 3


# A trial run that reports to the study like rank 0 of a real one, without TensorFlow, and crashes (the
# fault injected) when its learning rate is above 1e-3: the driver's side of crash isolation.
FAKE_TRIAL = """
import sys
from hvdtrain.core import config
from hvdtrain import tune
over = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
lr = float(over["train.learning_rate"])
if lr > 1e-3:
    print("hvdtrain: error: rank 1 ran out of memory (injected)", file=sys.stderr)
    sys.exit(5)
cfg = config.TuneConfig(storage=over["tune.storage"], study=over["tune.study"], trial=int(over["tune.trial"]))
reporter = tune.TrialReporter(cfg, 3)
for epoch in (1, 2, 3):
    if reporter.report(epoch, 0.5 + lr * 100 * epoch):
        break
"""


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
def test_a_crashing_trial_is_failed_with_its_error_and_the_study_goes_on(tmp_path, monkeypatch, capsys):
    cfg = _cfg(tmp_path)
    cfg.tracking.enabled = False
    space = _space(tmp_path, "train.learning_rate: {loguniform: [1.0e-4, 1.0e-2]}\n")
    monkeypatch.setattr(tune, "trial_command", lambda opts, overrides, timeout: [
        sys.executable, "-c", FAKE_TRIAL, *overrides])
    summary = tune.run_study(cfg, tune.TuneOptions(str(tmp_path / "job.yaml"), (), space, 6, eta=3))
    trials = summary["trials"]
    failed = [t for t in trials if t["state"] == "FAIL"]
    assert len(trials) == 6 and failed and len(failed) < 6  # every trial ran; the crashes did not stop the study
    for t in failed:
        assert t["params"]["train.learning_rate"] > 1e-3
        assert "training exited with code 5: hvdtrain: error: rank 1 ran out of memory (injected)" in t["error"]
    out = capsys.readouterr().out
    assert f"  trial {failed[0]['number']}: training exited with code 5" in out
    assert summary["best"]["params"]["train.learning_rate"] <= 1e-3


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
def test_a_retried_trial_is_judged_by_its_own_run_not_its_failed_try_s(tmp_path, monkeypatch):
    """A try pruned at epoch 1 just before its driver died, failed by the heartbeat and re-queued by Optuna's own
    callback (which copies its user attributes): the retry runs the full budget and completes."""
    import optuna

    cfg = _cfg(tmp_path, heartbeat_seconds=5)
    cfg.tracking.enabled = False
    space = _space(tmp_path, "train.learning_rate: {loguniform: [1.0e-4, 1.0e-2]}\n")
    opts = tune.TuneOptions(str(tmp_path / "job.yaml"), (), space, 1, eta=3)
    study = tune.open_study(cfg, opts, tune.load_space(space, cfg))
    lr = optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)
    study.add_trial(optuna.create_trial(state=optuna.trial.TrialState.FAIL, params={"train.learning_rate": 5e-4},
                                        distributions={"train.learning_rate": lr}, intermediate_values={1: 0.55},
                                        user_attrs={"pruned_at_epoch": 1, "error": "its driver died"}))
    optuna.storages.RetryHeartbeatStaleTrialCallback()(study, study.trials[0])
    monkeypatch.setattr(tune, "trial_command", lambda opts, overrides, timeout: [
        sys.executable, "-c", FAKE_TRIAL, *overrides])
    summary = tune.run_study(cfg, opts)
    retry = next(t for t in summary["trials"] if t["number"] == 1)
    assert (retry["state"], retry["epochs"], retry["error"]) == ("COMPLETE", 3, None), summary["trials"]


def test_yarn_trials_need_a_storage_the_executors_reach(tmp_path):
    with pytest.raises(ConfigError, match="tune.storage must be a database the YARN executors reach"):
        tune.run_study(_cfg(tmp_path), _opts(launcher="yarn"))


# A launcher that, like horovodrun past its rank threads, takes SIGTERM and goes on; its pid goes to a file.
DEAF_LAUNCHER = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *a: None)
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(120)
"""
# A tune driver in miniature: runs the launcher as a trial with the given death signal.
DRIVER = """
import sys
from hvdtrain import tune
tune.run_process([sys.executable, "-c", sys.argv[1], sys.argv[2]], sys.argv[3], {}, int(sys.argv[4]))
"""


@pytest.mark.parametrize("launcher", ["local", "horovodrun"])
def test_a_trial_launcher_that_swallows_sigterm_dies_with_its_killed_driver(tmp_path: Path, launcher: str) -> None:
    import os
    import signal
    import time

    assert tune.death_signal("yarn") == signal.SIGTERM  # a YARN submission releases its application on SIGTERM
    pid_file = tmp_path / "pid"
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, DEAF_LAUNCHER, str(pid_file), str(tmp_path / "t.log"),
                               str(tune.death_signal(launcher))], cwd=Path(__file__).resolve().parents[2],
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    pid = int(pid_file.read_text())
    driver.kill()  # as the study's driver was killed in test_tune_mp
    driver.wait()
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = _alive(pid)
    if alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, "the trial's launcher outlived its killed driver"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False
