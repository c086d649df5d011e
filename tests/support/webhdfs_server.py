"""A WebHDFS REST endpoint over a local folder: the cluster's side of ``webhdfs://`` for tests.

It speaks the protocol of the NameNode's HTTP API as the ``hdfs`` package
uses it (https://hadoop.apache.org/docs/stable/hadoop-project-dist/hadoop-hdfs/WebHDFS.html):
JSON FileStatus documents, ``RemoteException`` errors, and OPEN/CREATE
answered with a 307 redirect to a "DataNode" URL that moves the bytes, with
HDFS's rename rules (no replacing an existing file, into an existing folder).
It stands in for the cluster only: hvdtrain's handler, the ``hdfs`` client
and every request are real. ``fail_next(n)`` answers the next ``n`` requests
with HTTP 503 ``RetriableException``, as a NameNode in safe mode does;
``lose_response(op)`` carries out the next ``op`` request and then drops the
connection without answering (the client sees a reset, the change happened);
``standby = True`` answers as the standby NameNode of an HA pair (403 StandbyException).
RENAME with ``renameoptions=OVERWRITE`` is the NameNode's rename2: it replaces
an existing file atomically and answers with an empty body.
"""
from __future__ import annotations

import json
import os
import shutil
import ssl
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional

PREFIX = "/webhdfs/v1"
DATANODE = "/datanode"


