"""MLflow tracking for rank 0: the only module that imports mlflow (lazily).

Tracking never breaks training. A transient MLflow error (the server
restarting, a 5xx, a timeout) starts an *outage*: metrics are buffered with
their original steps and timestamps and flushed when the server answers again
(probed cheaply on ``/health`` for an HTTP server, at most every
:data:`RETRY_SECONDS`), and other calls wait for it. Tracking is given up only
after ``tracking.max_outage_seconds`` of outage, and :meth:`Tracker.summary`
says what was not logged. Any other MLflow error is logged as a warning and
the tracker turns into a no-op for the rest of the run.

Where runs go (:func:`resolve_store`): ``tracking.uri``, else
``$MLFLOW_TRACKING_URI``, else a local store under the job's workdir,
``sqlite:///<workdir>/mlflow/mlflow.db`` with artifacts in
``<workdir>/mlflow/artifacts``. MLflow 3.x defaults to a SQLite backend
(``sqlite:///mlflow.db`` in the current folder) and refuses the old
``./mlruns`` file store unless ``MLFLOW_ALLOW_FILE_STORE=true``; with SQLite
the artifact root would default to ``./mlruns`` relative to the current folder,
so the local experiment is created with an explicit artifact location (and so
is a new experiment in any ``sqlite:///`` store given as ``tracking.uri`` or
``$MLFLOW_TRACKING_URI``: ``artifacts/`` beside the database). Browse
with ``mlflow ui --backend-store-uri sqlite:///<workdir>/mlflow/mlflow.db``.

The model is logged with MLflow's Keras flavor (``mlflow.keras``, which
supports Keras 3 in mlflow 3.17: verified to log, and to load back with
``mlflow.keras.load_model`` and ``mlflow.pyfunc.load_model``); the models are
built from stock Keras layers and ops, so loading needs no hvdtrain code. The
exported SavedModel (for TF Serving) is logged as plain artifacts under ``serving/``.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import sys
import time
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, TypeVar

from hvdtrain.core import secrets
from hvdtrain.core.config import JobConfig, has_scheme
from hvdtrain.core.errors import ANY_ERROR, DataError

log = logging.getLogger(__name__)
T = TypeVar("T")

MAX_PARAM_LENGTH = 6000  # mlflow.utils.validation.MAX_PARAM_VAL_LENGTH in mlflow 3.x
PARAMS_PER_BATCH = 100  # mlflow.utils.validation.MAX_PARAMS_TAGS_PER_BATCH
# MLflow's own defaults (7 retries, exponential backoff, 120 s timeout) stall rank 0 for about
# four minutes when the server is down, while the other ranks wait in a collective. Bounded
# here; values already in the environment win.
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                 "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}
RETRY_SECONDS = 5.0  # during an outage: how often to look whether the server is back
# What an MLflow error says when a later try of the same call may succeed.
TRANSIENT_MARKS = ("connection refused", "connection reset", "max retries exceeded", "timed out", "timeout",
                   "temporarily", "unavailable", "bad gateway", "internal_error", "502", "503", "504",
                   "remote end closed", "connection aborted", "name or service not known")


def _first_line(exc: BaseException) -> str:
    """An MLflow error's first line, secrets masked: MLflow names the request's URL, the tracking URI's password
    and ``?token=`` included (pure)."""
    text = str(exc)
    return secrets.redact_text(text.splitlines()[0]) if text else ""


def is_transient(exc: BaseException) -> bool:
    """Whether an MLflow failure may pass (server restart, 5xx, timeout) rather than be a bad request (pure)."""
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    names = " ".join(c.__name__ for c in type(exc).__mro__)
    text = f"{names} {exc}".lower()
    return "connectionerror" in text or any(mark in text for mark in TRANSIENT_MARKS)


@dataclass(frozen=True)
class Store:
    """Tracking URI, and the artifact location for a newly created experiment (None: the server's default)."""

    tracking_uri: str
    artifact_location: Optional[str]


def resolve_store(uri: Optional[str], env: Mapping[str, str], workdir: str) -> Store:
    """Where to log (pure but for the current folder of a relative SQLite path): config, then
    $MLFLOW_TRACKING_URI, then a local SQLite store."""
    if uri:  # a server or database URI as given; a plain folder becomes a SQLite store in it
        return _given_store(uri) if has_scheme(uri) else _local_store(uri)
    if env.get("MLFLOW_TRACKING_URI"):
        return _given_store(env["MLFLOW_TRACKING_URI"])
    base = workdir if not has_scheme(workdir) else os.path.join(os.getcwd(), "work")  # SQLite needs a local disk
    return _local_store(os.path.join(base, "mlflow"))


def _given_store(uri: str) -> Store:
    """A tracking URI as given. A SQLite database keeps a new experiment's artifacts beside it, in
    ``artifacts/``: MLflow's default, ``./mlruns`` in the current folder, would put them wherever rank 0 runs
    (in a YARN container's folder, deleted with the container)."""
    if uri.startswith("sqlite:///"):
        return Store(uri, _artifact_root(os.path.dirname(os.path.abspath(uri[len("sqlite:///"):]))))
    return Store(uri, None)  # a server decides; another database has no folder to go by


def _local_store(folder: str) -> Store:
    folder = os.path.abspath(folder)
    return Store(f"sqlite:///{folder}/mlflow.db", _artifact_root(folder))


def _artifact_root(folder: str) -> str:
    """Where the experiments of a SQLite store in ``folder`` keep their artifacts: ``artifacts/`` beside it."""
    return f"file://{folder}/artifacts"


def flat_params(cfg: JobConfig) -> dict[str, str]:
    """Config as MLflow params: dotted keys, values as strings cut to MLflow's length limit."""
    out = {}
    for key, value in cfg.flat(redacted=True).items():
        text = "" if value is None else str(value)
        out[key] = text if len(text) <= MAX_PARAM_LENGTH else text[:MAX_PARAM_LENGTH - 3] + "..."
    return out


def git_commit(start: str) -> Optional[str]:
    """The commit checked out in the git work tree holding ``start``, read from .git (no git binary)."""
    folder = os.path.abspath(start)
    while True:
        head = os.path.join(folder, ".git", "HEAD")
        if os.path.isfile(head):
            return _read_head(os.path.join(folder, ".git"))
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def _read_head(git_dir: str) -> Optional[str]:
    try:
        with open(os.path.join(git_dir, "HEAD")) as fh:
            head = fh.read().strip()
        if not head.startswith("ref: "):
            return head or None
        ref = head[5:]
        ref_file = os.path.join(git_dir, ref)
        if os.path.isfile(ref_file):
            with open(ref_file) as fh:
                return fh.read().strip() or None
        packed = os.path.join(git_dir, "packed-refs")
        if os.path.isfile(packed):
            with open(packed) as fh:
                for line in fh:
                    sha, _, name = line.strip().partition(" ")
                    if name == ref:
                        return sha
    except OSError:
        return None
    return None  # a branch without commits yet


class Tracker:
    """One MLflow run. Every method swallows MLflow failures (warn once, then no-op)."""

    def __init__(self, cfg: JobConfig, enabled: bool = True, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        """Reads cfg.tracking, cfg.name (the run's name) and cfg.workdir (a default store's folder)."""
        self.settings, self.name, self.workdir = cfg.tracking, cfg.name, cfg.workdir
        self.run_id: Optional[str] = None
        self.tracking_uri: Optional[str] = None
        self._mlflow: Any = None
        self._active = enabled and self.settings.enabled
        self._clock, self._sleep = clock, sleep
        self._pending: list[tuple[dict[str, float], int, int]] = []  # buffered metrics: values, step, time (ms)
        self._down_since: Optional[float] = None  # an outage in progress
        self._next_try = 0.0
        self.not_logged: list[str] = []  # what an outage or an error kept out of MLflow (the run's summary)
        # Hears each MLflow call before it starts (and each retry): the trainer points it at the stall
        # watchdog while it uploads, so a slow artifact store is progress, not a stall.
        self.progress: Callable[[str], None] = lambda what: None

    @property
    def active(self) -> bool:
        return self._active

    def _guard(self, what: str, fn: Callable[[], T]) -> Optional[T]:
        """Run an MLflow call; through an outage, wait for the server (up to the outage budget) and retry."""
        while self._active:
            self.progress(what)
            try:
                result = fn()
            except ANY_ERROR as exc:  # tracking must never stop training
                if not self._failed(what, exc):
                    return None
                self._sleep(max(0.0, self._next_try - self._clock()))
                continue
            self._recovered()
            return result
        if self.run_id is not None:
            self.not_logged.append(what)
        return None

    def _failed(self, what: str, exc: BaseException) -> bool:
        """Count a failure in; True to try again later (a transient error within the outage budget)."""
        now = self._clock()
        if self.run_id is not None and is_transient(exc):
            if self._down_since is None:
                self._down_since = now
                log.warning("MLflow %s failed (%s: %s); buffering metrics and retrying for up to %.0fs "
                            "(tracking.max_outage_seconds), training goes on", what, type(exc).__name__,
                            _first_line(exc), self.settings.max_outage_seconds)
            self._next_try = now + RETRY_SECONDS
            if now - self._down_since <= self.settings.max_outage_seconds:
                return True
            log.warning("MLflow has been unreachable for %.0fs (tracking.max_outage_seconds %.0f); tracking is off "
                        "for the rest of this run, training goes on", now - self._down_since,
                        self.settings.max_outage_seconds)
        else:
            log.warning("MLflow %s failed (%s: %s); tracking is off for the rest of this run, training goes on",
                        what, type(exc).__name__, secrets.redact_text(str(exc)))
        self._give_up()
        return False

    def _give_up(self) -> None:
        self._active = False
        if self._pending:
            steps = sorted({step for _, step, _ in self._pending})
            self.not_logged.append(f"{len(self._pending)} metric batches (steps {steps[0]}..{steps[-1]})")
            self._pending.clear()

    def _recovered(self) -> None:
        if self._down_since is not None:
            log.info("MLflow answers again after %.0fs; flushing %d buffered metric batches",
                     self._clock() - self._down_since, len(self._pending))
            self._down_since = None

    def _reachable(self) -> bool:
        """During an outage, a cheap look at an HTTP server's /health (no MLflow retries); else assume yes."""
        uri = self.tracking_uri or ""
        if not uri.startswith(("http://", "https://")):
            return True
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def summary(self) -> dict[str, Any]:
        """What this run's tracking missed: for the report and the end-of-run log."""
        return {"active": self._active, "not_logged": list(self.not_logged)}

    def start(self, tags: Mapping[str, str], resume_run_id: Optional[str] = None) -> Optional[str]:
        """Open the run (creating the experiment if needed), or continue ``resume_run_id``; returns the run id."""
        self._guard("start", lambda: self._start(tags, resume_run_id))
        return self.run_id

    def _start(self, tags: Mapping[str, str], resume_run_id: Optional[str] = None) -> None:
        import mlflow

        store = resolve_store(self.settings.uri, os.environ, self.workdir)
        for name, value in HTTP_DEFAULTS.items():
            os.environ.setdefault(name, value)
        if store.tracking_uri.startswith("sqlite:///"):
            os.makedirs(os.path.dirname(store.tracking_uri[len("sqlite:///"):]), exist_ok=True)
        _set_tracking_uri(store.tracking_uri)
        run = _resume_run(mlflow, resume_run_id) if resume_run_id else None
        if run is None:
            experiment_id = _experiment_id(mlflow, self.settings.experiment, store.artifact_location)
            run = mlflow.start_run(experiment_id=experiment_id, run_name=self.name, tags=dict(tags))
        self._mlflow, self.run_id, self.tracking_uri = mlflow, run.info.run_id, store.tracking_uri
        log.info("MLflow run %s in experiment %r at %s", self.run_id, self.settings.experiment,
                 secrets.redact_url(store.tracking_uri))

    def log_params(self, params: Mapping[str, Any]) -> None:
        items = list(params.items())

        def log_all() -> None:
            for i in range(0, len(items), PARAMS_PER_BATCH):
                self._mlflow.log_params(dict(items[i:i + PARAMS_PER_BATCH]))

        self._guard("log_params", log_all)

    def logged_steps(self, key: str) -> set[int]:
        """The steps metric ``key`` already has in this run (a continued run's); none when MLflow cannot say."""
        if not self._active or self._mlflow is None or self.run_id is None:
            return set()
        found = self._guard("get_metric_history",
                            lambda: {int(m.step) for m in self._mlflow.MlflowClient().get_metric_history(self.run_id,
                                                                                                         key)})
        return found or set()

    def log_metrics(self, metrics: Mapping[str, float], step: Optional[int] = None) -> None:
        """Buffered: sent now, or after an outage with their step and time (never blocks training)."""
        if not self._active or self._mlflow is None:
            return
        self._pending.append(({k: float(v) for k, v in metrics.items()}, step or 0, int(time.time() * 1000)))
        self.flush(wait=False)

    def flush(self, wait: bool = True) -> None:
        """Send buffered metrics; with ``wait``, ride out an outage (up to its budget) instead of returning."""
        while self._active and self._pending:
            if self._down_since is not None and (self._clock() < self._next_try or not self._reachable()):
                if not wait:
                    return
                if not self._failed("log_metrics", ConnectionError("the server is still unreachable")):
                    return
                self._sleep(max(0.0, self._next_try - self._clock()))
                continue
            values, step, ms = self._pending[0]
            try:
                self._log_batch(values, step, ms)
            except ANY_ERROR as exc:  # tracking must never stop training
                if not self._failed("log_metrics", exc) or not wait:
                    return
                continue
            self._pending.pop(0)
            self._recovered()

    def _log_batch(self, values: Mapping[str, float], step: int, ms: int) -> None:
        from mlflow.entities import Metric

        self._mlflow.MlflowClient().log_batch(self.run_id, metrics=[Metric(k, v, ms, step) for k, v in values.items()])

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self._guard("set_tags", lambda: self._mlflow.set_tags({k: str(v) for k, v in tags.items()}))

    def log_artifact(self, local_path: str, artifact_path: Optional[str] = None) -> None:
        """A file, or a folder's contents (under ``artifact_path``), one file per call (each one is progress)."""
        if os.path.isdir(local_path):
            for root, _, names in sorted(os.walk(local_path)):
                rel = os.path.relpath(root, local_path).replace(os.sep, "/")
                where = "/".join(p for p in (artifact_path, "" if rel == "." else rel) if p) or None
                for name in sorted(names):
                    path = os.path.join(root, name)
                    self._guard(f"log_artifact {where or ''}/{name}".replace(" /", " "),
                                functools.partial(self._log_one, path, where))
        else:
            self._guard("log_artifact", lambda: self._mlflow.log_artifact(local_path, artifact_path))

    def _log_one(self, path: str, where: Optional[str]) -> None:
        self._mlflow.log_artifact(path, where)  # looked up when called: tracking may be off by then

    def log_text(self, text: str, name: str) -> None:
        self._guard("log_text", lambda: self._mlflow.log_text(text, name))

    def log_keras_model(self, model: Any, input_specs: Mapping[str, tuple[str, list[int]]], num_classes: int,
                        registered_model_name: Optional[str] = None) -> Optional[str]:
        """Log with the Keras flavor and an explicit tensor signature; returns the model URI.

        Args:
            input_specs: each model input's (dtype, shape without the batch axis).
            registered_model_name: also register the logged model (a new version) under this name.
        """
        def log_model() -> str:
            info = self._mlflow.keras.log_model(model, name="model", signature=_signature(input_specs, num_classes),
                                                pip_requirements=_pip_requirements(),
                                                registered_model_name=registered_model_name)
            return info.model_uri

        return self._guard("log_model", log_model)

    def end(self, status: str = "FINISHED") -> None:
        """Close the run; status is FINISHED, FAILED or KILLED."""
        if self.run_id is None or self._mlflow is None:
            return
        self.flush(wait=True)
        if self.not_logged:
            log.warning("MLflow run %s misses: %s", self.run_id, "; ".join(self.not_logged))
        self._active = True  # one last attempt even after a failure, so the run is not left RUNNING
        with contextlib.redirect_stdout(sys.stderr):  # MLflow prints "View run ..." links: keep stdout for results
            self._guard("end_run", lambda: self._mlflow.end_run(status=status))
        self._active = False

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.end("FINISHED")
        else:
            self.end("KILLED" if issubclass(exc_type, KeyboardInterrupt) else "FAILED")


def _resume_run(mlflow: Any, run_id: str) -> Any:
    """The checkpoint's run, reopened (same run id); None when this store does not have it."""
    try:
        mlflow.MlflowClient().get_run(run_id)
    except mlflow.exceptions.MlflowException as exc:
        log.warning("the checkpoint's MLflow run %s is not in this tracking store (%s); starting a new run",
                    run_id, _first_line(exc))
        return None
    run = mlflow.start_run(run_id=run_id)
    log.info("continuing MLflow run %s (resumed from a checkpoint)", run_id)
    return run


def _experiment_id(mlflow: Any, name: str, artifact_location: Optional[str]) -> str:
    client = mlflow.MlflowClient()
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location)
    except mlflow.exceptions.MlflowException:
        found = client.get_experiment_by_name(name)  # another job created it meanwhile
        if found is None:
            raise
        return found.experiment_id


def _signature(input_specs: Mapping[str, tuple[str, list[int]]], num_classes: int) -> Any:
    import numpy as np
    from mlflow.models import ModelSignature
    from mlflow.types.schema import Schema, TensorSpec

    return ModelSignature(
        inputs=Schema([TensorSpec(np.dtype(dtype), (-1, *shape), name) for name, (dtype, shape) in input_specs.items()]),
        outputs=Schema([TensorSpec(np.dtype("float32"), (-1, num_classes), "logits")]),
    )


def _pip_requirements() -> list[str]:
    """Pinned from the running environment (MLflow's own inference would reload the model in a subprocess)."""
    from importlib import metadata

    out = []
    for dist in ("tensorflow-cpu", "tensorflow", "keras", "numpy"):
        try:
            out.append(f"{dist}=={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            continue
    return out


def start(cfg: JobConfig, is_chief: bool, tags: Mapping[str, str], resume_run_id: Optional[str] = None) -> Tracker:
    """A started tracker on rank 0 (when tracking is enabled); an inert one elsewhere."""
    tracker = Tracker(cfg, enabled=is_chief)
    tracker.start(tags, resume_run_id)
    return tracker


# -- reading models back (batch scoring) -------------------------------------------------------

_FILTER_VALUE = re.compile(r"[A-Za-z0-9_.:@ -]{1,256}")


def search_filter(**equals: str) -> str:
    """An MLflow search filter of ``field = 'value'`` terms; a value outside a safe character set is refused.

    MLflow filters have no bound parameters, so a value is checked, never spliced in as given (a quote in a
    model name would otherwise change the query).
    """
    for value in equals.values():
        if not _FILTER_VALUE.fullmatch(value):
            raise DataError(f"{value!r} cannot be searched for in MLflow: use letters, digits and _ . : @ - or "
                            "space only")
    return " and ".join(f"{key} = '{value}'" for key, value in equals.items())


def parse_model_ref(ref: str) -> tuple[str, str, str]:
    """MODEL -> (kind, name or run id, version/alias/artifact path) (pure).

    ``runs:/RUN/model`` -> ("run", RUN, "model"); ``models:/NAME/3`` -> ("version", NAME, "3");
    ``models:/NAME@champion`` -> ("alias", NAME, "champion"); ``NAME`` -> ("latest", NAME, "").
    """
    if ref.startswith("runs:/"):
        run_id, _, path = ref[len("runs:/"):].strip("/").partition("/")
        if not run_id:
            raise ValueError("runs:/ needs a run id: runs:/RUN_ID/model")
        return "run", run_id, path or "model"
    if ref.startswith("models:/"):
        body = ref[len("models:/"):].strip("/")
        if "@" in body:
            name, _, alias = body.partition("@")
            return "alias", name, alias
        name, _, version = body.partition("/")
        if not name or not version:
            raise ValueError("models:/ needs a version or an alias: models:/NAME/VERSION or models:/NAME@ALIAS")
        return ("latest", name, "") if version == "latest" else ("version", name, version)
    return "latest", ref, ""


def fetch_model(ref: str, local: str, tracking_cfg: Any = None, workdir: str = ".") -> tuple[str, str]:
    """Download a logged model's ``model.keras``, ``labels.json`` and ``tokenizer.json`` into ``local``.

    Returns (model URI, registered version or ""). Raises DataError naming the
    reference and the tracking store when MLflow does not have it.
    """
    import glob
    import shutil

    import mlflow

    store = resolve_store(getattr(tracking_cfg, "uri", None), os.environ, workdir)
    _set_tracking_uri(store.tracking_uri)
    client = mlflow.MlflowClient()
    try:
        kind, name, detail = parse_model_ref(ref)
        run_id, version, model_uri = _locate(client, kind, name, detail)
        model_dir = mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=os.path.join(local, "m"))
        for artifact in ("labels.json", "tokenizer.json"):
            try:
                mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=artifact, dst_path=local)
            except ANY_ERROR:  # tokenizer.json is absent for tabular models (checked by the caller)
                continue
    except (ValueError, mlflow.exceptions.MlflowException) as exc:
        shown_uri = secrets.redact_url(store.tracking_uri)
        raise DataError(f"--model {ref}: {_first_line(exc)} (tracking store {shown_uri}); pass "
                        "runs:/RUN_ID/model, models:/NAME/VERSION, models:/NAME@ALIAS, a registered model name or "
                        "a training output folder") from None
    found = glob.glob(os.path.join(model_dir, "**", "*.keras"), recursive=True)
    if not found:
        raise DataError(f"--model {ref}: the MLflow model at {model_uri} holds no .keras file; log it with "
                        "hvdtrain training (mlflow.keras flavor)")
    shutil.move(found[0], os.path.join(local, "model.keras"))
    return (f"models:/{name}/{version}" if version else model_uri), version


