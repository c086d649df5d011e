"""Hyperparameter search over ordinary training runs: the only module that imports optuna (lazily).

``hvdtrain tune CONFIG --space SPACE.yaml --trials N`` keeps an Optuna study in
an RDB storage (``tune.storage``; by default SQLite under ``tune.output``) and
runs each trial as an ordinary training job with the trial's config overrides:
``horovodrun -np R`` on this host (``--launcher local``) or on ``--hosts``
(``horovodrun``), or ``python -m yarn.submit`` (``yarn``). Optuna decides
everything a scheduler decides: the sampler (TPE, seeded by ``train.seed``)
picks values, the successive-halving pruner (ASHA: ``--eta``, ``--min-epochs``)
stops the poor trials, and the storage's heartbeat fails trials whose driver
died, re-queueing them (``RetryHeartbeatStaleTrialCallback``). Running the same
command again resumes the study.

A trial run reports to the study itself: after each epoch, rank 0 sends the
validation metric (:class:`TrialReporter`, through :class:`hvdtrain.training.hooks.PruningHook`)
and the prune decision is broadcast, so every rank stops at the same epoch.

The space file maps dotted config keys to one distribution each::

    train.learning_rate: {loguniform: [1.0e-4, 3.0e-2]}
    model.dropout: {uniform: [0.0, 0.3]}
    model.embed_dim: {choice: [16, 32]}
    train.batch_size: {int: [8, 32]}

Pure parts (space parsing and checking, trial overrides, commands, the table)
import no optuna; :func:`run_study` and :class:`TrialReporter` do.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import warnings
from typing import Any, Callable, Mapping, Optional, Sequence

import yaml

from hvdtrain.core import config as config_lib
from hvdtrain.core import secrets, tasks
from hvdtrain.core.errors import ANY_ERROR, ConfigError, HvdtrainError
from hvdtrain.data import manifest as manifest_lib
from hvdtrain.data.plan import with_epochs
from hvdtrain.hadoop import fs
from hvdtrain.observe import plots, tracking
from hvdtrain.runtime import launch

log = logging.getLogger("hvdtrain.tune")
KINDS = ("loguniform", "uniform", "int", "choice")
METRICS = tasks.validation_metrics("multiclass")  # the default task's; each task has its own (hvdtrain.core.tasks)
FREE_SECTIONS = ("model.params.",)  # free-form keys the user's builder reads: any name may be searched
STORAGE_ENV = "HVDTRAIN_TUNE_STORAGE"  # the study's storage URL, handed to each trial (it may hold a password)
LAUNCHERS = ("local", "horovodrun", "yarn")
# Keys each trial gets from the tune driver: a space may not set them.
RESERVED = ("name", "workdir", "train.epochs", "train.output", "checkpoint.dir", "train.validate_every_epoch",
            "tracking.registered_model_name", "tracking.enabled", "tracking.uri", "tracking.experiment")
RESERVED_SECTIONS = ("tune.",)


class TrialCrashed(HvdtrainError):
    """A trial's training run failed; the study goes on (the trial is marked failed with this message)."""


# -- the space (pure) ------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Param:
    """One searched config key and its distribution."""

    key: str
    kind: str
    low: Optional[float] = None
    high: Optional[float] = None
    choices: tuple = ()

    def extremes(self) -> list[Any]:
        """The values that must all make a valid config: both ends of a range, every choice."""
        if self.kind == "choice":
            return list(self.choices)
        low, high = self.bounds()
        cast = int if self.kind == "int" else float  # as the sampler gives them: uniform on an int key is an error
        return [cast(low), cast(high)]

    def bounds(self) -> tuple[float, float]:
        """A range's ``[low, high]`` (``param`` sets both for every kind but ``choice``)."""
        if self.low is None or self.high is None:
            raise ConfigError(f"tune.params.{self.key}", self.kind, "needs [low, high]")
        return self.low, self.high


def parse_space(doc: Any, where: str, cfg: config_lib.JobConfig) -> list[Param]:
    """The space file's params, each checked against the config (raises ConfigError naming key and range)."""
    if not isinstance(doc, dict) or not doc:
        raise ConfigError(where, doc, "must map dotted config keys to a distribution, e.g. "
                                      "train.learning_rate: {loguniform: [1.0e-4, 1.0e-2]}")
    known = cfg.flat()
    params = [_param(str(key), spec, where, known) for key, spec in doc.items()]
    for param in params:
        check_values(param, cfg, where)
    return params


