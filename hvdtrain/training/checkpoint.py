"""Checkpoints that are atomic on any filesystem and resumable exactly.

Layout: ``<dir>/ckpt-<step>/`` holding ``state.bin`` (every variable as a
named array in one buffer: model weights, optimizer slots and step counter, per-rank RNG
states), ``meta.json`` (step, epoch, input position, metrics, config hash),
then ``checksums.json`` (CRC32C of both: hardware-accelerated, it catches torn
and corrupted writes at disk speed), then an empty ``COMMIT`` marker, written last.
A folder without ``COMMIT``, or whose files do not match their checksums, is not a checkpoint: readers skip it with a warning naming it.

Rank 0 snapshots the state to local staging (fast), and a background thread
publishes it to the checkpoint folder (local, ``hdfs://``, ``webhdfs://``)
while training goes on; at most one publish is in flight. For a local
checkpoint folder the staging folder sits inside it, so publishing is a rename. Retention keeps the
newest ``keep_last`` and the best ``keep_best`` by a metric.

Policies (when to save, what to keep) are pure functions; the writer acts.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import threading
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

import google_crc32c
import numpy as np

from hvdtrain.core.errors import ANY_ERROR, ANY_FAILURE, DataError, StorageError
from hvdtrain.hadoop import fs

log = logging.getLogger(__name__)

STATE, META, CHECKSUMS, COMMIT = "state.bin", "meta.json", "checksums.json", "COMMIT"
DATA_FILES = (STATE, META)
_NAME = re.compile(r"^ckpt-(\d{10})$")


# -- policies (pure) ------------------------------------------------------------------

def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:010d}"


def save_due(step: int, steps_per_epoch: int, every_steps: int, at_epoch_end: bool) -> bool:
    """Whether optimizer step ``step`` (1-based, global across epochs) ends with a save."""
    if every_steps and step % every_steps == 0:
        return True
    return at_epoch_end and steps_per_epoch > 0 and step % steps_per_epoch == 0


@dataclass
class CheckpointInfo:
    name: str
    uri: str
    step: int
    epoch: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    bytes: int = 0
    status: str = "ok"  # ok | uncommitted | corrupt | missing | unreadable (a storage error: proves nothing)
    detail: str = ""

    @property
    def valid(self) -> bool:
        return self.status == "ok"


PROVEN_BAD = ("uncommitted", "corrupt")  # what a successful listing or read showed; retention may delete these


@dataclass(frozen=True)
class Retention:
    keep: list[str]
    delete: list[str]


def retention(infos: list[CheckpointInfo], keep_last: int, keep_best: int, metric: str,
              mode: str = "max") -> Retention:
    """Keep the newest ``keep_last`` and the best ``keep_best`` by ``metric``; delete the rest.

    Only valid checkpoints are ranked. Of the others, only those proven bad
    (``PROVEN_BAD``: a listing that succeeded shows no commit marker, or a read
    that succeeded shows a bad file) are deleted, and not when they are newer
    than every valid one (that may be a publish still in flight). One the
    storage failed to show (``unreadable``, a transient or denied read) proves
    nothing: it is kept, whatever its rank (it may be the best).
    """
    valid = sorted((i for i in infos if i.valid), key=lambda i: i.step)
    keep = {i.name for i in valid[-keep_last:]} if keep_last else set()
    scored = [i for i in valid if metric in i.metrics]
    best = sorted(scored, key=lambda i: (i.metrics[metric] if mode == "max" else -i.metrics[metric], i.step),
                  reverse=True)
    keep |= {i.name for i in best[:keep_best]}
    newest_valid = valid[-1].step if valid else -1
    keep |= {i.name for i in infos if not i.valid and (i.step > newest_valid or i.status not in PROVEN_BAD)}
    ordered = sorted(infos, key=lambda i: i.step)
    return Retention([i.name for i in ordered if i.name in keep], [i.name for i in ordered if i.name not in keep])


# -- state (de)serialization -----------------------------------------------------------

_MAGIC = b"HVDTCKPT1"


def pack_parts(arrays: dict[str, np.ndarray]) -> list[memoryview]:
    """The state file as buffers (no copy of the arrays): magic, header length,
    JSON header (name, dtype, shape, offset), then each array's bytes."""
    header, offset, parts = [], 0, []
    for name, array in arrays.items():
        data = np.asarray(array)
        data = data if data.flags.c_contiguous else data.copy(order="C")  # keeps 0-d arrays 0-d
        header.append({"name": name, "dtype": data.dtype.str, "shape": list(data.shape), "offset": offset})
        parts.append(data.reshape(-1).data.cast("B"))  # ndarray.data: the memoryview of its buffer
        offset += data.nbytes
    head = json.dumps(header).encode()
    return [memoryview(_MAGIC + len(head).to_bytes(8, "little") + head), *parts]


