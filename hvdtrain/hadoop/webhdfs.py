"""``webhdfs://`` for pyarrow.fs, through the ``hdfs`` package's WebHDFS client.

For hosts without libhdfs/Java (an edge node, a laptop on the VPN): the
NameNode's HTTP API is enough. Kerberos clusters need ``hdfs[kerberos]``;
set ``HVDTRAIN_WEBHDFS_KERBEROS=1``.
"""
from __future__ import annotations

import contextlib
import functools
import io
import os
import posixpath
from typing import Optional

import pyarrow as pa
import pyarrow.fs as pafs

from hvdtrain.core import secrets

_ERRORS = {"FileNotFoundException": FileNotFoundError, "AccessControlException": PermissionError}


@contextlib.contextmanager
def _remote_errors(path: str):
    """NameNode RemoteExceptions as the built-in errors pyarrow and hvdtrain.hadoop.fs classify (never retried)."""
    from hdfs.util import HdfsError

    try:
        yield
    except HdfsError as exc:
        kind = _ERRORS.get(getattr(exc, "exception", None) or "")
        if kind is None:
            raise
        raise kind(f"{path}: {secrets.redact_text(str(exc))}") from exc


def _builtin_errors(method):
    """A handler method whose first argument is a path (or a FileSelector), under :func:`_remote_errors`."""
    @functools.wraps(method)
    def call(self, path, *args, **kwargs):
        with _remote_errors(getattr(path, "base_dir", path)):
            return method(self, path, *args, **kwargs)
    return call