def _param(key: str, spec: Any, where: str, known: Mapping[str, Any]) -> Param:
    field = f"{where}: {key}"
    if key in RESERVED or key.startswith(RESERVED_SECTIONS):
        raise ConfigError(field, spec, "is set by hvdtrain tune for every trial; search other keys")
    if key not in known and not (key.startswith(FREE_SECTIONS) and len(key.split(".")) == 3):
        close = difflib.get_close_matches(key, list(known), n=1)
        raise ConfigError(field, spec, "is not a config key" + (f"; did you mean {close[0]!r}?" if close else
                                                                  " (see hvdtrain config CONFIG)"))
    if not isinstance(spec, dict) or len(spec) != 1 or next(iter(spec)) not in KINDS:
        raise ConfigError(field, spec, "must be one of {loguniform|uniform|int: [low, high]} or "
                                       "{choice: [a, b, ...]}")
    kind, values = next(iter(spec.items()))
    if kind == "choice":
        if not isinstance(values, list) or not values:
            raise ConfigError(field, spec, "choice needs a non-empty list of values")
        return Param(key, kind, choices=tuple(values))
    return Param(key, kind, *_range(field, kind, values))


def _range(field: str, kind: str, values: Any) -> tuple[float, float]:
    ok_types = (int,) if kind == "int" else (int, float)
    if (not isinstance(values, list) or len(values) != 2
            or not all(isinstance(v, ok_types) and not isinstance(v, bool) for v in values)):
        what = "integers" if kind == "int" else "numbers"
        raise ConfigError(field, {kind: values}, f"{kind} needs [low, high], two {what}")
    low, high = values
    if kind == "int" and low > high or kind != "int" and not low < high:
        raise ConfigError(field, {kind: values}, f"{kind} range is empty: low must be < high")
    if kind == "loguniform" and low <= 0:
        raise ConfigError(field, {kind: values}, "loguniform range must be > 0 (a log scale has no 0)")
    return low, high


def check_values(param: Param, cfg: config_lib.JobConfig, where: str) -> None:
    """Every end of the range (every choice) must give a valid config: checked before any trial starts."""
    base = cfg.to_dict()
    for value in param.extremes():
        data = copy.deepcopy(base)
        config_lib.apply_override(data, override(param.key, value))
        try:
            config_lib.from_dict(data)
        except ConfigError as exc:
            shown = {param.kind: list(param.extremes())}
            raise ConfigError(f"{where}: {param.key}", shown, f"gives a bad config at {value!r}: {exc}") from None


def load_space(path: str, cfg: config_lib.JobConfig) -> list[Param]:
    """Read and check a space file."""
    try:
        with open(path) as fh:
            doc = yaml.safe_load(fh)
    except FileNotFoundError:
        raise ConfigError("--space", path, "file not found; pass a YAML file of key: {distribution: [...]}") from None
    except yaml.YAMLError as exc:
        raise ConfigError("--space", path, f"is not valid YAML: {exc}") from None
    return parse_space(doc, path, cfg)


def space_digest(params: Sequence[Param]) -> str:
    return hashlib.sha256(json.dumps([dataclasses.asdict(p) for p in params], sort_keys=True,
                                     default=str).encode()).hexdigest()[:16]


