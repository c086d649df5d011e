"""TensorBoard for every training run: event files under ``<train.output>/tensorboard``, and
``hvdtrain tensorboard`` to look at them. This module owns TensorBoard (``tf.summary``'s writer and
the ``tensorboard`` package).

A run's events reach ``train.output`` only with the rest of its outputs (the folder is replaced whole, or not at
all: :func:`hvdtrain.training.publish.upload_dir`). While it trains they go to its live folder beside its
checkpoints, ``<checkpoint.dir>/tensorboard`` (``hvdtrain tensorboard <checkpoint.dir>`` shows them): a run that
fails leaves the previous output, its events included, as it was.

:class:`TensorBoardHook` (rank 0 only) hands per-step scalars (every ``tensorboard.every_steps``
steps: loss, samples/s, learning rate, data wait and step time), per-epoch scalars (the epoch's
metrics, validation included; the step-time breakdown when it is on) and the model's graph (once)
to a background writer thread, so a step never waits on a disk or on HDFS. The writer writes event
files to a local folder and publishes them to the live folder (flush, then copy through :mod:`hvdtrain.hadoop.fs`,
so an ``hdfs://`` checkpoint folder works) when a checkpoint was saved and when training ends. Every scalar is
indexed by the global step, the checkpoints' own numbering: a resumed run goes on along the same
axis, and on resuming from step S the earlier event files are rewritten without their events after
S (steps the interrupted run did but did not checkpoint, which the resumed run does again).
"""
from __future__ import annotations

import logging
import os
import queue
import shutil
import tempfile
import threading
import time
from typing import Any, Callable, Mapping, Optional, Sequence

from hvdtrain.core.errors import ANY_ERROR, UsageError
from hvdtrain.hadoop import fs, ledger
from hvdtrain.observe.events import EpochStats, Hook, LoopState, StepInfo

log = logging.getLogger("hvdtrain.training.train")

FOLDER = "tensorboard"
EVENTS_PREFIX = "events.out.tfevents."
QUEUE_SIZE = 10_000  # write requests waiting for the writer; beyond it scalars are dropped, never waited for


WRITER = "hvdtrain tensorboard"  # the writer named in the live folder's ledger (hvdtrain.hadoop.ledger)
EVENTS = ledger.Ledger(WRITER, (ledger.exact(EVENTS_PREFIX) + "*",))  # what the writer owns in the live folder


def output_dir(train_output: str) -> str:
    """Where a finished run's event files are published, with its other outputs (pure)."""
    return fs.join(train_output, FOLDER)


def live_dir(checkpoint_dir: str) -> str:
    """Where a run's event files go while it trains: beside its checkpoints, never into train.output (pure)."""
    return fs.join(checkpoint_dir, FOLDER)


def step_scalars(info: StepInfo, world_size: int, steps: int, seconds: float, learning_rate: float) -> dict[str, float]:
    """The per-step scalars of a logging point (pure); ``steps`` and ``seconds`` span the steps since the last."""
    return {"train/loss": float(info.loss_sum) / max(info.examples, 1), "train/learning_rate": learning_rate,
            "train/samples_per_sec": info.examples * world_size * steps / seconds if seconds > 0 else 0.0,
            "train/data_wait_seconds": info.data_seconds, "train/step_seconds": info.step_seconds}


def epoch_scalars(stats: EpochStats) -> dict[str, float]:
    """The per-epoch scalars (pure): the epoch's metrics (``val_`` ones included) under ``epoch/``."""
    return {f"epoch/{name}": float(value) for name, value in stats.metrics().items()}