def _locate(client: Any, kind: str, name: str, detail: str) -> tuple[str, str, str]:
    """(run id, registered version, model URI) of a model reference."""
    if kind == "run":
        return name, "", f"runs:/{name}/{detail}"
    if kind == "alias":
        mv = client.get_model_version_by_alias(name, detail)
    elif kind == "version":
        mv = client.get_model_version(name, detail)
    else:
        versions = client.search_model_versions(search_filter(name=name))
        if not versions:
            raise ValueError(f"no registered model named {name!r}")
        mv = max(versions, key=lambda v: int(v.version))
    return mv.run_id, str(mv.version), f"models:/{name}/{mv.version}"


def pyfunc_spark_udf(spark: Any, model_uri: str, result_type: str = "array<float>") -> Any:
    """``mlflow.pyfunc.spark_udf`` of a logged model, in this environment (no conda/virtualenv rebuild)."""
    import mlflow

    return mlflow.pyfunc.spark_udf(spark, model_uri, result_type=result_type, env_manager="local")


# -- a hyperparameter study's parent run (the tune driver) --------------------------------------

class StudyRun:
    """The parent MLflow run of a study, driven through the client API (trials run in other processes).

    Like :class:`Tracker`, it never stops the work: an MLflow failure warns and the call is skipped.
    """

    def __init__(self, cfg: JobConfig):
        """Reads cfg.tracking and cfg.workdir (a default store's folder)."""
        self.settings, self.workdir = cfg.tracking, cfg.workdir
        self.run_id: Optional[str] = None
        self._client: Any = None

    def _call(self, what: str, fn: Callable[[], T]) -> Optional[T]:
        if not self.settings.enabled or (self._client is None and what != "open"):
            return None
        try:
            return fn()
        except ANY_ERROR as exc:  # tracking never stops the study
            log.warning("MLflow %s for the study failed (%s: %s); the study goes on", what, type(exc).__name__,
                        _first_line(exc))
            return None

    def open(self, run_id: Optional[str], name: str, tags: Mapping[str, str]) -> Optional[str]:
        """Reopen the study's run ``run_id`` (a resumed study), or start a new one; returns its id."""
        def start() -> str:
            import mlflow

            store = resolve_store(self.settings.uri, os.environ, self.workdir)
            if store.tracking_uri.startswith("sqlite:///"):
                os.makedirs(os.path.dirname(store.tracking_uri[len("sqlite:///"):]), exist_ok=True)
            _set_tracking_uri(store.tracking_uri)  # register_model() reads it
            self._client = mlflow.MlflowClient(store.tracking_uri)
            if run_id:
                try:
                    self._client.get_run(run_id)
                    self._client.update_run(run_id, status="RUNNING")
                    return run_id
                except mlflow.exceptions.MlflowException:
                    log.warning("the study's MLflow run %s is not in %s; starting a new one", run_id,
                                secrets.redact_url(store.tracking_uri))
            experiment_id = _experiment_id(mlflow, self.settings.experiment, store.artifact_location)
            return self._client.create_run(experiment_id, run_name=name, tags=dict(tags)).info.run_id

        self.run_id = self._call("open", start)
        return self.run_id

    def log_best(self, params: Mapping[str, Any]) -> None:
        """The best trial's values: as tags (they change when a resumed study finds a better trial) and,
        the first time, as params."""
        values = {k: "" if v is None else str(v)[:MAX_PARAM_LENGTH] for k, v in params.items()}

        def log_all() -> None:
            from mlflow.entities import Param, RunTag

            existing = self._client.get_run(self.run_id).data.params  # params are write-once in MLflow
            self._client.log_batch(self.run_id, params=[Param(k, v) for k, v in values.items() if k not in existing],
                                   tags=[RunTag(k, v) for k, v in values.items()])

        self._call("log_params", log_all)

    def log_metrics(self, metrics: Mapping[str, float]) -> None:
        def log_all() -> None:
            from mlflow.entities import Metric

            ms = int(time.time() * 1000)
            self._client.log_batch(self.run_id, metrics=[Metric(k, float(v), ms, 0) for k, v in metrics.items()])

        self._call("log_metrics", log_all)

    def log_artifact(self, path: str) -> None:
        self._call("log_artifact", lambda: self._client.log_artifact(self.run_id, path))

    def set_child_tags(self, run_id: str, tags: Mapping[str, Any]) -> None:
        self._call("set_tag", lambda: [self._client.set_tag(run_id, k, str(v)) for k, v in tags.items()])

    def fail_trial_runs(self, trial: int) -> None:
        """A trial whose driver died left its run RUNNING (or KILLED): mark it FAILED."""
        def fail() -> None:
            run = self._client.get_run(self.run_id)
            found = self._client.search_runs([run.info.experiment_id], search_filter(
                **{"tags.`mlflow.parentRunId`": str(self.run_id), "tags.tune_trial": str(trial)}))
            for child in found:
                if child.info.status not in ("FAILED", "FINISHED"):
                    self._client.set_terminated(child.info.run_id, status="FAILED")

        self._call("set_terminated", fail)

    def register(self, model_uri: str, name: str) -> Optional[str]:
        """Register a logged model (``models:/m-...`` or ``runs:/RUN/model``) as a new version of ``name``."""
        def register() -> str:
            import mlflow

            with contextlib.redirect_stdout(sys.stderr):
                mv = mlflow.register_model(model_uri, name)
            return f"models:/{name}/{mv.version}"

        return self._call("register_model", register)

    def end(self, status: str = "FINISHED") -> None:
        self._call("end", lambda: self._client.set_terminated(self.run_id, status=status))


def _set_tracking_uri(uri: str) -> None:
    """Point MLflow at ``uri``. A URI holding a password also stops MLflow's own "View run at <uri>" lines,
    which it writes to stdout unredacted (hvdtrain prints the run's address itself, redacted)."""
    import mlflow

    if secrets.has_secret(uri):
        os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
    mlflow.set_tracking_uri(uri)