def override(key: str, value: Any) -> str:
    """``key=value`` with the value as one line of YAML, read back as the same value (1e-05 stays a float)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 30).strip()
    return f"{key}={text.removesuffix('...').strip()}"


# -- options, trials, commands (pure) ---------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TuneOptions:
    """The command line of ``hvdtrain tune``."""

    config_path: str
    overrides: tuple[str, ...]
    space: str
    trials: int
    parallel: int = 1
    np: int = 2
    launcher: str = "local"
    hosts: Optional[str] = None
    eta: int = 3
    min_epochs: int = 1
    metric: Optional[str] = "validation_accuracy"  # None: the task's default (tune.metric)

    def check(self, task: config_lib.TaskConfig, epochs: int) -> None:
        """Option errors, named, before anything starts: ``task`` gives the validation metrics, ``epochs`` the
        epochs each trial trains (:func:`trial_epochs`), which ASHA's first rung must fit in."""
        for name, value, ok, expected in (
                ("--trials", self.trials, self.trials >= 1, "must be >= 1"),
                ("--parallel", self.parallel, self.parallel >= 1, "must be >= 1"),
                ("--np", self.np, self.np >= 1, "must be >= 1"),
                ("--eta", self.eta, self.eta >= 2, "must be >= 2 (keep 1/eta of the trials at each rung)"),
                ("--min-epochs", self.min_epochs, 1 <= self.min_epochs <= epochs,
                 f"must be in [1, {epochs}], the epochs each trial trains (ASHA's first rung)"),
                ("--metric", self.metric, self.metric in tasks.validation_metrics(task.kind),
                 f"must be one of {', '.join(tasks.validation_metrics(task.kind))} ({task.kind} task)"),
                ("--launcher", self.launcher, self.launcher in LAUNCHERS, f"must be one of {', '.join(LAUNCHERS)}"),
                ("--hosts", self.hosts, self.launcher != "horovodrun" or bool(self.hosts),
                 "is needed with --launcher horovodrun, e.g. --hosts host1:2,host2:2")):
            if not ok:
                raise ConfigError(name, value, expected)


def trial_epochs(train: config_lib.TrainConfig, dataset: str) -> int:
    """The epochs every trial trains: ``train.epochs``, with ``auto`` resolved from the manifest of ``dataset``
    (``etl.output``, which the trials share) as each trial resolves it."""
    if train.epochs != "auto":  # the dataset is read only for auto
        return train.epochs
    return with_epochs(train, manifest_lib.read(dataset)).epoch_count


def direction(metric: str) -> str:
    return "minimize" if tasks.direction(metric) == "min" else "maximize"


def epoch_metric(metric: str) -> str:
    """The per-epoch MLflow metric a validation metric is logged as (``validation_accuracy`` -> ``val_accuracy``)."""
    return "val_" + metric[len("validation_"):]


def storage_url(tune: config_lib.TuneConfig) -> str:
    """``tune.storage``, else a SQLite file in ``tune.output`` (which must then be local)."""
    if tune.storage:
        return tune.storage
    if config_lib.has_scheme(tune.output):
        raise ConfigError("tune.storage", None, f"must name an RDB (e.g. mysql://...) when tune.output is remote "
                                                f"({tune.output}): SQLite needs a local file")
    return f"sqlite:///{os.path.abspath(tune.output)}/{tune.study}.db"


def engine_kwargs(url: str) -> dict[str, Any]:
    """SQLite: wait up to a minute for a lock (the driver's heartbeats and every trial's rank 0 write to one
    file) instead of failing after sqlite's default 5 s."""
    return {"connect_args": {"timeout": 60}} if url.startswith("sqlite:") else {}


def trial_folder(tune: config_lib.TuneConfig, number: int) -> str:
    return fs.join(tune.output, tune.study, f"trial-{number:04d}")


def trial_overrides(tune: config_lib.TuneConfig, number: int, values: Mapping[str, Any], storage: str,
                    parent_run_id: Optional[str]) -> list[str]:
    """The overrides that make the job config one trial (pure): its values, its own folders, a report
    to the study after every epoch, and its MLflow run under the study's."""
    folder = trial_folder(tune, number)
    out = [override(key, value) for key, value in values.items()]
    out += [override("train.output", fs.join(folder, "model")),
            override("checkpoint.dir", fs.join(folder, "checkpoints")),
            "train.validate_every_epoch=true", "tracking.registered_model_name=null",
            # a storage password reaches the trial by environment (trial_env), never on its command line
            *([] if secrets.has_secret(storage) else [override("tune.storage", storage)]),
            override("tune.study", tune.study), f"tune.trial={number}",
            override("tune.metric", tune.metric)]
    if parent_run_id:
        out.append(override("tune.parent_run_id", parent_run_id))
    return out


def trial_env(env: Mapping[str, str], storage: str) -> dict[str, str]:
    """A trial's environment (pure): the study's storage URL rides here, not on the command line (a secret in it
    is sealed away from horovodrun's rank command lines by :func:`hvdtrain.runtime.launch.sealed_env`)."""
    return {**env, STORAGE_ENV: storage}


