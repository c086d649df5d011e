"""One filesystem layer for local paths, ``file://``, ``hdfs://`` and ``webhdfs://``.

Everything goes through ``pyarrow.fs``: local paths use ``LocalFileSystem``,
``webhdfs://`` wraps the ``hdfs`` package's WebHDFS client in a
``PyFileSystem`` handler, and ``hdfs://`` uses ``HadoopFileSystem`` over
libhdfs where this host has libhdfs (``ARROW_LIBHDFS_DIR`` or
``HADOOP_HOME/lib/native``; see ``hvdtrain env check``), else WebHDFS at the
NameNode HTTP address ``HADOOP_CONF_DIR`` names for it (libhdfs ships only in
Hadoop's binary release; :mod:`hvdtrain.hadoop.hadoop_conf`). So one ``hdfs://`` path
in a config works from Spark and from Python alike. Callers see one API, so
the local path tests exercise the same code the cluster runs.

Transient errors (connection resets, timeouts) are retried with exponential
backoff and jitter; a NameNode in safe mode is waited out (up to
``RetryPolicy.safe_mode_wait``); anything else (missing file, permission)
fails at once with the path in the message.

This module owns pyarrow's Hadoop filesystem and the ``hdfs`` package.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import posixpath
import random
import re
import subprocess
import time
import urllib.parse
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs

from hvdtrain.core import secrets
from hvdtrain.core.errors import ANY_ERROR, AccessDenied, ConfigError, DataError, EnvironmentProblem, StorageError
from hvdtrain.hadoop import hadoop_conf, hadoop_tokens
from hvdtrain.hadoop.webhdfs import WebHdfsHandler

log = logging.getLogger(__name__)
T = TypeVar("T")


# -- retries --------------------------------------------------------------

@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 5
    base_delay: float = 0.2
    max_delay: float = 10.0
    safe_mode_wait: float = 600.0  # seconds to wait for a NameNode to leave safe mode (an admin's maintenance)
    safe_mode_poll: float = 2.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Full-jitter exponential backoff for the given 1-based attempt."""
        return rng.uniform(0, min(self.max_delay, self.base_delay * 2 ** (attempt - 1)))


TRANSIENT = (ConnectionError, TimeoutError)
# Java exceptions a NameNode sends when the same call may succeed later (failover, safe mode).
REMOTE_TRANSIENT = ("RetriableException", "StandbyException", "SafeModeException")


def is_denied(exc: BaseException) -> bool:
    """The storage refused this user: a local EACCES, WebHDFS's or libhdfs's AccessControlException."""
    return isinstance(exc, PermissionError) or "AccessControlException" in str(exc)


