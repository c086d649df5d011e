"""Live metrics in the Prometheus text format: the only module that imports prometheus_client (lazily).

Every rank keeps its metrics in its own registry (:class:`Metrics`) and a
background thread (:class:`Exporter`) writes them every
``monitoring.interval_seconds`` to ``<textfile_dir>/hvdtrain_<job>_rank<R>.prom``
(``prometheus_client.write_to_textfile``: a temporary file renamed over the
old one, so node_exporter's textfile collector never reads half a file);
with ``monitoring.port`` rank 0 also serves ``/metrics``. The training
thread only updates numbers in memory (:class:`MetricsHook`); values that
need a device read (the loss, the learning rate) are read when the writer or
a scrape collects them, off the training thread.

Names follow Prometheus' conventions: the ``hvdtrain_`` prefix, base units
(seconds, bytes) in the name, ``_total`` on counters. Every metric carries
the labels ``job``, ``run_id``, ``rank`` and ``host``. See
``configs/prometheus/hvdtrain-alerts.yml`` for alert rules built on them.
"""
from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from hvdtrain.core.errors import ANY_ERROR, EnvironmentProblem
from hvdtrain.observe.events import Hook, LoopState, StepInfo

log = logging.getLogger("hvdtrain.training.train")

LABELS = ("job", "run_id", "rank", "host")
# Step durations of a small model on CPU are ~10 ms, of a large one on GPUs seconds.
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
SAVE_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)


@dataclass(frozen=True)
class MetricSpec:
    """One metric: its full name (as exposed), kind and help text."""

    name: str
    kind: str  # counter, gauge or histogram
    help: str


SPECS = (
    MetricSpec("hvdtrain_step_duration_seconds", "histogram",
               "Wall time of one optimizer step on this rank: waiting for input, computing and all-reducing."),
    MetricSpec("hvdtrain_samples_total", "counter", "Training examples this rank has processed."),
    MetricSpec("hvdtrain_steps_total", "counter", "Optimizer steps this rank has finished in this process."),
    MetricSpec("hvdtrain_data_wait_seconds_total", "counter", "Seconds this rank blocked waiting for input batches."),
    MetricSpec("hvdtrain_compute_seconds_total", "counter",
               "Seconds in the step function outside the timed all-reduce (all of it when the all-reduce "
               "is not timed separately)."),
    MetricSpec("hvdtrain_allreduce_seconds_total", "counter",
               "Seconds in the gradient all-reduce (includes waiting for slower ranks); 0 when not measured."),
    MetricSpec("hvdtrain_checkpoint_save_duration_seconds", "histogram",
               "Seconds the training thread spent on each checkpoint save (the publish runs in the background)."),
    MetricSpec("hvdtrain_checkpoint_save_bytes", "gauge", "Bytes of model and optimizer state in the last save."),
    MetricSpec("hvdtrain_checkpoint_restore_duration_seconds", "gauge",
               "Seconds spent reading and restoring the checkpoint this run resumed from (0: fresh start)."),
    MetricSpec("hvdtrain_checkpoint_restore_bytes", "gauge",
               "Bytes of checkpoint state this rank read from storage on resume (rank 0 reads, others receive)."),
    MetricSpec("hvdtrain_restarts_total", "counter", "Automatic restarts of this job before this try (hvdtrain.runtime.supervise)."),
    MetricSpec("hvdtrain_skipped_steps_total", "counter",
               "Optimizer steps skipped for non-finite gradients (float16 loss scaling) in this process."),
    MetricSpec("hvdtrain_epoch", "gauge", "Current epoch (1-based)."),
    MetricSpec("hvdtrain_step", "gauge", "Last finished global optimizer step."),
    MetricSpec("hvdtrain_learning_rate", "gauge", "Current learning rate."),
    MetricSpec("hvdtrain_loss", "gauge", "Mean training loss of this rank's last step."),
    MetricSpec("hvdtrain_last_progress_timestamp_seconds", "gauge", "Unix time of this rank's last finished step."),
    MetricSpec("hvdtrain_training_active", "gauge", "1 while this rank trains; 0 once training has ended."),
    MetricSpec("hvdtrain_stall_timeout_seconds", "gauge",
               "fault.stall_timeout: a rank without progress for this long is ended by the watchdog."),
)