def trial_command(opts: TuneOptions, overrides: Sequence[str], start_timeout: int) -> list[str]:
    """How one trial runs (pure): horovodrun here or on hosts, or a YARN submission."""
    if opts.launcher == "yarn":
        return [sys.executable, "-m", "yarn.submit", opts.config_path, "--num-workers", str(opts.np),
                *opts.overrides, *overrides]
    hosts = opts.hosts if opts.launcher == "horovodrun" else None
    return launch.train_command(opts.config_path, [*opts.overrides, *overrides], opts.np, start_timeout, hosts=hosts)


def trial_values(params: Sequence[Param], suggest: Any) -> dict[str, Any]:
    """Each param's value from ``suggest(param)`` (pure given ``suggest``)."""
    return {p.key: suggest(p) for p in params}


def summary_rows(trials: Sequence[Mapping[str, Any]], maximize: bool) -> list[Mapping[str, Any]]:
    """Trials with a value first, best first; then the rest by number (pure)."""
    scored = sorted((t for t in trials if t.get("value") is not None), key=lambda t: t["value"], reverse=maximize)
    rest = sorted((t for t in trials if t.get("value") is None), key=lambda t: t["number"])
    return [*scored, *rest]


def table(trials: Sequence[Mapping[str, Any]], metric: str, maximize: bool) -> str:
    """The trials sorted by metric, one line each (pure)."""
    keys = sorted({k for t in trials for k in t.get("params", {})})
    head = ["trial", "state", metric, "epochs", *keys]
    rows = [[str(t["number"]), t["state"], "-" if t.get("value") is None else f"{t['value']:.4f}",
             str(t.get("epochs", 0)), *[_short(t.get("params", {}).get(k)) for k in keys]]
            for t in summary_rows(trials, maximize)]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head, *rows]]
    errors = [f"  trial {t['number']}: {t['error']}" for t in trials if t.get("error")]
    return "\n".join(lines + (["failed trials:", *errors] if errors else []))


def _short(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return json.dumps(value) if not isinstance(value, str) else value


# -- the trial's side: report each epoch to the study (rank 0) ------------------------------------

def _quiet_optuna() -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # hvdtrain prints each trial's end (no tracebacks)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna


def make_pruner(eta: int, min_epochs: int) -> Any:
    """Optuna's asynchronous successive halving (ASHA): rungs at min_epochs * eta^k epochs."""
    optuna = _quiet_optuna()
    return optuna.pruners.SuccessiveHalvingPruner(min_resource=min_epochs, reduction_factor=eta)


class TrialReporter:
    """Rank 0 of a trial run: reports each epoch's metric to the study and asks whether to prune.

    The pruner's settings come from the study (the driver stored them), so the trial decides as the
    driver would. A storage that cannot be reached only warns: the trial trains on unpruned.
    """

    def __init__(self, tune_cfg: config_lib.TuneConfig, epochs: int):
        self.number = tune_cfg.trial
        self.trial: Any = None
        # The full budget, as this run resolved train.epochs (the study may hold auto): a trial that reached it
        # completes, it is not pruned
        self.last_epoch = epochs
        url = os.environ.get(STORAGE_ENV) or tune_cfg.storage or ""  # a secret one comes by environment only
        try:
            optuna = _quiet_optuna()
            storage = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs(url))
            study_id = storage.get_study_id_from_name(tune_cfg.study)
            attrs = storage.get_study_user_attrs(study_id)
            study = optuna.load_study(study_name=tune_cfg.study, storage=storage,
                                      pruner=make_pruner(int(attrs["eta"]), int(attrs["min_epochs"])))
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, tune_cfg.trial)
            self.trial = optuna.trial.Trial(study, trial_id)
        except ANY_ERROR as exc:  # the study's storage never stops training
            log.warning("cannot reach trial %s of study %r at %s (%s: %s); training on without pruning",
                        tune_cfg.trial, tune_cfg.study, secrets.redact_url(url),
                        type(exc).__name__, secrets.redact_text(str(exc)))

    def report(self, epoch: int, value: float) -> bool:
        """Record ``value`` at ``epoch``; True to stop (pruned, or the study has given this trial up)."""
        if self.trial is None:
            return False
        import optuna

        try:
            self.trial.report(value, epoch)
            prune = epoch < self.last_epoch and self.trial.should_prune()
            if prune:
                self.trial.set_user_attr("pruned_at_epoch", epoch)
        except optuna.exceptions.UpdateFinishedTrialError:
            log.warning("trial %d is no longer running in the study (its driver failed it); stopping", self.number)
            return True
        except ANY_ERROR as exc:  # the study's storage never stops training
            log.warning("reporting epoch %d to the study failed (%s: %s); training goes on", epoch,
                        type(exc).__name__, secrets.redact_text(str(exc)))
            return False
        if prune:
            log.info("trial %d pruned after epoch %d (%s %.4f): successive halving stops it here", self.number,
                     epoch, epoch_metric(self.trial.study.user_attrs.get("metric", "validation_accuracy")), value)
        return prune