def pack(arrays: dict[str, np.ndarray]) -> bytes:
    return b"".join(pack_parts(arrays))


def unpack(blob: Any) -> dict[str, np.ndarray]:
    """The arrays of :func:`pack`, as read-only views of ``blob`` (no copy)."""
    view = memoryview(blob)
    if bytes(view[:len(_MAGIC)]) != _MAGIC:
        raise DataError("not an hvdtrain checkpoint state file (bad magic)")
    n = int.from_bytes(view[len(_MAGIC):len(_MAGIC) + 8], "little")
    start = len(_MAGIC) + 8 + n
    out = {}
    for item in json.loads(bytes(view[len(_MAGIC) + 8:start])):
        dtype = np.dtype(item["dtype"])
        count = int(np.prod(item["shape"])) if item["shape"] else 1
        out[item["name"]] = np.frombuffer(blob, dtype, count, start + item["offset"]).reshape(tuple(item["shape"]))
    return out


def checksum(blob: Any) -> str:
    """CRC32C of bytes, a buffer (``fs.read_buffer``), a memoryview, or a list of them in order; never copies."""
    parts = blob if isinstance(blob, list) else [blob]
    crc = 0
    for part in parts:
        crc = google_crc32c.extend(crc, part if isinstance(part, bytes) else fs.readonly_buffer(part))
    return f"crc32c:{crc:08x}"


# -- reading --------------------------------------------------------------------------

def scan(root: str, verify: bool = True) -> list[CheckpointInfo]:
    """Every ``ckpt-*`` folder under ``root``, oldest first, with its status."""
    if not fs.exists(root):
        return []
    out = []
    for name in fs.listdir(root):
        match = _NAME.match(name)
        if match:
            out.append(inspect(fs.join(root, name), name, int(match.group(1)), verify))
    return out


def inspect(uri: str, name: str, step: int, verify: bool = True) -> CheckpointInfo:
    info = CheckpointInfo(name=name, uri=uri, step=step)
    try:
        files = set(fs.listdir(uri))
    except FileNotFoundError:
        info.status, info.detail = "missing", "no such folder"
        return info
    except (StorageError, OSError) as exc:  # the listing failed: it shows nothing about the COMMIT marker
        info.status, info.detail = "unreadable", _first_line(exc)
        return info
    try:
        if COMMIT not in files:  # a listing that succeeded: proof of an interrupted publish
            info.status, info.detail = "uncommitted", "no COMMIT marker (an interrupted publish)"
            return info
        sums = json.loads(fs.read_bytes(fs.join(uri, CHECKSUMS)))
        meta = json.loads(fs.read_bytes(fs.join(uri, META)))
        info.epoch, info.metrics = meta.get("epoch", 0), meta.get("metrics", {})
        info.bytes = sum(fs.size(fs.join(uri, f)) for f in DATA_FILES)
        if verify:
            for f in DATA_FILES:
                if checksum(fs.read_buffer(fs.join(uri, f))) != sums.get(f):
                    info.status, info.detail = "corrupt", f"{f} does not match its checksum"
                    return info
    except (StorageError, PermissionError) as exc:  # the storage failed (after fs's retries): proves nothing
        info.status, info.detail = "unreadable", _first_line(exc)
    except (FileNotFoundError, ValueError, KeyError, DataError) as exc:  # committed, but a file is missing or bad
        info.status, info.detail = "corrupt", _first_line(exc)
    except OSError as exc:
        info.status, info.detail = "unreadable", _first_line(exc)
    return info


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0]}" if str(exc) else type(exc).__name__


