"""A local filesystem that misbehaves on purpose, reachable as ``faulty://`` through hvdtrain.hadoop.fs.

Used only to inject faults (the thing under test is real code on a real
filesystem): the first ``fail_first`` calls raise a transient error,
``fail`` names (operation, path part) pairs that always raise it, ``truncate`` names files whose writes lose their second half, and reads of
paths containing a ``hang`` string never return.
"""
from __future__ import annotations

import io
import threading
from typing import Optional

import pyarrow as pa
import pyarrow.fs as pafs

from hvdtrain.hadoop import fs


class FaultyHandler(pafs.FileSystemHandler):
    def __init__(self, fail_first: int = 0, truncate: tuple[str, ...] = (), error: Optional[Exception] = None,
                 hang: tuple[str, ...] = (), fail: tuple[tuple[str, str], ...] = ()):
        self.local = pafs.LocalFileSystem()
        self.fail_first, self.truncate, self.hang, self.fail = fail_first, truncate, hang, fail
        self.error = error or ConnectionResetError("connection reset by peer (injected)")
        self.calls: list[tuple[str, str]] = []

    def _call(self, op: str, path: str) -> None:
        self.calls.append((op, path))
        if len(self.calls) <= self.fail_first or any(op == o and part in path for o, part in self.fail):
            raise self.error

    def __eq__(self, other): return self is other
    def __ne__(self, other): return self is not other
    def get_type_name(self): return "faulty"
    def normalize_path(self, path): return path

    def get_file_info(self, paths):
        for p in paths:
            self._call("stat", p)
        return self.local.get_file_info(paths)

    def get_file_info_selector(self, selector):
        self._call("list", selector.base_dir)
        return self.local.get_file_info(selector)

    def create_dir(self, path, recursive):
        self._call("mkdir", path)
        self.local.create_dir(path, recursive=recursive)

    def delete_dir(self, path):
        self._call("rmdir", path)
        self.local.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self.local.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):
        raise pa.ArrowNotImplementedError("no")

    def delete_file(self, path):
        self._call("rm", path)
        self.local.delete_file(path)

    def move(self, src, dest):
        self._call("move", dest)
        self.local.move(src, dest)

    def copy_file(self, src, dest):
        self.local.copy_file(src, dest)

    def open_input_stream(self, path):
        self._call("read", path)
        if any(h in path for h in self.hang):
            threading.Event().wait()  # a read that never returns (a datanode that stopped answering)
        return self.local.open_input_stream(path, compression=None)

    def open_input_file(self, path):
        self._call("read", path)
        if any(h in path for h in self.hang):
            threading.Event().wait()
        return self.local.open_input_file(path)

    def open_output_stream(self, path, metadata=None):
        self._call("write", path)
        if any(path.endswith(t) for t in self.truncate):
            return pa.PythonFile(_Truncating(self.local.open_output_stream(path, compression=None)), mode="w")
        return self.local.open_output_stream(path, compression=None)

    def open_append_stream(self, path, metadata=None):
        raise pa.ArrowNotImplementedError("no")


class _Truncating(io.RawIOBase):
    """Keeps only the first half of what is written (a write cut short)."""

    def __init__(self, inner):
        self.inner, self.buf = inner, bytearray()

    def writable(self):
        return True

    def write(self, data):
        self.buf += bytes(data)
        return len(data)

    def close(self):
        if not self.closed:
            self.inner.write(bytes(self.buf[: len(self.buf) // 2]))
            self.inner.close()
        super().close()


def install(handler: FaultyHandler) -> FaultyHandler:
    fs.register_scheme("faulty", lambda netloc: pafs.PyFileSystem(handler))
    return handler


def uninstall() -> None:
    fs.register_scheme("faulty", None)