# -- the driver ----------------------------------------------------------------------------------

def death_signal(launcher: str) -> int:
    """What a trial's launcher gets when the tune driver dies (pure). horovodrun gets SIGKILL: on SIGTERM it only
    sets an event for its rank threads, so one past them (its ranks gone) lived on for hours. A killed
    horovodrun's ranks on this host are ended by Horovod's own middleman processes (safe_shell_exec: they watch a
    pipe to it); with ``--hosts``, a remote rank ends when its ssh connection is gone and it next writes or meets
    its peers, as it did before. A YARN submission gets SIGTERM, which it turns into releasing the application
    (yarn.submit.guarded)."""
    return int(signal.SIGTERM if launcher == "yarn" else signal.SIGKILL)


def _die_with_parent(sig: int) -> Callable[[], None]:
    """For the trial's launcher process: ``sig`` when the tune driver dies (even by SIGKILL), so no trial
    outlives its driver and keeps training for a study that has failed it (Linux prctl). libc is loaded here, in
    the parent: the child of a process with threads runs only the prctl call before it execs."""
    try:
        import ctypes

        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return lambda: None

    def arm() -> None:
        prctl(1, sig)  # PR_SET_PDEATHSIG
    return arm


def run_process(cmd: Sequence[str], log_path: str, env: Mapping[str, str],
                on_parent_death: int) -> tuple[int, str]:
    """Run one trial with its output in ``log_path``; returns (exit code, its last error line). The trial gets
    ``on_parent_death`` (:func:`death_signal`) if this process dies."""
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "ab") as out:
        out.write(f"$ {subprocess.list2cmdline(list(cmd))}\n".encode())
        out.flush()
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT, env=dict(env),
                                start_new_session=True, preexec_fn=_die_with_parent(on_parent_death))
        try:
            code = proc.wait()
        except BaseException:  # Ctrl-C, or the study stopping: the whole trial goes, not just horovodrun
            _stop_group(proc)
            raise
    return code, last_error(log_path)


def _stop_group(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait)
            return
        except (ProcessLookupError, subprocess.TimeoutExpired):
            continue