class WebHdfsServer:
    def __init__(self, root: str, tls: Optional[tuple[str, str]] = None):
        """``tls``: (certificate, key) PEM files: serve HTTPS, as ``swebhdfs://`` expects."""
        self.root = root
        self.scheme = "https" if tls else "http"
        self.requests: list[tuple[str, str, str]] = []  # (method, op, path)
        self._failures = 0
        self.denied: list[str] = []  # path prefixes answered with AccessControlException (see deny())
        self.lost: dict[str, int] = {}  # op -> how many more of its answers to drop (see lose_response())
        self.standby = False  # answer every NameNode request as the standby NameNode of an HA pair does
        self._lock = threading.Lock()
        server = self

        class Handler(_Handler):
            owner = server

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def netloc(self) -> str:
        return f"127.0.0.1:{self._httpd.server_address[1]}"

    def uri(self, path: str) -> str:
        return f"{'swebhdfs' if self.scheme == 'https' else 'webhdfs'}://{self.netloc}/{path.lstrip('/')}"

    def fail_next(self, n: int) -> None:
        with self._lock:
            self._failures = n

    def deny(self, prefix: str) -> None:
        """Answer every request under ``prefix`` as HDFS does when permissions forbid it."""
        self.denied.append(prefix)

    def lose_response(self, op: str, n: int = 1) -> None:
        """Carry out the next ``n`` ``op`` requests but close the connection instead of answering them."""
        with self._lock:
            self.lost[op.upper()] = n

    def take_lost(self, op: str) -> bool:
        with self._lock:
            if self.lost.get(op, 0) > 0:
                self.lost[op] -= 1
                return True
            return False

    def take_failure(self) -> bool:
        with self._lock:
            if self._failures > 0:
                self._failures -= 1
                return True
            return False

    def ops(self) -> list[str]:
        return [op for _, op, _ in self.requests]

    def __enter__(self) -> "WebHdfsServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    owner: WebHdfsServer
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args) -> None:  # quiet
        pass

    # -- helpers -------------------------------------------------------------

    def _target(self) -> tuple[str, str, dict[str, str]]:
        url = urllib.parse.urlsplit(self.path)
        params = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
        path = urllib.parse.unquote(url.path)
        datanode = path.startswith(DATANODE + PREFIX)
        hdfs_path = path[len(DATANODE + PREFIX) if datanode else len(PREFIX):] or "/"
        return ("dn:" if datanode else "") + params.get("op", "").upper(), hdfs_path, params

    def _local(self, hdfs_path: str) -> str:
        return os.path.join(self.owner.root, hdfs_path.lstrip("/"))

    def _send(self, code: int, body: bytes = b"", ctype: str = "application/json",
              headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, obj, code: int = 200) -> None:
        self._send(code, json.dumps(obj).encode())

    def _error(self, code: int, exception: str, message: str) -> None:
        package, _, name = exception.rpartition(".")
        self._json({"RemoteException": {"exception": name, "javaClassName": f"org.apache.hadoop.{exception}",
                                        "message": message}}, code)

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _status(self, local: str, suffix: str = "") -> dict:
        is_dir = os.path.isdir(local)
        return {"pathSuffix": suffix, "type": "DIRECTORY" if is_dir else "FILE",
                "length": 0 if is_dir else os.path.getsize(local), "owner": "hdfs", "group": "supergroup",
                "permission": "755", "replication": 0 if is_dir else 3, "blockSize": 0 if is_dir else 134217728,
                "modificationTime": int(os.path.getmtime(local) * 1000), "accessTime": 0}

    def _redirect(self) -> None:
        location = f"{self.owner.scheme}://{self.owner.netloc}{DATANODE}{self.path}"
        self._send(307, headers={"Location": location})

    # -- verbs ---------------------------------------------------------------

    def _handle(self, method: str) -> None:
        op, path, params = self._target()
        self.owner.requests.append((method, op, path))
        body = self._body() if method in ("PUT", "POST") else b""
        if self.owner.take_failure():
            return self._error(503, "ipc.RetriableException", "Name node is in safe mode.")
        if self.owner.standby and not op.startswith("dn:"):
            return self._error(403, "ipc.StandbyException", "Operation category READ is not supported in state "
                                                            "standby. Visit https://s.apache.org/sbnn-error")
        if any(path.startswith(p) for p in self.owner.denied):
            return self._error(403, "security.AccessControlException",
                               f"Permission denied: user=dr.who, access={'READ' if method == 'GET' else 'WRITE'}, "
                               f"inode=\"{path}\":hdfs:supergroup:drwx------")
        local = self._local(path)
        handler = getattr(self, f"op_{op.replace(':', '_').lower()}", None)
        if handler is None:
            return self._error(400, "IllegalArgumentException", f"unsupported operation {method} {op}")
        if self.owner.take_lost(op):
            self._drop_answer()
        handler(path, local, params, body)

    def _drop_answer(self) -> None:
        """Let the operation run, then close the connection instead of sending its answer."""
        def discard(*args, **kwargs) -> None:
            pass

        self.send_response = self.send_header = self.end_headers = discard  # type: ignore[method-assign]
        self.wfile.write = lambda data: len(data)  # type: ignore[method-assign]
        self.close_connection = True

    def do_GET(self) -> None:
        self._handle("GET")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def _missing(self, path: str) -> None:
        self._error(404, "FileNotFoundException", f"File does not exist: {path}")

    def op_getfilestatus(self, path, local, params, body) -> None:
        if not os.path.exists(local):
            return self._missing(path)
        self._json({"FileStatus": self._status(local)})

    def op_liststatus(self, path, local, params, body) -> None:
        if not os.path.exists(local):
            return self._missing(path)
        if os.path.isfile(local):
            return self._json({"FileStatuses": {"FileStatus": [self._status(local)]}})
        entries = [self._status(os.path.join(local, n), n) for n in sorted(os.listdir(local))]
        self._json({"FileStatuses": {"FileStatus": entries}})

    def op_mkdirs(self, path, local, params, body) -> None:
        if os.path.isfile(local):
            return self._error(403, "fs.FileAlreadyExistsException", f"Path is not a directory: {path}")
        os.makedirs(local, exist_ok=True)
        self._json({"boolean": True})

    def op_delete(self, path, local, params, body) -> None:
        if not os.path.exists(local):
            return self._json({"boolean": False})
        if os.path.isdir(local):
            if os.listdir(local) and params.get("recursive", "").lower() != "true":
                return self._error(403, "fs.PathIsNotEmptyDirectoryException", f"{path} is non empty")
            shutil.rmtree(local)
        else:
            os.remove(local)
        self._json({"boolean": True})

    def op_rename(self, path, local, params, body) -> None:
        if params.get("renameoptions", "").upper() == "OVERWRITE":
            return self._rename_over(path, local, params.get("destination", ""))
        dest = self._local(params.get("destination", ""))
        if os.path.isdir(dest):
            dest = os.path.join(dest, os.path.basename(local))
        if not os.path.exists(local) or os.path.exists(dest) or not os.path.isdir(os.path.dirname(dest)):
            return self._json({"boolean": False})
        os.rename(local, dest)
        self._json({"boolean": True})

    def _rename_over(self, path: str, local: str, destination: str) -> None:
        """rename2(src, dst, OVERWRITE): dst, if there, must not be a non-empty folder; its parent must exist."""
        dest = self._local(destination)
        if not os.path.exists(local):
            return self._missing(path)
        if not os.path.isdir(os.path.dirname(dest)):
            return self._error(404, "FileNotFoundException", f"rename destination parent {destination} not found")
        if os.path.isdir(dest) and os.listdir(dest):
            return self._error(403, "fs.FileAlreadyExistsException", f"rename destination {destination} is a "
                                                                       "non-empty directory")
        os.replace(local, dest)
        self._send(200, ctype="application/octet-stream")

    def op_open(self, path, local, params, body) -> None:
        if not os.path.isfile(local):
            return self._missing(path)
        self._redirect()

    def op_create(self, path, local, params, body) -> None:
        if os.path.exists(local) and params.get("overwrite", "").lower() != "true":
            return self._error(403, "fs.FileAlreadyExistsException", f"{path} already exists")
        self._redirect()

    def op_dn_open(self, path, local, params, body) -> None:
        with open(local, "rb") as fh:
            fh.seek(int(params.get("offset", 0)))
            length = params.get("length")
            data = fh.read(int(length) if length not in (None, "None") else -1)
        self._send(200, data, "application/octet-stream")

    def op_dn_create(self, path, local, params, body) -> None:
        os.makedirs(os.path.dirname(local), exist_ok=True)
        with open(local, "wb") as fh:
            fh.write(body)
        self._send(201, headers={"Location": f"hdfs://{self.owner.netloc}{path}"})