def denied(what: str, exc: BaseException) -> AccessDenied:
    """One line for a refused path: what was tried, the storage's own words (HDFS names the user, the access and
    the path's owner, group and mode), and what to do."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    detail = next((line for line in lines if "denied" in line.lower()), lines[0] if lines else type(exc).__name__)
    detail = detail.split("AccessControlException: ", 1)[-1]
    fix = ("ask the owner of the path for access (hdfs dfs -chmod or -setfacl), or run as a user who has it "
           "(kinit as that user; HADOOP_USER_NAME where HDFS has no Kerberos)" if "user=" in detail else
           "ask the owner of the path for access (chmod, chown), or run as a user who has it")
    return AccessDenied(f"{what}: {secrets.redact_text(detail)}; {fix}")


def is_transient(exc: BaseException) -> bool:
    """Errors worth retrying: network trouble, not a missing file or a denied write."""
    if isinstance(exc, (FileNotFoundError, IsADirectoryError, NotADirectoryError)) or is_denied(exc):
        return False
    if isinstance(exc, TRANSIENT):
        return True
    if getattr(exc, "exception", None) in REMOTE_TRANSIENT:  # a WebHDFS RemoteException (hdfs.HdfsError)
        return True
    text = str(exc).lower()
    return any(s in text for s in ("connection reset", "connection refused", "connection aborted", "timed out",
                                   "temporarily", "broken pipe", "retry", "unavailable", "too many open"))


_UNTRUSTED = re.compile(r"certificate verify failed: ([^()'\"\]]+)", re.I)


def untrusted_tls(what: str, exc: BaseException) -> Optional[EnvironmentProblem]:
    """One line for a TLS server (an HTTPS_ONLY cluster's WebHDFS) whose certificate this host does not trust;
    None for any other error. Never retried: the next attempt meets the same certificate."""
    match = _UNTRUSTED.search(str(exc))
    if match is None:
        return None
    return EnvironmentProblem(f"{what}: the server's TLS certificate is not trusted here ({match.group(1).strip()}); "
                              "set REQUESTS_CA_BUNDLE to a CA bundle that holds the cluster's CA (its admin has it; "
                              "`hvdtrain cluster up --https` prints its own), then rerun")


def in_safe_mode(exc: BaseException) -> bool:
    """The NameNode refused a change because it is in safe mode (it will accept it once it leaves)."""
    return getattr(exc, "exception", None) == "SafeModeException" or "SafeModeException" in str(exc)


def with_retries(fn: Callable[[], T], what: str, policy: RetryPolicy = RetryPolicy(),
                 sleep: Callable[[float], None] = time.sleep, rng: Optional[random.Random] = None,
                 clock: Callable[[], float] = time.monotonic) -> T:
    rng = rng or random.Random()
    safe_mode_until = None
    attempt = 1
    while True:
        try:
            return fn()
        except ANY_ERROR as exc:  # classified below
            if in_safe_mode(exc):
                safe_mode_until = safe_mode_until or clock() + policy.safe_mode_wait
                if clock() < safe_mode_until:
                    log.warning("%s: the NameNode is in safe mode; waiting (up to %.0fs in all)", what,
                                policy.safe_mode_wait)
                    sleep(policy.safe_mode_poll)
                    continue
                raise StorageError(f"{what}: the NameNode stayed in safe mode for {policy.safe_mode_wait:.0f}s; "
                                   "ask its admin (hdfs dfsadmin -safemode get), then rerun") from exc
            if is_denied(exc) and not isinstance(exc, AccessDenied):
                raise denied(what, exc) from exc
            untrusted = untrusted_tls(what, exc)
            if untrusted is not None:
                raise untrusted from exc
            if not is_transient(exc) or attempt == policy.attempts:
                if is_transient(exc):
                    raise StorageError(f"{what}: failed after {attempt} attempts; last error: "
                                       f"{secrets.redact_text(str(exc))}") from exc
                raise
            delay = policy.delay(attempt, rng)
            log.warning("%s: transient error (%s), retry %d/%d in %.1fs", what, secrets.redact_text(str(exc)), attempt,
                        policy.attempts - 1, delay)
            sleep(delay)
            attempt += 1


# -- resolving URIs ---------------------------------------------------------

def is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def local_path(uri: str) -> str:
    """The absolute path of a local path or ``file://`` URI."""
    return urllib.parse.urlparse(uri).path if uri.startswith("file://") else os.path.abspath(uri)


# -- permissions ------------------------------------------------------------

UMASK_ENV = "HVDTRAIN_HDFS_UMASK"  # what hvdtrain's HDFS writes withhold; ranks, executors and drivers read it
DEFAULT_UMASK = "027"  # owner all, group read, others nothing: datasets, checkpoints and models stay in the group
PRIVATE_DIR = 0o700  # rejected raw rows: the owner only


def hdfs_umask(env: Mapping[str, str] = os.environ) -> int:
    """The umask hvdtrain creates HDFS files and folders with (``HVDTRAIN_HDFS_UMASK``, default 027), whatever
    the cluster's ``fs.permissions.umask-mode`` (022 by default: readable by every user of the cluster)."""
    raw = env.get(UMASK_ENV) or DEFAULT_UMASK
    if not (len(raw) in (3, 4) and all(c in "01234567" for c in raw)):
        raise ConfigError(UMASK_ENV, raw, "must be an octal umask such as 027 (owner all, group read, others "
                                          "nothing) or 077 (owner only)")
    return int(raw, 8)


def spark_umask_conf(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Spark settings so its own HDFS writes (Parquet, Hive tables) and its executors' use the same umask."""
    umask = f"{hdfs_umask(env):03o}"
    return {"spark.hadoop.fs.permissions.umask-mode": umask, f"spark.executorEnv.{UMASK_ENV}": umask,
            f"spark.yarn.appMasterEnv.{UMASK_ENV}": umask}


def set_permission(uri: str, mode: int) -> None:
    """Set a file's or folder's permission bits (local chmod; WebHDFS SETPERMISSION; over libhdfs, which pyarrow
    gives no chmod, ``hadoop fs -chmod``)."""
    fs, path = resolve(uri)
    if isinstance(fs, pafs.LocalFileSystem):
        os.chmod(path, mode)
        return
    handler = getattr(fs, "handler", None)
    if isinstance(handler, WebHdfsHandler):
        with_retries(lambda: handler.set_permission(path, mode), f"chmod {uri}")
        return
    proc = subprocess.run(["hadoop", "fs", "-chmod", f"{mode:o}", uri], capture_output=True, text=True)
    if proc.returncode != 0:
        raise StorageError(f"chmod {mode:o} {uri} failed: {proc.stderr.strip().splitlines()[-1:]}")


def permission(uri: str) -> int:
    """A file's or folder's permission bits."""
    fs, path = resolve(uri)
    if isinstance(fs, pafs.LocalFileSystem):
        return os.stat(path).st_mode & 0o7777
    handler = getattr(fs, "handler", None)
    if isinstance(handler, WebHdfsHandler):
        return handler.permission(path)
    raise StorageError(f"{uri}: reading permissions needs WebHDFS or a local path")


@functools.lru_cache(maxsize=16)
def _hadoop(host: str, port: int, user: Optional[str], umask: int = 0o027) -> pafs.FileSystem:
    try:
        return pafs.HadoopFileSystem(host or "default", port, user=user,
                                     extra_conf={"fs.permissions.umask-mode": f"{umask:03o}"})
    except (OSError, pa.ArrowException) as exc:
        raise EnvironmentProblem(
            f"cannot connect to HDFS at {host or 'default'}:{port} ({exc}); check HADOOP_HOME, "
            "CLASSPATH=$(hadoop classpath --glob) and a Kerberos ticket: run `hvdtrain env check`") from exc


@functools.lru_cache(maxsize=16)
def _webhdfs(url: str, user: Optional[str], token: Optional[str] = None, umask: int = 0o027) -> pafs.FileSystem:
    """WebHDFS at ``url`` (``http(s)://host:port``; NameNodes of an HA pair joined by ``;``, tried in turn past a
    standby), over verified TLS for ``https`` (CA bundle: ``REQUESTS_CA_BUNDLE``); with a delegation token on a
    Kerberos cluster; creating with ``umask``."""
    return pafs.PyFileSystem(WebHdfsHandler(url, user=user, token=token, umask=umask))


def _token(netloc: str) -> Optional[str]:
    """A delegation token for the NameNode ``netloc`` when $HADOOP_CONF_DIR says the cluster uses Kerberos."""
    props = _hadoop_props(os.environ.get("HADOOP_CONF_DIR"))
    if not hadoop_tokens.kerberos_enabled(props):
        return None
    return hadoop_tokens.webhdfs_token(f"hdfs://{netloc}" if netloc else props.get("fs.defaultFS", ""))


def libhdfs_dir(env: Mapping[str, str], is_file: Callable[[str], bool] = os.path.isfile) -> Optional[str]:
    """The folder of this host's libhdfs.so (pure, given ``is_file``), or None: then ``hdfs://`` goes over WebHDFS."""
    home = env.get("HADOOP_HOME") or env.get("HADOOP_COMMON_HOME")
    for folder in (env.get("ARROW_LIBHDFS_DIR"), home and os.path.join(home, "lib", "native")):
        if folder and is_file(os.path.join(folder, "libhdfs.so")):
            return folder
    return None


def _netloc(parsed: urllib.parse.ParseResult) -> str:
    """host[:port] of a URI without its user."""
    return f"{parsed.hostname}:{parsed.port}" if parsed.port else (parsed.hostname or "")


@functools.lru_cache(maxsize=16)
def _hadoop_props(conf_dir: Optional[str]) -> dict[str, str]:
    return hadoop_conf.load(conf_dir)


def _namenode_web(netloc: str) -> Optional[str]:
    """The WebHDFS URL(s) $HADOOP_CONF_DIR names for the NameNode ``netloc``, ``;``-joined for an HA pair (None:
    not configured)."""
    conf_dir = os.environ.get("HADOOP_CONF_DIR")
    urls = hadoop_conf.webhdfs_urls(netloc, _hadoop_props(conf_dir)) if conf_dir else []
    return ";".join(urls) or None


# Extra schemes: name -> factory(netloc) returning a pyarrow FileSystem (tests use it to inject faults).
_SCHEMES: dict[str, Callable[[str], pafs.FileSystem]] = {}


def register_scheme(scheme: str, factory: Optional[Callable[[str], pafs.FileSystem]]) -> None:
    """Serve ``scheme://netloc/path`` from ``factory(netloc)``; None unregisters it."""
    if factory is None:
        _SCHEMES.pop(scheme, None)
    else:
        _SCHEMES[scheme] = factory


def resolve(uri: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem for a URI and the path within it."""
    scheme = uri.split("://", 1)[0] if "://" in uri else ""
    if scheme in _SCHEMES:
        parsed = urllib.parse.urlparse(uri)
        return _SCHEMES[scheme](parsed.netloc), parsed.path
    if is_local(uri):
        return pafs.LocalFileSystem(), local_path(uri)
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme == "viewfs" and not libhdfs_dir(os.environ):
        return resolve(viewfs_target(uri))
    user = parsed.username or os.environ.get("HADOOP_USER_NAME")
    if parsed.scheme == "hdfs":
        web = None if libhdfs_dir(os.environ) else _namenode_web(_netloc(parsed))
        if web:
            token = _token(_netloc(parsed))
            return _webhdfs(web, None if token else user, token=token, umask=hdfs_umask()), parsed.path
        return _hadoop(parsed.hostname or "", parsed.port or 0, user, hdfs_umask()), parsed.path
    if parsed.scheme in ("webhdfs", "swebhdfs"):
        tls = parsed.scheme == "swebhdfs"
        url = f"{'https' if tls else 'http'}://{parsed.hostname}:{parsed.port or (9871 if tls else 9870)}"
        return _webhdfs(url, user, umask=hdfs_umask()), parsed.path
    raise DataError(f"unsupported filesystem in {uri!r}: use a local path, file://, hdfs://, webhdfs:// or "
                    "swebhdfs:// (WebHDFS over TLS)")


def viewfs_target(uri: str) -> str:
    """The ``hdfs://`` (or other) URI a ``viewfs://`` one names through $HADOOP_CONF_DIR's mount table, as the JVM's
    ViewFileSystem resolves it (Spark's side of the same path); one line when no link covers it."""
    parsed = urllib.parse.urlparse(uri)
    conf_dir = os.environ.get("HADOOP_CONF_DIR")
    props = _hadoop_props(conf_dir) if conf_dir else {}
    target = hadoop_conf.viewfs_target(parsed.netloc, parsed.path, props)
    if target is None or target.startswith("viewfs://"):
        table = hadoop_conf.viewfs_table(parsed.netloc, props)
        links = ", ".join(sorted(hadoop_conf.viewfs_links(table, props))) or "none"
        raise DataError(f"{uri}: no link of the ViewFs mount table {table!r} covers {parsed.path or '/'} (links: "
                        f"{links}; from HADOOP_CONF_DIR={conf_dir or 'unset'}); add fs.viewfs.mounttable.{table}."
                        "link.<path> to core-site.xml, or use the hdfs:// path")
    return target


def join(base: str, *parts: str) -> str:
    """Join path parts onto a local path or URI.

    Onto a URI, a part with a leading ``/`` stays under ``base`` (``posixpath.join`` would drop the
    scheme and authority: ``hdfs://nn/ds`` + ``/x`` must never become the local ``/x``).
    """
    if is_local(base) and not base.startswith("file://"):
        return os.path.join(base, *parts)
    return posixpath.join(base, *(p.lstrip("/") for p in parts))


# -- the Hadoop client that libhdfs loads ------------------------------------------

LIBHDFS_SCHEMES = ("hdfs://", "viewfs://")


def hdfs_client_env(env: Mapping[str, str], hadoop_classpath: Callable[[str], Optional[str]],
                    is_file: Callable[[str], bool] = os.path.isfile) -> dict[str, str]:
    """Settings libhdfs needs that ``env`` lacks (pure, given its probes).

    libhdfs starts a JVM through JNI, which does not expand the ``dir/*``
    wildcards a YARN container's CLASSPATH holds: it needs ``hadoop classpath --glob``.
    """
    updates: dict[str, str] = {}
    home = env.get("HADOOP_HOME") or env.get("HADOOP_COMMON_HOME")
    entries = env.get("CLASSPATH", "").split(os.pathsep)
    if not any("hadoop-common" in os.path.basename(e) and e.endswith(".jar") for e in entries):
        hadoop = os.path.join(home, "bin", "hadoop") if home and is_file(os.path.join(home, "bin", "hadoop")) \
            else "hadoop"
        jars = hadoop_classpath(hadoop)
        if jars:
            updates["CLASSPATH"] = os.pathsep.join(p for p in (jars, env.get("CLASSPATH")) if p)
    if not env.get("ARROW_LIBHDFS_DIR") and home and is_file(os.path.join(home, "lib", "native", "libhdfs.so")):
        updates["ARROW_LIBHDFS_DIR"] = os.path.join(home, "lib", "native")
    return updates


@functools.lru_cache(maxsize=4)
def _hadoop_classpath(hadoop: str) -> Optional[str]:
    """``hadoop classpath --glob`` (once per process: a JVM start costs seconds); None without a Hadoop client."""
    try:
        out = subprocess.run([hadoop, "classpath", "--glob"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def prepare_hdfs_client(*uris: Optional[str]) -> dict[str, str]:
    """Point libhdfs at this host's Hadoop client when any of ``uris`` is ``hdfs://`` or ``viewfs://``.

    Call it in every process that may touch HDFS, before its first access: the
    JVM libhdfs starts reads CLASSPATH once. Training ranks (yarn/executor.py)
    and the ETL's shard-writing Spark tasks (etl/writer.py) do. Idempotent and
    cheap after the first call; a no-op for local and ``webhdfs://`` paths.
    Returns the variables it set.
    """
    if not any(u and str(u).startswith(LIBHDFS_SCHEMES) for u in uris):
        return {}
    updates = hdfs_client_env(os.environ, _hadoop_classpath)
    os.environ.update(updates)
    return updates


# -- operations ---------------------------------------------------------------

def spark_path(uri: str) -> str:
    """A URI Spark's Hadoop filesystem layer understands."""
    return f"file://{resolve(uri)[1]}" if is_local(uri) else uri


def exists(uri: str) -> bool:
    fs, path = resolve(uri)
    info = with_retries(lambda: fs.get_file_info(path), f"stat {uri}")
    return info.type != pafs.FileType.NotFound


def makedirs(uri: str) -> None:
    fs, path = resolve(uri)
    with_retries(lambda: fs.create_dir(path, recursive=True), f"mkdir {uri}")


def makedirs_if_local(uri: Optional[str]) -> None:
    """Create a local folder (a folder a JVM will write to, such as Spark's event logs); a remote one or None
    is left alone (on a cluster such folders are made once by their admin)."""
    if uri and is_local(uri):
        os.makedirs(local_path(uri), exist_ok=True)


def delete(uri: str) -> None:
    """Delete a file or a directory tree; a missing path is fine."""
    fs, path = resolve(uri)
    info = with_retries(lambda: fs.get_file_info(path), f"stat {uri}")
    if info.type == pafs.FileType.Directory:
        with_retries(lambda: fs.delete_dir(path), f"delete {uri}")
    elif info.type != pafs.FileType.NotFound:
        with_retries(lambda: fs.delete_file(path), f"delete {uri}")


TRASH_INTERVAL = "fs.trash.interval"  # minutes a file moved to the HDFS trash is kept; 0: no trash


def trash_minutes(uri: str) -> int:
    """How long the HDFS trash keeps what is moved there, by the client configs of an ``hdfs://`` URI's cluster
    (``fs.trash.interval`` in $HADOOP_CONF_DIR/core-site.xml, as ``hdfs dfs -rm`` reads it); 0 for any other URI
    or when the trash is off."""
    conf_dir = os.environ.get("HADOOP_CONF_DIR")
    if not uri.startswith("hdfs://") or not conf_dir:
        return 0
    try:
        return max(0, int(float(_hadoop_props(conf_dir).get(TRASH_INTERVAL, "0") or 0)))
    except ValueError:
        return 0


def remove_published(uri: str) -> Optional[str]:
    """Remove published data the way ``hdfs dfs -rm -r`` does: on an HDFS whose trash is on (:func:`trash_minutes`),
    move ``uri`` to the user's trash (``<home>/.Trash/Current/<its path>``, a timestamp appended to the name when
    that is taken, as Hadoop does) and return where it went; elsewhere delete it and return None. pyarrow's own
    deletes, like libhdfs's, bypass the trash: an overwrite by mistake would be unrecoverable."""
    minutes = trash_minutes(uri)
    if minutes <= 0 or not exists(uri):
        delete(uri)
        return None
    fs, path = resolve(uri)
    current = posixpath.join(_home(fs), ".Trash", "Current")
    if path.rstrip("/").startswith(posixpath.dirname(current)):  # already in the trash: gone for good, as Hadoop does
        delete(uri)
        return None
    parsed = urllib.parse.urlparse(uri)
    target = posixpath.join(current, path.lstrip("/"))
    if exists(parsed._replace(path=target).geturl()):
        target += str(int(time.time() * 1000))
    dest = parsed._replace(path=target).geturl()
    makedirs(parsed._replace(path=posixpath.dirname(target)).geturl())
    move(uri, dest)
    log.info("moved %s to the HDFS trash: %s (kept %d minutes)", uri, dest, minutes)
    return dest


def _home(fs: pafs.FileSystem) -> str:
    """The user's home folder on an HDFS: the NameNode's answer over WebHDFS, else ``/user/<user>``."""
    handler = getattr(fs, "handler", None)
    if isinstance(handler, WebHdfsHandler):
        return handler.home()
    import getpass

    return f"/user/{os.environ.get('HADOOP_USER_NAME') or getpass.getuser()}"


def move(src: str, dst: str) -> None:
    """Rename ``src`` to ``dst``; a rename whose response was lost but which took effect counts as done."""
    fs, src_path = resolve(src)
    _, dst_path = resolve(dst)
    with_retries(lambda: _rename(fs, src_path, dst_path, fs.move), f"rename {src} -> {dst}")


def replace(src: str, dst: str) -> None:
    """Rename the file ``src`` over the file ``dst``, atomically where the filesystem can.

    Local files: rename(2) replaces atomically. WebHDFS: RENAME with
    ``renameoptions=OVERWRITE`` (the NameNode's rename2, atomic). libhdfs has no
    rename-over, so there ``dst`` is deleted first: a reader can find no ``dst``
    for a moment, which :func:`hvdtrain.data.manifest.read` tolerates by reading the
    complete ``src`` (``manifest.json.next``). A lost response counts as done.
    """
    fs, src_path = resolve(src)
    _, dst_path = resolve(dst)
    over = getattr(getattr(fs, "handler", None), "replace", None)  # a PyFileSystem handler that can (WebHDFS)
    if over is None:
        over = fs.move if isinstance(fs, pafs.LocalFileSystem) else functools.partial(_delete_then_move, fs)
    with_retries(lambda: _rename(fs, src_path, dst_path, over), f"rename {src} -> {dst}")


def _delete_then_move(fs: pafs.FileSystem, src: str, dst: str) -> None:
    if fs.get_file_info(dst).type == pafs.FileType.File:
        fs.delete_file(dst)
    fs.move(src, dst)


def _rename(fs: pafs.FileSystem, src: str, dst: str, rename: Callable[[str, str], None]) -> None:
    """``rename(src, dst)``; when it raises but ``src`` is gone and ``dst`` is there, the rename happened and only
    its answer was lost (a dropped connection, a retried RPC whose first try succeeded): that is success."""
    try:
        rename(src, dst)
    except Exception as exc:  # re-raised unless the rename visibly took effect
        try:
            src_info, dst_info = fs.get_file_info([src, dst])
        except ANY_ERROR:  # cannot tell: the rename's own error is the one to report
            raise exc from None
        if src_info.type != pafs.FileType.NotFound or dst_info.type == pafs.FileType.NotFound:
            raise
        log.warning("rename %s -> %s reported %s, but the file is in place: counted as done", src, dst,
                    type(exc).__name__)


def swap_dir(incoming: str, target: str, leftover: str = "delete it by hand") -> None:
    """``incoming`` takes ``target``'s place: a previous ``target`` is moved aside first, then deleted.

    ``target`` is never half-written: it is the old folder or the new one. A
    failed delete of the old one only warns (``leftover`` says what to do).
    """
    previous = f"{incoming}.previous"
    if exists(target):
        move(target, previous)
    move(incoming, target)
    discard(previous, leftover)


def discard(uri: str, leftover: str = "delete it by hand") -> None:
    """Delete ``uri`` when it is there; a failure only warns (``leftover`` says what to do about it)."""
    try:
        if exists(uri):
            delete(uri)
    except ANY_ERROR as exc:  # a leftover folder is not worth failing over
        log.warning("could not delete %s (%s); %s", uri, exc, leftover)


def listdir(uri: str) -> list[str]:
    """Names (not paths) in a directory, sorted."""
    fs, path = resolve(uri)
    infos = with_retries(lambda: fs.get_file_info(pafs.FileSelector(path)), f"list {uri}")
    return sorted(posixpath.basename(i.path) for i in infos)


def walk(uri: str, skip: Sequence[str] = ()) -> list[str]:
    """Every file under a directory, as sorted paths relative to it ("a/b.txt"); [] when it does not exist.
    Names in ``skip`` right under ``uri`` are left out, and not listed (another owner's working folder)."""
    fs, path = resolve(uri)
    info = with_retries(lambda: fs.get_file_info(path), f"stat {uri}")
    if info.type == pafs.FileType.NotFound:
        return []
    base = path.rstrip("/") + "/"
    out = []
    for top in with_retries(lambda: fs.get_file_info(pafs.FileSelector(path)), f"list {uri}"):
        name = posixpath.basename(top.path)
        if name in skip:
            continue
        if top.type != pafs.FileType.Directory:
            out.append(name)
            continue
        below = with_retries(functools.partial(fs.get_file_info, pafs.FileSelector(top.path, recursive=True)),
                             f"list {join(uri, name)}")
        out += [i.path[len(base):] if i.path.startswith(base) else f"{name}/{posixpath.basename(i.path)}"
                for i in below if i.type != pafs.FileType.Directory]
    return sorted(out)


def size(uri: str) -> int:
    fs, path = resolve(uri)
    info = with_retries(lambda: fs.get_file_info(path), f"stat {uri}")
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(uri)
    return info.size


def storage_checksum(uri: str) -> Optional[str]:
    """The storage's own checksum of a file, when it keeps one: HDFS's (over WebHDFS, ``GETFILECHECKSUM``: the
    DataNodes combine the CRCs they store beside each block, so the file's bytes are not read). None where there
    is none (a local disk, libhdfs: pyarrow exposes no checksum). It changes with the content, or with the
    block or checksum chunk size: use it as a fast "unchanged" check, with a full read behind it."""
    fs, path = resolve(uri)
    handler = getattr(fs, "handler", None)
    if not isinstance(handler, WebHdfsHandler):
        return None
    return with_retries(lambda: handler.checksum(path), f"read the checksum of {uri}")


def read_bytes(uri: str) -> bytes:
    fs, path = resolve(uri)

    def read() -> bytes:
        with fs.open_input_file(path) as fh:  # size known up front: one read, no growing buffer
            return fh.read()

    return with_retries(read, f"read {uri}")


def read_buffer(uri: str) -> pa.Buffer:
    """The whole file as one pyarrow Buffer, read once and never copied into Python bytes.

    NumPy views (``np.frombuffer``) and the checksum read it in place; it is
    what loads a large checkpoint at the disk's speed.
    """
    fs, path = resolve(uri)

    def read() -> pa.Buffer:
        with fs.open_input_file(path) as fh:
            return fh.read_buffer()

    return with_retries(read, f"read {uri}")


def readonly_buffer(data: Any) -> pa.Buffer:
    """A read-only buffer over ``data``'s memory (a memoryview, a NumPy array), without copying it.

    C extensions that insist on read-only bytes-like input (google_crc32c) take it.
    """
    return data if isinstance(data, pa.Buffer) else pa.py_buffer(data)


def open_output(uri: str):
    """A binary output stream; the caller closes it. Parent folders are created."""
    fs, path = resolve(uri)
    parent = posixpath.dirname(path)
    if parent:
        with_retries(lambda: fs.create_dir(parent, recursive=True), f"mkdir {parent}")
    return with_retries(lambda: fs.open_output_stream(path, compression=None), f"open {uri} for writing")


def open_input(uri: str):
    fs, path = resolve(uri)
    return with_retries(lambda: fs.open_input_stream(path, compression=None), f"open {uri}")


def write_bytes_atomic(uri: str, data: bytes) -> None:
    """Write under a temporary name in the same folder, then rename into place.

    Readers see the old content or the new, never a partial file.
    """
    tmp = f"{uri}.tmp-{uuid.uuid4().hex[:8]}"

    def write() -> None:
        with open_output(tmp) as fh:
            fh.write(data)

    try:
        with_retries(write, f"write {tmp}")
        replace(tmp, uri)
    except BaseException:
        try:
            delete(tmp)
        except ANY_ERROR:  # best-effort clean-up, the first error matters
            pass
        raise


def create_exclusive(uri: str, data: bytes) -> bool:
    """Create the file ``uri`` holding ``data`` only if nothing is there; False when something is (a lease taken).

    Local: the content is written under a temporary name and hard-linked into place (link(2) fails when the name
    exists), so a reader never sees it half-written. WebHDFS (and ``hdfs://`` over it): CREATE with
    ``overwrite=false``, refused by the NameNode when the file exists. libhdfs has no create-exclusive through
    pyarrow (its open always overwrites): there the check and the write are two steps, and the content is read
    back to tell which of two racing writers won (a narrow window, logged as such).
    """
    fs, path = resolve(uri)
    parent = posixpath.dirname(path)
    if isinstance(fs, pafs.LocalFileSystem):
        os.makedirs(parent, exist_ok=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        with open(tmp, "wb") as fh:
            fh.write(data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        return True
    with_retries(lambda: fs.create_dir(parent, recursive=True), f"mkdir {parent}")
    handler = getattr(fs, "handler", None)
    if isinstance(handler, WebHdfsHandler):
        return with_retries(lambda: handler.create_exclusive(path, data), f"create {uri}")
    log.warning("%s: this filesystem has no create-exclusive through pyarrow; checking, writing and reading back "
                "instead (two writers starting within the same moment may both think they won)", uri)
    if exists(uri):
        return False
    write_bytes_atomic(uri, data)
    return read_bytes(uri) == data


def _pump(src, dst, chunk: int, digest: Any = None) -> int:
    """Copy ``src`` to ``dst`` through one reused buffer (no allocation, no page faults per chunk), feeding
    ``digest`` (a hashlib object) the same bytes on the way."""
    view = memoryview(bytearray(chunk))
    n = 0
    while True:
        got = src.readinto(view)
        if not got:
            return n
        dst.write(view[:got])
        if digest is not None:
            digest.update(view[:got])
        n += got


def copy_to_local(uri: str, local: str, chunk: int = 8 << 20, sha256: Optional[str] = None,
                  size: Optional[int] = None) -> int:
    """Copy a (remote) file to a local path; returns bytes copied.

    With ``sha256`` (and ``size``) the copy is checked while it streams (no second read): a mismatch
    deletes the partial copy and raises :class:`DataError` naming the file, expected and actual values.
    """
    fs, path = resolve(uri)

    def copy() -> int:
        tmp = f"{local}.part"
        digest = hashlib.sha256() if sha256 else None
        with fs.open_input_stream(path, compression=None) as src, open(tmp, "wb") as dst:
            n = _pump(src, dst, chunk, digest)
        problem = (f"has {n} bytes, expected {size}" if size is not None and n != size else
                   f"has SHA-256 {digest.hexdigest()}, expected {sha256}" if digest and digest.hexdigest() != sha256
                   else None)
        if problem:
            os.unlink(tmp)
            raise DataError(f"{uri} {problem}: the file is truncated or corrupt; rerun the job that wrote it")
        os.replace(tmp, local)
        return n

    return with_retries(copy, f"copy {uri} -> {local}")


def copy_from_local(local: str, uri: str, chunk: int = 8 << 20) -> int:
    """Copy a local file to a (remote) path; the whole copy is retried on transient errors."""
    def copy() -> int:
        with open(local, "rb") as src, open_output(uri) as dst:
            return _pump(src, dst, chunk)

    n = with_retries(copy, f"copy {local} -> {uri}")
    if size(uri) != n:
        raise DataError(f"copy {local} -> {uri}: wrote {n} bytes but the file has {size(uri)}")
    return n