def _refuse_to_go_back(info: CheckpointInfo) -> None:
    """A committed checkpoint that cannot be read is not skipped: an older one would silently undo training."""
    raise StorageError(f"checkpoint {info.uri} could not be read ({info.detail}); it may be the newest committed "
                       "one, and resuming from an older checkpoint would silently go back in time, so the job "
                       "stops: fix the storage and rerun "
                       f"(the same checkpoint is then used), or move {info.name} out of the checkpoint folder to "
                       "resume from the one before it")


def latest_valid(root: str) -> Optional[CheckpointInfo]:
    """The newest checkpoint that verifies; each one skipped on the way is named in a warning.

    Only provably bad checkpoints are skipped (no COMMIT marker, a checksum or
    content mismatch); a committed one the storage cannot read stops with an error.
    """
    for info in reversed(scan(root, verify=False)):
        if info.status == "ok":
            info = inspect(info.uri, info.name, info.step, verify=True)
        if info.valid:
            return info
        if info.status == "unreadable":
            _refuse_to_go_back(info)
        log.warning("skipping checkpoint %s: %s (%s)", info.uri, info.status, info.detail)
    return None


def newest_step(root: str) -> Optional[int]:
    """The step of the newest committed checkpoint (checksums not read: for reports, not for resuming)."""
    try:
        committed = [i.step for i in scan(root, verify=False) if i.valid]
    except (OSError, DataError):
        return None
    return committed[-1] if committed else None