def last_error(log_path: str, tail_bytes: int = 20000) -> str:
    """The last line of a trial's log that says what went wrong ("error", a Python exception), else ''."""
    with open(log_path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        fh.seek(max(0, fh.tell() - tail_bytes))
        lines = fh.read().decode("utf-8", "replace").splitlines()
    marks = ("error:", "Error:", "Error ", "Exception", "Killed", "exited with code")
    for line in reversed(lines):
        if any(m in line for m in marks):
            return line.strip()[-500:]
    return ""


# What a trial's run records in its user attributes. A trial the heartbeat re-queues after its driver died starts
# with them copied from the failed try (optuna.storages.RetryHeartbeatStaleTrialCallback copies user_attrs): a
# try pruned just before the driver died would make its retry, run to the full budget, count as pruned.
RUN_ATTRS = ("pruned_at_epoch", "error", "mlflow_run_id", "mlflow_model_uri")


class Driver:
    """Runs a study: each Optuna trial becomes a training run (see :func:`run_study`)."""

    def __init__(self, cfg: config_lib.JobConfig, opts: TuneOptions, params: Sequence[Param], study: Any,
                 parent: Any):
        self.cfg, self.opts, self.params, self.study, self.parent = cfg, opts, params, study, parent
        self.storage = storage_url(cfg.tune)
        self.logs = os.path.join(cfg.tune.output if not config_lib.has_scheme(cfg.tune.output)
                                 else os.path.abspath("work"), cfg.tune.study, "logs")

    def suggest(self, trial: Any, param: Param) -> Any:
        if param.kind == "choice":  # optuna keeps scalars; other choices (lists) go as JSON text
            scalar = all(v is None or isinstance(v, (bool, int, float, str)) for v in param.choices)
            picked = trial.suggest_categorical(param.key, list(param.choices) if scalar
                                               else [json.dumps(v) for v in param.choices])
            return picked if scalar else json.loads(picked)
        low, high = param.bounds()
        if param.kind == "int":
            return trial.suggest_int(param.key, int(low), int(high))
        return trial.suggest_float(param.key, float(low), float(high), log=param.kind == "loguniform")

    def __call__(self, trial: Any) -> float:
        """Optuna's objective: run the trial as a training job, then read what it reported."""
        import optuna

        values = trial_values(self.params, lambda p: self.suggest(trial, p))
        overrides = trial_overrides(self.cfg.tune, trial.number, values, self.storage, self.parent.run_id)
        cmd = trial_command(self.opts, overrides, self.cfg.fault.start_timeout)
        log_path = os.path.join(self.logs, f"trial-{trial.number:04d}.log")
        for key in RUN_ATTRS:  # a retried trial starts with its failed try's attributes (Optuna copies them)
            if trial.user_attrs.get(key) is not None:
                trial.set_user_attr(key, None)
        trial.set_user_attr("output", fs.join(trial_folder(self.cfg.tune, trial.number), "model"))
        trial.set_user_attr("log", log_path)
        print(f"tune: trial {trial.number} started: {_params_text(values)} (log {log_path})", flush=True)
        env = launch.sealed_env(cmd, trial_env(_child_env(), self.storage))
        code, error = run_process(cmd, log_path, env, death_signal(self.opts.launcher))
        frozen = self.study._storage.get_trial(trial._trial_id)
        self._tag_child(trial, frozen, code)
        if code != 0:
            message = f"training exited with code {code}" + (f": {error}" if error else "") + f" (log {log_path})"
            trial.set_user_attr("error", message)
            print(f"tune: trial {trial.number} failed: {message}", flush=True)
            raise TrialCrashed(message)
        reported = frozen.intermediate_values
        if not reported:
            raise TrialCrashed(f"trial {trial.number} finished without reporting {self.opts.metric} (log {log_path})")
        value = reported[max(reported)]
        if frozen.user_attrs.get("pruned_at_epoch") is not None:
            print(f"tune: trial {trial.number} pruned after epoch {max(reported)}: {self.opts.metric} "
                  f"{value:.4f}", flush=True)
            raise optuna.TrialPruned()
        print(f"tune: trial {trial.number} finished: {self.opts.metric} {value:.4f}", flush=True)
        return value

    def _tag_child(self, trial: Any, frozen: Any, code: int) -> None:
        """The trial's MLflow run (its result.json names it): pruned or not, and the trial number."""
        result_path = fs.join(trial_folder(self.cfg.tune, trial.number), "model", "result.json")
        try:
            result = json.loads(fs.read_bytes(result_path)) if code == 0 else {}
        except (HvdtrainError, OSError, ValueError):  # no or unreadable result.json: a trial without outputs has no run to tag
            result = {}
        run_id = result.get("run_id")
        if result.get("mlflow_model_uri"):
            trial.set_user_attr("mlflow_model_uri", result["mlflow_model_uri"])
        if run_id:
            trial.set_user_attr("mlflow_run_id", run_id)
            self.parent.set_child_tags(run_id, {"pruned": frozen.user_attrs.get("pruned_at_epoch") is not None,
                                                "tune_trial": trial.number})


def _child_env() -> dict[str, str]:
    env = launch.child_env()
    env.pop("MLFLOW_RUN_ID", None)  # each trial opens its own run
    return env


def _params_text(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={_short(v)}" for k, v in values.items())


def done_count(trials: Sequence[Any]) -> int:
    """Trials that count toward ``--trials``: completed, pruned or failed, except failures re-queued for a retry."""
    retried = {n for t in trials for n in t.system_attrs.get("retry_history", ())}
    return sum(1 for t in trials if t.state.name in ("COMPLETE", "PRUNED", "FAIL") and t.number not in retried)


def open_study(cfg: config_lib.JobConfig, opts: TuneOptions, params: Sequence[Param]) -> Any:
    """Create or load the study (a storage with heartbeats: a dead driver's trials are failed and re-queued).

    Reads cfg.tune and cfg.train (the sampler's seed, the epochs a resumed study must keep).
    """
    optuna = _quiet_optuna()
    url = storage_url(cfg.tune)
    if url.startswith("sqlite:///"):
        os.makedirs(os.path.dirname(url[len("sqlite:///"):]), exist_ok=True)
    storage = optuna.storages.RDBStorage(
        url, engine_kwargs=engine_kwargs(url), heartbeat_interval=cfg.tune.heartbeat_seconds,
        grace_period=2 * cfg.tune.heartbeat_seconds,
        heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=cfg.tune.max_retries))
    study = optuna.create_study(storage=storage, study_name=cfg.tune.study, direction=direction(opts.metric or cfg.tune.metric),
                                load_if_exists=True, pruner=make_pruner(opts.eta, opts.min_epochs),
                                sampler=optuna.samplers.TPESampler(seed=cfg.train.seed))
    settings = {"eta": opts.eta, "min_epochs": opts.min_epochs, "metric": opts.metric, "space": space_digest(params),
                "epochs": cfg.train.epochs}
    before = study.user_attrs
    for key, value in settings.items():
        if key in before and before[key] != value:
            raise ConfigError(f"study {cfg.tune.study!r}", value, f"was started with {key}={before[key]!r}; rerun "
                              f"with the same settings to resume it, or name a new study with tune.study=NAME")
        study.set_user_attr(key, value)
    return study


def run_study(cfg: config_lib.JobConfig, opts: TuneOptions) -> dict[str, Any]:
    """Check everything, then run trials until ``--trials`` have ended; returns the study's summary."""
    if opts.metric is None:  # --metric not given: the task's own (tune.metric, resolved by the config)
        opts = dataclasses.replace(opts, metric=cfg.tune.metric)
    opts.check(cfg.task, trial_epochs(cfg.train, cfg.etl.output))  # a missing dataset fails here too
    if opts.launcher == "yarn" and storage_url(cfg.tune).startswith("sqlite:"):
        raise ConfigError("tune.storage", storage_url(cfg.tune), "must be a database the YARN executors reach "
                          "(mysql://, postgresql://) with --launcher yarn: SQLite is a local file")
    params = load_space(opts.space, cfg)  # a bad space fails here, before any trial
    cfg.tune.metric = opts.metric or cfg.tune.metric
    study = open_study(cfg, opts, params)
    parent = tracking.StudyRun(cfg)
    parent.open(study.user_attrs.get("mlflow_parent_run_id"), f"tune-{cfg.tune.study}",
                {"hvdtrain.tune.study": cfg.tune.study,
                 "hvdtrain.tune.storage": secrets.redact_url(storage_url(cfg.tune))})
    if parent.run_id:
        study.set_user_attr("mlflow_parent_run_id", parent.run_id)
    _requeue_stale(study)
    _one_ask_at_a_time(study)
    driver = Driver(cfg, opts, params, study, parent)
    status = "FAILED"
    try:
        while (remaining := opts.trials - done_count(study.get_trials(deepcopy=False))) > 0:
            study.optimize(driver, n_trials=remaining, n_jobs=opts.parallel, catch=(TrialCrashed,))
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        summary = summarize(cfg, opts, study, parent)
        parent.end(status)
    return summary


def _one_ask_at_a_time(study: Any) -> None:
    """``--parallel`` runs trials in threads, each asking the study for its next trial. On SQLite, Optuna's
    ``SELECT ... FOR UPDATE`` locks nothing, so two threads could both take the same queued (re-queued) trial
    and run it twice: this driver's asks go one at a time. (Several drivers on one study need a server
    database: mysql://, postgresql://.)"""
    ask, lock = study.ask, threading.Lock()

    def locked_ask(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return ask(*args, **kwargs)

    study.ask = locked_ask


def _requeue_stale(study: Any) -> None:
    """Trials left RUNNING by a driver that died: failed and re-queued now when their heartbeat is stale
    (Optuna checks again before every trial)."""
    import optuna

    running = [t.number for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))]
    optuna.storages.fail_stale_trials(study)
    failed = [t.number for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,))
              if t.number in running]
    if failed:
        print(f"tune: trial(s) {', '.join(map(str, failed))} were running when the previous driver died: marked "
              "failed and queued again", flush=True)