METRICS_FILE_MODE = 0o644  # the .prom files: node_exporter reads them as another user

def base_name(spec: MetricSpec) -> str:
    """The name prometheus_client takes (it appends ``_total`` to counters itself) (pure)."""
    return spec.name[:-len("_total")] if spec.kind == "counter" else spec.name


def textfile_path(folder: str, job: str, rank: int) -> str:
    """This rank's file for the textfile collector (it reads ``*.prom``) (pure)."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in job)
    return os.path.join(folder, f"hvdtrain_{safe}_rank{rank}.prom")


def available() -> Optional[str]:
    """None when prometheus_client imports, else why not (with the fix)."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError as exc:
        return (f"monitoring.enabled is true but prometheus_client does not import ({exc}); install it "
                "(pip install 'prometheus_client>=0.20,<0.27', a dependency of hvdtrain) or set "
                "monitoring.enabled=false")
    return None


def check_port_free(port: int, host: str = "127.0.0.1") -> Optional[str]:
    """None when ``port`` can be bound, else a one-line explanation with the fix."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            return (f"monitoring.port={port} is not free on {host} of {socket.gethostname()} ({exc.strerror}): rank 0 "
                    "serves /metrics there; choose a free port, or set monitoring.port=null and use the "
                    "textfile files")
    return None


class Metrics:
    """One rank's metrics in its own registry, every one bound to this rank's labels."""

    def __init__(self, job: str, run_id: str, rank: int, host: str):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        kinds = {"counter": Counter, "gauge": Gauge, "histogram": Histogram}
        values = {"job": job, "run_id": run_id, "rank": str(rank), "host": host}
        self._m: dict[str, Any] = {}
        for spec in SPECS:
            extra = {}
            if spec.kind == "histogram":
                extra["buckets"] = SAVE_BUCKETS if "checkpoint" in spec.name else STEP_BUCKETS
            metric = kinds[spec.kind](base_name(spec), spec.help, LABELS, registry=self.registry, **extra)
            self._m[spec.name] = metric.labels(**values)

    def __getitem__(self, name: str) -> Any:
        return self._m[name]

    def read_at_collect(self, name: str, fn: Callable[[], float]) -> None:
        """The gauge ``name`` calls ``fn`` whenever it is collected (NaN when that fails)."""
        def safe() -> float:
            try:
                return float(fn())
            except ANY_ERROR:  # a metric must never break a scrape or the writer
                return math.nan

        self._m[name].set_function(safe)

    def text(self) -> str:
        """The Prometheus text exposition of every metric."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry).decode()


