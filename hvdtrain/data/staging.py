"""Where the reader finds each shard: local shards in place, remote ones staged to local disk ahead
of use, with bounded disk.

tf.data cannot read ``hdfs://`` with TF 2.21 (tensorflow-io does not load), so
remote shards are copied to a local folder by a background thread that stays
``ahead`` shards in front of the reader's requests (:class:`ShardStager`). The
reader releases a shard when it has read its last record (the input pipeline
appends a release step to each file's records), and the staged copy is deleted
then. Local disk holds at most the shards tf.data has open or queued plus ``ahead``.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

from hvdtrain.core.errors import ANY_FAILURE, DataError
from hvdtrain.data.manifest import Manifest
from hvdtrain.hadoop import fs

log = logging.getLogger(__name__)
STAGE_AHEAD = 3  # remote shards staged in front of the reader


def check_local_shards(manifest: Manifest, split: str, shards: Sequence[int]) -> None:
    """Fail before reading when a local shard is missing or has another size than the manifest says, naming it
    (a stat each; remote shards are checked against their checksum while they are staged)."""
    entries = manifest.split(split).shards
    for index in shards:
        uri = manifest.shard_uri(entries[index])
        if not fs.is_local(uri):
            continue
        path = fs.local_path(uri)
        if not os.path.exists(path):
            raise DataError(f"shard {entries[index].path} of split {split!r} is missing at {uri}; "
                            "the dataset is incomplete: rerun the ETL")
        size = os.path.getsize(path)
        if entries[index].bytes and size != entries[index].bytes:
            raise DataError(f"shard {entries[index].path} of split {split!r} at {uri} has {size} bytes but the "
                            f"manifest says {entries[index].bytes}: the file is truncated or was replaced; rerun "
                            "the ETL")


@dataclass
class FileSource:
    """Local file paths in reading order, and what to call when a file has been read."""

    paths: Callable[[], Iterator[str]]
    release: Optional[Callable[[str], None]] = None  # set when files are staged copies


def file_paths(manifest: Manifest, split: str, order: Callable[[], Iterator[int]], stage_dir: Optional[str],
               force_staging: bool = False, ahead: int = STAGE_AHEAD,
               copy: Optional[Callable[[str, str], Any]] = None) -> FileSource:
    """Where the reader finds each shard, in reading order.

    Local shards are read in place. Remote ones (or all, with ``force_staging``,
    which benchmarks use to measure the remote path on local data) go through a
    :class:`ShardStager` that copies ``ahead`` shards in front
    of the reader, checking each against the manifest's size and SHA-256 as it
    streams; each staged copy is deleted when its last record is read.
    """
    entries = manifest.split(split).shards
    uris = [manifest.shard_uri(e) for e in entries]
    if copy is None:
        expected = {uri: e for uri, e in zip(uris, entries)}

        def copy(uri: str, local: str) -> int:
            e = expected[uri]
            return fs.copy_to_local(uri, local, sha256=e.sha256 or None, size=e.bytes or None)

    if not force_staging and all(fs.is_local(u) for u in uris):
        return FileSource(lambda: (fs.local_path(uris[j]) for j in order()))
    if stage_dir is None:
        raise DataError(f"split {split!r} has remote shards ({uris[0]}); pass a local stage_dir to stage them in")
    live: list[ShardStager] = []

    def staged() -> Iterator[str]:
        folder = tempfile.mkdtemp(prefix=f"{split}-", dir=stage_dir)
        items = ((uris[j], os.path.basename(entries[j].path)) for j in order())
        stager = ShardStager(items, folder, ahead=ahead, copy=copy)
        live.append(stager)
        try:
            yield from stager
        finally:
            stager.close()
            live.remove(stager)
            shutil.rmtree(folder, ignore_errors=True)

    def release(path: str) -> None:
        for stager in list(live):
            stager.release(path)

    return FileSource(staged, release)


class ShardStager:
    """Copies (uri, name) items into ``stage_dir`` in order, ``ahead`` items in front of the reader."""

    def __init__(self, items: Iterable[tuple[str, str]], stage_dir: str, ahead: int = 3,
                 copy: Callable[[str, str], object] = fs.copy_to_local):
        if ahead < 1:
            raise ValueError(f"ahead must be >= 1 (got {ahead})")
        self._items = iter(items)
        self._dir = stage_dir
        self._ahead, self._copy = ahead, copy
        self._staged: dict[int, str] = {}
        self._next_read = 0
        self._exhausted_at: Optional[int] = None
        self._error: Optional[BaseException] = None
        self._closed = False
        self._cond = threading.Condition()
        self.wait_seconds = 0.0
        os.makedirs(stage_dir, exist_ok=True)
        self._thread = threading.Thread(target=self._fill, name="hvdtrain-stager", daemon=True)
        self._thread.start()

    def _fill(self) -> None:
        seq = 0
        for uri, name in self._items:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or seq < self._next_read + self._ahead)
                if self._closed:
                    return
            local = os.path.join(self._dir, f"{seq:08d}-{name}")
            try:
                self._copy(uri, local)
            except ANY_FAILURE as exc:  # handed to the reader
                with self._cond:
                    self._error = DataError(f"could not stage shard {uri} to {local}: {exc}")
                    self._cond.notify_all()
                return
            with self._cond:
                if self._closed:
                    _unlink(local)
                    return
                self._staged[seq] = local
                self._cond.notify_all()
            seq += 1
        with self._cond:
            self._exhausted_at = seq
            self._cond.notify_all()

    def get(self, seq: int) -> Optional[str]:
        """The local path of item ``seq`` (waiting for it); None past the end."""
        start = time.perf_counter()
        with self._cond:
            self._next_read = max(self._next_read, seq + 1)
            self._cond.notify_all()
            self._cond.wait_for(lambda: seq in self._staged or self._error is not None
                                or (self._exhausted_at is not None and seq >= self._exhausted_at))
            self.wait_seconds += time.perf_counter() - start
            if seq in self._staged:
                return self._staged[seq]
            if self._error is not None:
                raise self._error
            return None

    def release(self, path: str) -> None:
        """The reader is done with a staged file: delete it."""
        with self._cond:
            for seq, staged in list(self._staged.items()):
                if staged == path:
                    del self._staged[seq]
        _unlink(path)

    def __iter__(self) -> Iterator[str]:
        seq = 0
        while (path := self.get(seq)) is not None:
            yield path
            seq += 1

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            leftovers = list(self._staged.values())
            self._staged.clear()
        for path in leftovers:
            _unlink(path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