class WebHdfsHandler(pafs.FileSystemHandler):
    """A pyarrow ``FileSystemHandler`` backed by ``hdfs.Client``."""

    def __init__(self, url: str, user: Optional[str] = None, token: Optional[str] = None, umask: int = 0o027):
        import hdfs

        if token is not None:  # a Kerberos cluster: a delegation token (hvdtrain.hadoop.hadoop_tokens)
            self.client = hdfs.TokenClient(url, token)
        elif os.environ.get("HVDTRAIN_WEBHDFS_KERBEROS") == "1":
            from hdfs.ext.kerberos import KerberosClient

            self.client = KerberosClient(url)
        else:
            self.client = hdfs.InsecureClient(url, user=user)
        self.url, self.user, self.umask = url, user, umask
        self._home: Optional[str] = None
        # WebHDFS creates with 644/755 unless told: every file and folder is created with these instead.
        self.file_mode, self.dir_mode = f"{0o666 & ~umask:03o}", f"{0o777 & ~umask:03o}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WebHdfsHandler) and (self.url, self.user, self.umask) == (
            other.url, other.user, other.umask)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def get_type_name(self) -> str:
        return "webhdfs"

    def normalize_path(self, path: str) -> str:
        return path

    def _info(self, path: str) -> pafs.FileInfo:
        from hdfs.util import HdfsError

        try:  # strict: the package's non-strict mode reads any refusal (an invalid token, 403) as "not found"
            status = self.client.status(path)
        except HdfsError as exc:
            if getattr(exc, "exception", None) in ("FileNotFoundException", "ParentNotDirectoryException"):
                return pafs.FileInfo(path, pafs.FileType.NotFound)
            raise
        mtime = status.get("modificationTime", 0) / 1000  # ms since the epoch
        if status["type"] == "DIRECTORY":
            return pafs.FileInfo(path, pafs.FileType.Directory, mtime=mtime)
        return pafs.FileInfo(path, pafs.FileType.File, size=status["length"], mtime=mtime)

    def home(self) -> str:
        """The user's home folder, as the NameNode names it (GETHOMEDIRECTORY)."""
        if self._home is None:
            with _remote_errors("/"):
                self._home = str(self.client._get_home_directory("/").json()["Path"])
        return self._home

    @_builtin_errors
    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return [self._info(p) for p in paths]

    @_builtin_errors
    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        out = []
        for root, dirs, files in self.client.walk(selector.base_dir, depth=0 if selector.recursive else 1):
            for d in dirs:
                out.append(pafs.FileInfo(posixpath.join(root, d), pafs.FileType.Directory))
            for f in files:
                out.append(self._info(posixpath.join(root, f)))
            if not selector.recursive:
                break
        return out

    @_builtin_errors
    def create_dir(self, path: str, recursive: bool) -> None:
        self.client.makedirs(path, permission=self.dir_mode)

    @_builtin_errors
    def delete_dir(self, path: str) -> None:
        self.client.delete(path, recursive=True)

    @_builtin_errors
    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        for name in self.client.list(path):
            self.client.delete(posixpath.join(path, name), recursive=True)

    def delete_root_dir_contents(self) -> None:
        raise pa.ArrowNotImplementedError("refusing to delete the root of a WebHDFS filesystem")

    @_builtin_errors
    def delete_file(self, path: str) -> None:
        self.client.delete(path)

    @_builtin_errors
    def move(self, src: str, dest: str) -> None:
        self.client.rename(src, dest)

    @_builtin_errors
    def replace(self, src: str, dest: str) -> None:
        """Rename a file over an existing one atomically: WebHDFS RENAME with ``renameoptions=OVERWRITE`` runs the
        NameNode's rename2 (what ``FileContext.rename(..., OVERWRITE)`` does). The ``hdfs`` package's ``rename``
        has no such option, so its request method is called with the extra parameter."""
        self.client._rename(src, destination=self.client.resolve(dest), renameoptions="OVERWRITE")

    @_builtin_errors
    def create_exclusive(self, path: str, data: bytes) -> bool:
        """Create ``path`` holding ``data`` unless it exists: WebHDFS CREATE with ``overwrite=false``, which the
        NameNode refuses (FileAlreadyExistsException) when the file is there. False then; not part of pyarrow's API."""
        from hdfs.util import HdfsError

        try:
            self.client.write(path, data, overwrite=False, permission=self.file_mode)
        except HdfsError as exc:
            if getattr(exc, "exception", None) == "FileAlreadyExistsException":
                return False
            raise
        return True

    @_builtin_errors
    def copy_file(self, src: str, dest: str) -> None:
        with self.client.read(src) as reader:
            self.client.write(dest, reader, overwrite=True, permission=self.file_mode)

    @_builtin_errors
    def set_permission(self, path: str, mode: int) -> None:
        """WebHDFS SETPERMISSION; not part of pyarrow's API."""
        self.client.set_permission(path, f"{mode:03o}")

    @_builtin_errors
    def permission(self, path: str) -> int:
        """A file's or folder's permission bits (GETFILESTATUS); not part of pyarrow's API."""
        return int(self.client.status(path)["permission"], 8)

    @_builtin_errors
    def checksum(self, path: str) -> str:
        """HDFS's checksum of a file (``GETFILECHECKSUM``), as ``algorithm:hex``; not part of pyarrow's API."""
        doc = self.client.checksum(path)
        return f"{doc['algorithm']}:{doc['bytes']}"

    @_builtin_errors
    def open_input_stream(self, path: str) -> pa.PythonFile:
        """Streams the file (DataNode response read as it comes): staging a shard holds one chunk in memory."""
        return pa.PythonFile(_Download(self.client, path), mode="r")

    @_builtin_errors
    def open_input_file(self, path: str) -> pa.PythonFile:
        """Random access needs the whole file: it is read into memory."""
        with _Download(self.client, path) as reader:
            return pa.PythonFile(io.BytesIO(reader.read()), mode="r")

    @_builtin_errors
    def open_output_stream(self, path: str, metadata: Optional[dict] = None) -> pa.PythonFile:
        return pa.PythonFile(_Upload(self.client, path, self.file_mode), mode="w")

    def open_append_stream(self, path: str, metadata: Optional[dict] = None) -> pa.PythonFile:
        raise pa.ArrowNotImplementedError("append is not supported over WebHDFS")


class _Download(io.RawIOBase):
    """A readable stream over ``client.read``'s response; closing it closes the connection.

    A missing file fails at open (the handler turns it into FileNotFoundError naming the path).
    """

    def __init__(self, client, path: str):
        self._context = client.read(path)
        self._raw = self._context.__enter__()  # a missing or denied file fails here, at open

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self._raw.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._context.__exit__(None, None, None)
        super().close()


class _Upload(io.RawIOBase):
    """Buffers to a local spool file and uploads on close (WebHDFS CREATE is one request)."""

    def __init__(self, client, path: str, permission: str):
        import tempfile

        self._client, self._path, self._permission = client, path, permission
        self._spool = tempfile.TemporaryFile()

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        return self._spool.write(data)

    def close(self) -> None:
        if not self.closed:
            try:
                self._spool.seek(0)
                with _remote_errors(self._path):
                    self._client.write(self._path, self._spool, overwrite=True, permission=self._permission)
            finally:
                self._spool.close()
                super().close()