def trial_records(study: Any) -> list[dict[str, Any]]:
    """Every trial as plain data: number, state, value, epochs, params, error, outputs."""
    out = []
    for t in study.get_trials(deepcopy=False):
        values = t.intermediate_values
        value = t.value if t.value is not None else (values[max(values)] if values and t.state.name == "PRUNED"
                                                     else None)
        error = t.user_attrs.get("error")
        if t.state.name == "FAIL" and not error:  # failed by the heartbeat check, not by its run
            error = "its driver died while it ran (no heartbeat); queued again as a new trial"
        out.append({"number": t.number, "state": t.state.name, "value": value, "epochs": len(values),
                    "params": dict(t.params), "curve": sorted(values.items()), "error": error,
                    "output": t.user_attrs.get("output"), "run_id": t.user_attrs.get("mlflow_run_id"),
                    "model_uri": t.user_attrs.get("mlflow_model_uri")})
    return out


def summarize(cfg: config_lib.JobConfig, opts: TuneOptions, study: Any, parent: Any) -> dict[str, Any]:
    """Print the table; give the parent run the best trial and the plot; register the best model.

    Reads cfg.tune and cfg.tracking (the name to register the best model under).
    """
    records = trial_records(study)
    metric = opts.metric or cfg.tune.metric
    maximize = direction(metric) == "maximize"
    print("\n" + table(records, metric, maximize), flush=True)
    complete = [r for r in records if r["state"] == "COMPLETE"]
    best = summary_rows(complete, maximize)[0] if complete else None
    for record in records:
        if record["state"] == "FAIL" and not record["run_id"]:
            parent.fail_trial_runs(record["number"])
    plot = _plot(cfg.tune, records, metric)
    if plot:
        parent.log_artifact(plot)
    summary: dict[str, Any] = {"study": cfg.tune.study, "storage": secrets.redact_url(storage_url(cfg.tune)),
                               "parent_run_id": parent.run_id,
                               "trials": records, "best": best, "plot": plot, "registered": None}
    if best is None:
        print("tune: no trial completed yet", flush=True)
        return summary
    parent.log_best({f"best.{k}": v for k, v in best["params"].items()})
    parent.log_metrics({f"best_{opts.metric}": best["value"], "best_trial": best["number"],
                        "trials_pruned": sum(r["state"] == "PRUNED" for r in records),
                        "trials_failed": sum(r["state"] == "FAIL" for r in records)})
    if cfg.tracking.registered_model_name and (best.get("model_uri") or best.get("run_id")):
        summary["registered"] = parent.register(best.get("model_uri") or f"runs:/{best['run_id']}/model",
                                                cfg.tracking.registered_model_name)
    print(f"\nbest trial {best['number']}: {opts.metric} {best['value']:.4f} with {_params_text(best['params'])}\n"
          f"  model folder  {best['output']}\n  MLflow run    {best.get('run_id')} (study run {parent.run_id})"
          + (f"\n  registered    {summary['registered']}" if summary["registered"] else ""), flush=True)
    return summary


def _plot(tune: config_lib.TuneConfig, records: Sequence[Mapping[str, Any]], metric: str) -> Optional[str]:
    local = tune.output if not config_lib.has_scheme(tune.output) else os.path.abspath("work")
    path = os.path.join(local, tune.study, "trials.png")
    curves = {f"trial {r['number']} ({r['state'].lower()})": r["curve"] for r in records if r["curve"]}
    if not curves:
        return None
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return plots.trial_curves_png(curves, path, metric, f"study {tune.study}: {metric} by epoch")
    except ANY_ERROR as exc:  # a chart is not worth failing a study for
        log.warning("could not draw %s (%s: %s)", path, type(exc).__name__, exc)
        return None