def load(info: CheckpointInfo) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(arrays, meta) of a checkpoint, each file read once and checked against its checksum."""
    sums = json.loads(fs.read_bytes(fs.join(info.uri, CHECKSUMS)))
    blobs = {}
    for name in DATA_FILES:
        blobs[name] = fs.read_buffer(fs.join(info.uri, name))
        if checksum(blobs[name]) != sums.get(name):
            raise DataError(f"checkpoint {info.uri}: {name} does not match its checksum")
    return unpack(blobs[STATE]), json.loads(blobs[META].to_pybytes())


def restore_latest(root: str) -> Optional[tuple[CheckpointInfo, dict[str, np.ndarray], dict[str, Any]]]:
    """The newest committed checkpoint that verifies, loaded; each one skipped is named in a warning.

    Raises:
        DataError: when a committed checkpoint newer than any usable one cannot be read (storage error
            after retries): the job stops rather than silently resume from an older one.
    """
    for info in reversed(scan(root, verify=False)):
        if info.valid:
            try:
                arrays, meta = load(info)
                return info, arrays, meta
            except (StorageError, PermissionError) as exc:
                info.status, info.detail = "unreadable", _first_line(exc)
            except (FileNotFoundError, ValueError, DataError) as exc:
                info.status, info.detail = "corrupt", _first_line(exc)
            except OSError as exc:
                info.status, info.detail = "unreadable", _first_line(exc)
        if info.status == "unreadable":
            _refuse_to_go_back(info)
        log.warning("skipping checkpoint %s: %s (%s)", info.uri, info.status, info.detail)
    return None


# -- writing --------------------------------------------------------------------------

class CheckpointWriter:
    """Rank 0's checkpoint saver: snapshot to local staging, publish in the background."""

    def __init__(self, root: str, keep_last: int = 3, keep_best: int = 1, metric: str = "validation_accuracy",
                 mode: str = "max", background: bool = True,
                 publish_fn: Optional[Callable[[str, str], None]] = None):
        self.root = root
        self.keep_last, self.keep_best, self.metric, self.mode = keep_last, keep_best, metric, mode
        self.prune_failures = 0
        self.background = background
        self._publish_fn = publish_fn or publish
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self.published: list[str] = []
        if fs.is_local(root) and os.path.isdir(fs.local_path(root)):
            for name in os.listdir(fs.local_path(root)):  # left by a run that died mid-save
                if name.startswith(".staging-"):
                    shutil.rmtree(os.path.join(fs.local_path(root), name), ignore_errors=True)

    def save(self, step: int, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
        """Stage now; publish in the background after any publish still in flight."""
        self.wait()
        staging = self._staging_dir(step)
        parts = pack_parts(arrays)
        meta_blob = json.dumps({"step": step, **meta}, indent=2, sort_keys=True).encode()
        for name, data in ((STATE, parts), (META, [memoryview(meta_blob)])):
            with open(os.path.join(staging, name), "wb") as fh:
                for part in data:
                    fh.write(part)
        with open(os.path.join(staging, CHECKSUMS), "w") as fh:
            json.dump({STATE: checksum(parts), META: checksum(meta_blob)}, fh)
        dest = fs.join(self.root, checkpoint_name(step))
        if self.background:
            self._thread = threading.Thread(target=self._publish, args=(staging, dest), daemon=True,
                                            name="hvdtrain-checkpoint")
            self._thread.start()
        else:
            self._publish(staging, dest)
            self.wait()

    def _staging_dir(self, step: int) -> str:
        """Inside the checkpoint folder when it is local (publish = rename), else a temp folder."""
        if fs.is_local(self.root):
            root = fs.local_path(self.root)
            os.makedirs(root, exist_ok=True)
            return tempfile.mkdtemp(prefix=f".staging-{step}-", dir=root)
        return tempfile.mkdtemp(prefix="hvdtrain-ckpt-")

    def _publish(self, staging: str, dest: str) -> None:
        try:
            self._publish_fn(staging, dest)
            self.published.append(dest)
        except ANY_FAILURE as exc:  # raised in the training thread by wait()
            self._error = exc
            return
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        try:
            self.prune()
        except ANY_ERROR as exc:  # the new checkpoint is safe; old ones just stay a while
            self.prune_failures += 1
            log.warning("checkpoint %s is published, but pruning older checkpoints under %s failed (%s: %s); "
                        "they stay until a later save prunes them, or delete them by hand", dest, self.root,
                        type(exc).__name__, exc)

    def wait(self) -> None:
        """Block until the in-flight publish is done; re-raise its error."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise DataError(f"publishing a checkpoint under {self.root} failed: {error}") from error

    def prune(self) -> Retention:
        decision = retention(scan(self.root, verify=False), self.keep_last, self.keep_best, self.metric, self.mode)
        for name in decision.delete:
            fs.delete(fs.join(self.root, name))
        return decision


def publish(staging: str, dest: str) -> None:
    """Data files, then checksums, then the commit marker: a reader never sees half a checkpoint.

    A committed checkpoint already at ``dest`` is never deleted or overwritten: it is kept and this one is
    dropped with a warning (an elastic job that redoes steps after losing a host saves the same step again).
    Training holds no lease on checkpoint.dir yet (only the ETL takes one, on etl.output): a second job writing
    the same folder is not refused, and each keeps the other's checkpoints of a step both saved. Of an earlier,
    interrupted publish of the same step, only the files a checkpoint holds are replaced."""
    if fs.exists(fs.join(dest, COMMIT)):
        log.warning("%s is already committed (saved before by this job or by another writer); it is kept as it "
                    "is and this save of the same step is dropped", dest)
        return
    for name in (*DATA_FILES, CHECKSUMS):
        fs.delete(fs.join(dest, name))  # a missing file is fine
    fs.makedirs(dest)
    for name in (*DATA_FILES, CHECKSUMS):
        src = os.path.join(staging, name)
        if fs.is_local(dest) and os.stat(src).st_dev == os.stat(fs.local_path(dest)).st_dev:
            os.replace(src, os.path.join(fs.local_path(dest), name))
        else:
            fs.copy_from_local(src, fs.join(dest, name))
    fs.write_bytes_atomic(fs.join(dest, COMMIT), b"")


def describe(infos: list[CheckpointInfo], metric: str) -> str:
    """The table ``hvdtrain checkpoints list/verify`` prints."""
    rows = [f"{'checkpoint':<18}{'step':>10}{'epoch':>7}{metric:>22}{'MB':>10}  status"]
    for i in infos:
        value = f"{i.metrics[metric]:.4f}" if metric in i.metrics else "-"
        rows.append(f"{i.name:<18}{i.step:>10}{i.epoch:>7}{value:>22}{i.bytes / 1e6:>10.2f}  {i.status}"
                    + (f" ({i.detail})" if i.detail else ""))
    return "\n".join(rows)


def to_json(infos: list[CheckpointInfo]) -> str:
    return json.dumps([asdict(i) for i in infos], indent=2)