class Writer:
    """A thread that owns a ``tf.summary`` file writer; callers only enqueue (never block).

    Requests: ``("scalars", step, {tag: value})``, ``("graph", graph)``, ``("publish", None)``;
    ``None`` ends the thread after a last publish.
    """

    def __init__(self, local: str, remote: str):
        self.local, self.remote = local, remote
        self.queue: "queue.Queue[Optional[tuple[str, Any, Any]]]" = queue.Queue(QUEUE_SIZE)
        self.dropped = 0
        self.published = 0
        self._thread = threading.Thread(target=self._run, name="hvdtrain-tensorboard", daemon=True)
        self._thread.start()

    def put(self, kind: str, step: Any = None, payload: Any = None) -> None:
        try:
            self.queue.put_nowait((kind, step, payload))
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1:
                log.warning("TensorBoard: the event writer falls behind; scalars are dropped (training goes on)")

    def close(self, timeout: float = 600.0) -> None:
        """Write what is queued, publish, and stop the thread."""
        self.queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        import tensorflow as tf

        writer = tf.summary.create_file_writer(self.local, max_queue=1000, flush_millis=10 ** 9)
        with writer.as_default():
            while True:
                item = self.queue.get()
                if item is None:
                    break
                self._handle(tf, writer, *item)
        writer.flush()
        writer.close()
        self._publish()

    def _handle(self, tf: Any, writer: Any, kind: str, step: Any, payload: Any) -> None:
        try:
            if kind == "scalars":
                for tag, value in payload.items():
                    tf.summary.scalar(tag, float(value), step=step)
            elif kind == "graph":
                tf.summary.graph(payload)
            elif kind == "publish":
                writer.flush()
                self._publish()
        except ANY_ERROR as exc:  # TensorBoard never breaks training
            log.warning("TensorBoard: %s failed (%s: %s); training goes on", kind, type(exc).__name__, exc)

    def _publish(self) -> None:
        if self.remote is None:
            return
        try:
            for name in sorted(os.listdir(self.local)):
                fs.copy_from_local(os.path.join(self.local, name), fs.join(self.remote, name))
            self.published += 1
        except ANY_ERROR as exc:  # the next publish tries again
            log.warning("TensorBoard: publishing to %s failed (%s: %s); training goes on", self.remote,
                        type(exc).__name__, exc)


class TensorBoardHook(Hook):
    """Rank 0's TensorBoard events (see the module docstring); built before training starts."""

    def __init__(self, writer: Writer, every_steps: int, world_size: int, learning_rate: Callable[[], float],
                 saved_step: Callable[[], Optional[int]], clock: Callable[[], float] = time.perf_counter):
        self.writer, self.every, self.world_size = writer, every_steps, world_size
        self._learning_rate, self._saved_step, self._clock = learning_rate, saved_step, clock
        self.step = 0
        self._since, self._mark = 0, clock()

    def on_step(self, info: StepInfo) -> None:
        self.step = info.global_step
        self._since += 1
        if info.global_step % self.every:
            return
        now = self._clock()
        self.writer.put("scalars", info.global_step, step_scalars(
            info, self.world_size, self._since, now - self._mark, self._learning_rate()))
        self._since, self._mark = 0, now

    def end_epoch(self, stats: EpochStats) -> bool:
        self.writer.put("scalars", self.step, epoch_scalars(stats))
        return False

    def after_step(self, state: LoopState) -> None:
        if self._saved_step() == state.step:  # a checkpoint was just saved: its events go with it
            self.writer.put("publish")

    def log_metrics(self, metrics: Mapping[str, float], step: Optional[int] = None) -> None:
        """Extra per-epoch scalars (the step-time breakdown) at the current global step; ``step`` is ignored."""
        self.writer.put("scalars", self.step, {f"breakdown/{k}": v for k, v in metrics.items()})

    def add_graph(self, graph: Callable[[], Any]) -> None:
        """Queue the model's graph (once per run); a model that does not trace still trains."""
        try:
            self.writer.put("graph", None, graph())
        except ANY_ERROR as exc:  # a model that does not trace still trains
            log.warning("TensorBoard: the model graph could not be traced (%s: %s)", type(exc).__name__, exc)

    def close(self) -> None:
        self.writer.close()


def model_graph(model: Any, input_specs: Mapping[str, tuple[str, Sequence[int]]]) -> Any:
    """The graph of the model's forward pass (traced once, before training)."""
    import tensorflow as tf

    specs = {name: tf.TensorSpec([None, *shape], dtype, name=name) for name, (dtype, shape) in input_specs.items()}
    return tf.function(lambda inputs: model(inputs, training=False)).get_concrete_function(specs).graph


def prepare(local: str, remote: str, resume_step: int) -> None:
    """Make ``local`` this run's event folder and ``remote`` (the live folder) its own: a fresh run deletes the
    event files an earlier run recorded there (its ledger; nothing else); a resumed run takes them back, without
    the events after ``resume_step``."""
    os.makedirs(local, exist_ok=True)
    found = ledger.read_own(remote, WRITER, "the live TensorBoard folder") if fs.exists(remote) else None
    if resume_step == 0:
        if found is not None:
            ledger.delete_owned(remote, lambda rel: rel != ledger.NAME and found.owns(rel))
        fs.makedirs(remote)
        ledger.write(remote, EVENTS)  # before the first event file
        return
    names = [n for n in fs.listdir(remote) if n.startswith(EVENTS_PREFIX)] if found is not None else []
    for name in names:
        with tempfile.TemporaryDirectory(prefix="hvdtrain-tb-") as tmp:
            fs.copy_to_local(fs.join(remote, name), os.path.join(tmp, name))
            kept, dropped = truncate_events(os.path.join(tmp, name), os.path.join(local, name), resume_step)
        if dropped:
            log.info("TensorBoard: %s: dropped %d event(s) after step %d (the resumed run does them again)",
                     name, dropped, resume_step)