class Exporter:
    """Writes a registry to the textfile every ``interval`` seconds from a daemon thread; optionally
    serves it on ``port`` (rank 0). A write failure is a warning: monitoring never stops training."""

    def __init__(self, metrics: Metrics, path: str, interval: float, port: Optional[int] = None,
                 before_write: Callable[[], None] = lambda: None, addr: str = "127.0.0.1"):
        self.metrics, self.path, self.interval, self.port, self.addr = metrics, path, interval, port, addr
        self._before_write = before_write
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._server: Any = None
        self.writes = 0
        self._warned = False

    def start(self) -> "Exporter":
        folder = os.path.dirname(self.path) or "."
        if not os.path.isdir(folder):  # one hvdtrain creates: the collector must be able to look in
            os.makedirs(folder, exist_ok=True)
            os.chmod(folder, 0o755)
        if self.port is not None:
            from prometheus_client import start_http_server

            try:
                self._server, _ = start_http_server(self.port, addr=self.addr, registry=self.metrics.registry)
            except OSError as exc:
                raise EnvironmentProblem(check_port_free(self.port, self.addr)
                                         or f"monitoring.port={self.port}: {exc}") from exc
        self.metrics["hvdtrain_training_active"].set(1)
        self.write()
        self._thread = threading.Thread(target=self._loop, name="hvdtrain-metrics", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.write()

    def write(self) -> None:
        """One atomic write of the textfile (temp file, then rename), readable by every user: node_exporter's
        textfile collector runs as its own user, and the ranks' umask (077) would keep it out."""
        from prometheus_client import generate_latest

        try:
            self._before_write()
            text = generate_latest(self.metrics.registry)
            tmp = f"{self.path}.{os.getpid()}.tmp"  # never *.prom: the collector reads only those
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, METRICS_FILE_MODE), "wb") as fh:
                os.fchmod(fh.fileno(), METRICS_FILE_MODE)  # whatever the umask
                fh.write(text)
            os.replace(tmp, self.path)
            self.writes += 1
        except ANY_ERROR as exc:  # monitoring never stops training
            if not self._warned:
                log.warning("writing metrics to %s failed (%s: %s); training goes on", self.path,
                            type(exc).__name__, exc)
                self._warned = True

    def stop(self) -> None:
        """Stop the thread, write the final values (training no longer active), stop serving."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.metrics["hvdtrain_training_active"].set(0)
        self.write()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "Exporter":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class MetricsHook(Hook):
    """Updates this rank's :class:`Metrics` after each step and checkpoint save (in memory only).

    ``allreduce_seconds`` says how long the last step's all-reduce took (None:
    not measured); ``last_save`` is the checkpointer's last save
    (:class:`hvdtrain.training.resume.SaveTiming`; the hook sits after it in the list);
    ``optimizer_steps`` reads the optimizer's step counter (it does not
    advance on a skipped step), when the writer calls :meth:`refresh`.
    """

    def __init__(self, metrics: Metrics, allreduce_seconds: Callable[[], Optional[float]],
                 last_save: Callable[[], Any], optimizer_steps: Callable[[], int]):
        self.m, self._allreduce, self._last_save = metrics, allreduce_seconds, last_save
        self._optimizer_steps, self._counter_start = optimizer_steps, optimizer_steps()
        self._steps, self._skipped, self._saved_step = 0, 0, -1
        self._loss: tuple[Any, int] = (math.nan, 1)
        metrics.read_at_collect("hvdtrain_loss", lambda: float(self._loss[0]) / max(self._loss[1], 1))
        metrics["hvdtrain_last_progress_timestamp_seconds"].set(time.time())  # starting counts as progress

    def start_epoch(self, epoch: int) -> None:
        self.m["hvdtrain_epoch"].set(epoch)

    def on_step(self, info: StepInfo) -> None:
        allreduce = self._allreduce() or 0.0
        m = self.m
        m["hvdtrain_step_duration_seconds"].observe(info.data_seconds + info.step_seconds)
        m["hvdtrain_samples_total"].inc(info.examples)
        m["hvdtrain_steps_total"].inc()
        m["hvdtrain_data_wait_seconds_total"].inc(info.data_seconds)
        m["hvdtrain_allreduce_seconds_total"].inc(allreduce)
        m["hvdtrain_compute_seconds_total"].inc(max(info.step_seconds - allreduce, 0.0))
        m["hvdtrain_step"].set(info.global_step)
        m["hvdtrain_last_progress_timestamp_seconds"].set(time.time())
        self._loss = (info.loss_sum, info.examples)  # a tensor: read when collected, not here
        self._steps += 1

    def after_step(self, state: LoopState) -> None:
        record = self._last_save()
        if record is not None and record.step == state.step and record.step != self._saved_step:
            self._saved_step = record.step
            self.m["hvdtrain_checkpoint_save_duration_seconds"].observe(record.seconds)
            self.m["hvdtrain_checkpoint_save_bytes"].set(record.bytes)

    def refresh(self) -> None:
        """Values read from the device, at write time (the writer thread): skipped steps."""
        skipped = self._steps - (int(self._optimizer_steps()) - self._counter_start)
        if skipped > self._skipped:
            self.m["hvdtrain_skipped_steps_total"].inc(skipped - self._skipped)
            self._skipped = skipped


def restored(metrics: Metrics, seconds: float, nbytes: int, restarts: int) -> None:
    """Record how this run resumed (nothing for a fresh start)."""
    metrics["hvdtrain_checkpoint_restore_duration_seconds"].set(seconds)
    metrics["hvdtrain_checkpoint_restore_bytes"].set(nbytes)
    if restarts:
        metrics["hvdtrain_restarts_total"].inc(restarts)