def truncate_events(src: str, dst: str, max_step: int) -> tuple[int, int]:
    """Copy an event file without its events after ``max_step``; (kept, dropped)."""
    import tensorflow as tf

    kept = dropped = 0
    with tf.io.TFRecordWriter(dst) as out:
        for event in tf.compat.v1.train.summary_iterator(src):
            if event.step > max_step:
                dropped += 1
                continue
            out.write(event.SerializeToString())
            kept += 1
    return kept, dropped


def start_hook(local: str, checkpoint_dir: str, every_steps: int, world_size: int, resume_step: int,
               learning_rate: Callable[[], float], saved_step: Callable[[], Optional[int]]) -> Optional[TensorBoardHook]:
    """Rank 0's hook, its folders prepared (``local``, and the live folder under ``checkpoint_dir``); None (with
    a warning) when TensorBoard is not installed or the live folder cannot be prepared: training goes on."""
    missing = available()
    if missing:
        log.warning("%s; training goes on without TensorBoard events", missing)
        return None
    remote = live_dir(checkpoint_dir)
    try:
        prepare(local, remote, resume_step)
    except ANY_ERROR as exc:  # TensorBoard never breaks training
        log.warning("TensorBoard: could not prepare %s (%s: %s); training goes on without it", remote,
                    type(exc).__name__, exc)
        return None
    writer = Writer(local, remote)
    return TensorBoardHook(writer, every_steps, world_size, learning_rate, saved_step)


def available() -> Optional[str]:
    """None when the ``tensorboard`` package (tf.summary's implementation) imports, else why not."""
    try:
        import tensorboard  # noqa: F401
    except ImportError as exc:
        return f"TensorBoard is not installed ({exc}); pip install 'tensorboard>=2.20,<2.22'"
    return None


# -- hvdtrain tensorboard ---------------------------------------------------------------------------

def find_logdir(target: str) -> str:
    """The event folder of a training output (``<output>/tensorboard``) or of the folder itself."""
    for candidate in (output_dir(target), target):
        if fs.exists(candidate) and any(n.startswith(EVENTS_PREFIX) for n in fs.listdir(candidate)):
            return candidate
    raise UsageError(f"no TensorBoard event files in {output_dir(target)} or {target}: pass a training output "
                     "folder (train.output) or its tensorboard/ folder, local or hdfs://")


def stage(logdir: str, local: str) -> str:
    """A local copy of a remote event folder (TensorBoard reads local files); a local folder as is."""
    if fs.is_local(logdir):
        return fs.local_path(logdir)
    for name in fs.listdir(logdir):
        if name.startswith(EVENTS_PREFIX):
            fs.copy_to_local(fs.join(logdir, name), os.path.join(local, name))
    return local


def _forever() -> None:
    while True:
        time.sleep(3600)


def serve(target: str, port: int = 6006, ready: Callable[[str], None] = print,
          wait: Callable[[str], None] = lambda url: _forever()) -> int:
    """``hvdtrain tensorboard``: TensorBoard on 127.0.0.1 over a run's events until ``wait(url)`` returns
    (by default: until Ctrl-C)."""
    missing = available()
    if missing:
        raise UsageError(missing)
    from tensorboard import program

    logdir = find_logdir(target)
    with tempfile.TemporaryDirectory(prefix="hvdtrain-tensorboard-") as tmp:
        folder = stage(logdir, tmp)
        board = program.TensorBoard()
        board.configure(argv=[None, "--logdir", folder, "--host", "127.0.0.1", "--port", str(port)])
        url = board.launch()
        ready(f"TensorBoard on {url} for {logdir}" + (f" (staged in {folder})" if folder != logdir else "")
              + "; Ctrl-C stops it")
        try:
            wait(url)
        except KeyboardInterrupt:
            pass
    return 0


def copy_events(local: str, into: str) -> None:
    """Put the run's event files into the folder published as ``train.output`` (``<into>/tensorboard``)."""
    if os.path.isdir(local) and os.listdir(local):
        shutil.copytree(local, os.path.join(into, FOLDER), dirs_exist_ok=True)

