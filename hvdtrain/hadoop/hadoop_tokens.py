"""HDFS delegation tokens, so that Python's WebHDFS client works on a Kerberos cluster.

On a cluster with ``hadoop.security.authentication=kerberos`` WebHDFS refuses
``user.name`` and wants SPNEGO or a delegation token (``?delegation=``). Where
each hvdtrain process gets one:

- **In a YARN container** (executors, and the driver in cluster mode) the
  NodeManager wrote the application's tokens to ``HADOOP_TOKEN_FILE_LOCATION``;
  the ResourceManager renews them while the application runs. They last at
  most the cluster's ``dfs.namenode.delegation.token.max-lifetime`` (7 days by
  default): Spark's fresh tokens from ``--keytab`` reach the executors' JVMs,
  not this file.
- **In a Spark driver on this host** (client mode) the driver's JVM is logged
  in (``--principal``/``--keytab`` or the ticket cache), and gives a token.
- **In the submitting command** a JVM from pyspark's own jars logs in from the
  keytab (or the ticket cache) and gives one; no Python Kerberos library is
  needed.

:func:`read_token_file` and :func:`url_string` are pure (Hadoop's two token
file formats, and ``Token.encodeToUrlString``); :func:`webhdfs_token` finds
or fetches the token. This module owns pyspark's JVM gateway for that fetch.
"""
from __future__ import annotations

import base64
import contextlib
import functools
import io
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional

import hvdtrain
from hvdtrain.core import secrets
from hvdtrain.core.errors import ANY_ERROR, EnvironmentProblem
from hvdtrain.hadoop import envcheck

log = logging.getLogger("hvdtrain.hadoop.hadoop_tokens")

HDFS_TOKEN_KIND = "HDFS_DELEGATION_TOKEN"
# A token the driver keeps renewed (:class:`TokenRenewer`), handed to the ranks; before the container's own.
TOKEN_ENV = "HVDTRAIN_HDFS_TOKEN"
TOKEN_FS_ENV = "HVDTRAIN_HDFS_TOKEN_FS"  # the hdfs://host:port that token is for
TOKEN_FILE_ENV = "HADOOP_TOKEN_FILE_LOCATION"
MAGIC = b"HDTS"


@dataclass(frozen=True)
class Token:
    identifier: bytes
    password: bytes
    kind: str
    service: str


# -- Hadoop's encodings (pure) ---------------------------------------------------------------

def _read_vlong(buf: io.BytesIO) -> int:
    """``WritableUtils.readVLong``."""
    first = int.from_bytes(_take(buf, 1), "big", signed=True)
    if first >= -112:
        return first
    negative = first < -120
    size = (-119 - first) if negative else (-111 - first)
    value = int.from_bytes(_take(buf, size - 1), "big")
    return ~value if negative else value


def _write_vlong(value: int) -> bytes:
    """``WritableUtils.writeVLong``."""
    if -112 <= value <= 127:
        return value.to_bytes(1, "big", signed=True)
    length = -112
    if value < 0:
        value, length = ~value, -120
    size = (value.bit_length() + 7) // 8
    return (length - size).to_bytes(1, "big", signed=True) + value.to_bytes(size, "big")


def _take(buf: io.BytesIO, n: int) -> bytes:
    data = buf.read(n)
    if len(data) != n:
        raise ValueError("truncated Hadoop token file")
    return data


def _read_text(buf: io.BytesIO) -> str:
    return _take(buf, _read_vlong(buf)).decode()


def _read_varint(buf: io.BytesIO) -> int:
    shift = value = 0
    while True:
        byte = _take(buf, 1)[0]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value
        shift += 7


def _proto_fields(data: bytes) -> list[tuple[int, Any]]:
    """(field number, value) of a protobuf message: varints as int, length-delimited as bytes."""
    buf, out = io.BytesIO(data), []  # type: io.BytesIO, list[tuple[int, Any]]
    while buf.tell() < len(data):
        key = _read_varint(buf)
        number, wire = key >> 3, key & 7
        if wire == 0:
            out.append((number, _read_varint(buf)))
        elif wire == 2:
            out.append((number, _take(buf, _read_varint(buf))))
        else:
            raise ValueError(f"unexpected protobuf wire type {wire} in a Hadoop token file")
    return out


def read_token_file(data: bytes) -> list[Token]:
    """The tokens of a Hadoop credentials file (``Credentials.writeTokenStorageFile``), in either format:
    Writable (version 0) or protobuf (version 1, ``CredentialsProto``, length-delimited) (pure)."""
    if data[:4] != MAGIC or len(data) < 5:
        raise ValueError("not a Hadoop token file (no HDTS header)")
    buf, version = io.BytesIO(data[5:]), data[4]
    tokens = []
    if version == 0:
        for _ in range(_read_vlong(buf)):
            _read_text(buf)  # alias
            identifier = _take(buf, _read_vlong(buf))
            password = _take(buf, _read_vlong(buf))
            tokens.append(Token(identifier, password, _read_text(buf), _read_text(buf)))
        return tokens
    if version == 1:
        for number, entry in _proto_fields(_take(buf, _read_varint(buf))):
            if number != 1:  # 2: secret keys
                continue
            for field, token in _proto_fields(entry):
                if field == 2:
                    parts = dict(_proto_fields(token))
                    tokens.append(Token(parts.get(1, b""), parts.get(2, b""), parts.get(3, b"").decode(),
                                        parts.get(4, b"").decode()))
        return tokens
    raise ValueError(f"unknown Hadoop token file version {version}")


def url_string(token: Token) -> str:
    """``Token.encodeToUrlString``: the Writable form, URL-safe base64 without padding (pure)."""
    raw = b"".join([_write_vlong(len(token.identifier)), token.identifier, _write_vlong(len(token.password)),
                    token.password, _write_vlong(len(token.kind.encode())), token.kind.encode(),
                    _write_vlong(len(token.service.encode())), token.service.encode()])
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def hdfs_token(tokens: list[Token], namenode: str) -> Optional[Token]:
    """The HDFS delegation token for ``namenode`` (``host[:port]``) (pure): the one whose service is that address,
    else the only one on that port (services are usually ``ip:port``), else the only HDFS token; None when that
    leaves a choice between NameNodes (federation) or none."""
    hdfs = [t for t in tokens if t.kind == HDFS_TOKEN_KIND]
    host, _, port = namenode.rpartition(":") if ":" in namenode else (namenode, "", "8020")
    for candidates in ([t for t in hdfs if t.service in (namenode, f"{host}:{port}")],
                       [t for t in hdfs if t.service.rpartition(":")[2] == port], hdfs):
        if len(candidates) == 1:
            return candidates[0]
    return None


def kerberos_enabled(props: Mapping[str, str]) -> bool:
    return props.get("hadoop.security.authentication", "simple").lower() == "kerberos"


# -- finding or fetching one -------------------------------------------------------------------

_login: dict[str, str] = {}
_fetched: dict[str, tuple[str, float]] = {}  # fs URI -> (token, when to fetch a new one: time.time())
_lock = threading.Lock()


def use_keytab(principal: Optional[str], keytab: Optional[str]) -> None:
    """Fetch this process's tokens as ``principal`` from ``keytab`` (``--principal``/``--keytab``)."""
    if principal and keytab:
        _login.update(principal=principal, keytab=keytab)


def forget() -> None:
    """Drop the login and the tokens fetched with it (a test that used a keytab)."""
    with _lock:
        _login.clear()
        _fetched.clear()


def webhdfs_token(fs_uri: str, env: Mapping[str, str] = os.environ) -> str:
    """A delegation token (URL string) for the NameNode of ``fs_uri`` (``hdfs://host:port``): from the
    container's token file, else from this process's Spark driver JVM, else from a JVM logged in here."""
    namenode = _namenode(fs_uri)
    if env.get(TOKEN_ENV) and _namenode(env.get(TOKEN_FS_ENV, "")) == namenode:
        return _known(env[TOKEN_ENV])
    token_file = env.get(TOKEN_FILE_ENV)
    if token_file and os.path.isfile(token_file):
        from_file = _file_token(token_file, os.stat(token_file).st_mtime_ns, namenode)
        if from_file is not None:
            return from_file
    spark = sys.modules.get("pyspark")
    context = spark.SparkContext._active_spark_context if spark else None
    held = _held_token(context._jvm, fs_uri) if context is not None else None
    if held is not None:  # asked each time: Spark replaces the driver's tokens before they lapse
        return _known(held)
    with _lock:
        if fs_uri not in _fetched or time.time() >= _fetched[fs_uri][1]:
            fresh, expires = _fetch(fs_uri)
            _fetched[fs_uri] = _known(fresh), _renew_at(expires)
        return _fetched[fs_uri][0]


def _namenode(fs_uri: str) -> str:
    """``host:port`` of ``hdfs://host:port/path`` (pure)."""
    return fs_uri.split("://", 1)[-1].split("/", 1)[0]


@functools.lru_cache(maxsize=8)
def _file_token(token_file: str, mtime_ns: int, namenode: str) -> Optional[str]:
    """The URL string of the token for ``namenode`` in a token file (cached per file version: every fs call asks)."""
    with open(token_file, "rb") as fh:
        data = fh.read()
    try:
        token = hdfs_token(read_token_file(data), namenode)
    except (ValueError, UnicodeDecodeError) as exc:
        raise EnvironmentProblem(f"{TOKEN_FILE_ENV}={token_file} is not a Hadoop token file this can read "
                                 f"({exc}); was it written by Hadoop's Credentials?") from None
    return _known(url_string(token)) if token is not None else None


def _known(token: str) -> str:
    """``token``, masked from here on in every log line (WebHDFS URLs carry it as ``delegation=``)."""
    secrets.protect_logging(token)
    return token


def renewal_wait(remaining: float, took: float) -> float:
    """Seconds until the next renewal of a token that lapses in ``remaining`` seconds, when renewing takes ``took``
    (pure): half way there, or sooner, so that three renewals as slow as the last still fit before the lapse, but
    never before a quarter of the way."""
    return max(0.0, remaining / 4, min(remaining / 2, remaining - 3 * took))


def _renew_at(expires: float) -> float:
    """When to replace a token that lapses at ``expires``: three quarters of the way there (as Spark)."""
    now = time.time()
    return now + max(0.0, expires - now) * 0.75


def ticket_problem() -> Optional[str]:
    """None when this host has a Kerberos ticket (or cannot tell), else what to do, in one line."""
    klist = shutil.which("klist")
    if klist is not None:
        return None if envcheck.run_command([klist, "-s"], timeout=30).returncode == 0 else \
            "klist -s finds no valid ticket"
    cache = os.environ.get("KRB5CCNAME", f"FILE:/tmp/krb5cc_{os.getuid()}")
    path = cache.split(":", 1)[1] if cache.startswith("FILE:") else cache
    if cache.startswith(("FILE:", "/")) and not os.path.exists(path):
        return f"there is no Kerberos credential cache ({path})"
    return None


def no_ticket(problem: str, where: str = "$HADOOP_CONF_DIR") -> EnvironmentProblem:
    """The one line for a Kerberos cluster and no way to log in."""
    return EnvironmentProblem(f"the cluster uses Kerberos (hadoop.security.authentication=kerberos in {where}) "
                              f"and {problem}: run `kinit USER@REALM`, or pass --principal USER@REALM --keytab FILE")


@contextlib.contextmanager
def logged_in_jvm() -> Iterator[tuple[Any, Any]]:
    """(jvm, Hadoop Configuration) of a JVM started from pyspark's jars (HADOOP_CONF_DIR on its classpath),
    logged in from the keytab of :func:`use_keytab`, else from the ticket cache; stopped on the way out."""
    if not _login:
        problem = ticket_problem()
        if problem:
            raise no_ticket(problem)
    from pyspark.java_gateway import launch_gateway

    gateway = launch_gateway()
    try:
        jvm = gateway.jvm
        conf = jvm.org.apache.hadoop.conf.Configuration()
        ugi = jvm.org.apache.hadoop.security.UserGroupInformation
        ugi.setConfiguration(conf)
        if _login:
            ugi.loginUserFromKeytab(_login["principal"], _login["keytab"])
        yield jvm, conf
    finally:
        gateway.shutdown()
        proc = getattr(gateway, "proc", None)
        if proc is not None:
            proc.stdin.close()
            proc.wait(timeout=30)


def keytab_without_ticket() -> bool:
    """True when this process logs in from a keytab and has no ticket cache (Hadoop's CLIs would fail here)."""
    return bool(_login) and ticket_problem() is not None


def _fetch_here(fs_uri: str) -> tuple[str, float]:
    """A token from a JVM logged in here, and when it lapses unless renewed (``time.time()`` seconds)."""
    from py4j.protocol import Py4JJavaError

    with logged_in_jvm() as (jvm, conf):
        token = _token_from_jvm(jvm, conf, fs_uri)
        # Ours to renew (we are its renewer): renewing says when it lapses unless renewed again (the cluster's
        # dfs.namenode.delegation.token.renew-interval, a day by default); a new one is fetched before that.
        try:
            expires = token.renew(conf) / 1000
        except Py4JJavaError:  # a token this JVM was given (HADOOP_TOKEN_FILE_LOCATION), renewed by another
            expires = time.time() + 600
        return str(token.encodeToUrlString()), expires


def _renew_here(token_url: str) -> float:
    with logged_in_jvm() as (jvm, conf):
        token = jvm.org.apache.hadoop.security.token.Token()
        token.decodeFromUrlString(token_url)
        return float(token.renew(conf)) / 1000


PRINCIPAL_ENV, KEYTAB_ENV = "HVDTRAIN_TOKEN_PRINCIPAL", "HVDTRAIN_TOKEN_KEYTAB"
_ANSWER = "hvdtrain-hadoop-tokens: "


def _fetch(fs_uri: str) -> tuple[str, float]:
    """A new token for ``fs_uri`` (this user its renewer), and when it lapses unless renewed."""
    answer = _in_own_process("fetch", fs_uri)
    return answer["token"], answer["expires"]


def renew(token_url: str) -> float:
    """Renew a token this user is the renewer of (one from :func:`_fetch`); returns when it lapses unless
    renewed again (``time.time()`` seconds). It lives at most the cluster's token max-lifetime."""
    return float(_in_own_process("renew", token_url)["expires"])


def _in_own_process(action: str, arg: str) -> dict[str, Any]:
    """Run :func:`main` in a Python process of its own: pyspark's ``launch_gateway`` in a Spark driver would join
    (and its shutdown stop) the driver's own JVM (PYSPARK_GATEWAY_PORT), so the logged-in JVM is started apart.
    ``arg`` goes on stdin: a token must not be on a command line, which every local user can read."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_GATEWAY_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (hvdtrain.code_root(), env.get("PYTHONPATH")) if p)
    if _login:
        env.update({PRINCIPAL_ENV: _login["principal"], KEYTAB_ENV: _login["keytab"]})
    try:
        proc = subprocess.run([sys.executable, "-m", "hvdtrain.hadoop.hadoop_tokens", action], env=env, input=arg,
                              capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        raise EnvironmentProblem(f"getting an HDFS delegation token ({action}) took over 300 s") from None
    answers = [ln[len(_ANSWER):] for ln in proc.stdout.splitlines() if ln.startswith(_ANSWER)]
    if proc.returncode != 0 or not answers:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        why = next((ln for ln in reversed(lines) if ln.startswith("hvdtrain: error:")), lines[-1] if lines else "")
        raise EnvironmentProblem(f"could not {action} an HDFS delegation token (exit {proc.returncode}): "
                                 f"{why.removeprefix('hvdtrain: error: ')[:400]}")
    return dict(json.loads(answers[-1]))


def main(argv: list[str]) -> int:
    """``python -m hvdtrain.hadoop.hadoop_tokens fetch|renew`` with the FS URI or the token on stdin: one JSON answer
    line (see :func:`_in_own_process`); logs in from $HVDTRAIN_TOKEN_KEYTAB when set."""
    from py4j.protocol import Py4JJavaError

    use_keytab(os.environ.get(PRINCIPAL_ENV), os.environ.get(KEYTAB_ENV))
    arg = sys.stdin.read().strip()
    try:
        if argv[0] == "fetch":
            token, expires = _fetch_here(arg)
            answer: dict[str, Any] = {"token": token, "expires": expires}
        else:
            answer = {"expires": _renew_here(arg)}
    except EnvironmentProblem as exc:
        print(f"hvdtrain: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Py4JJavaError as exc:  # the NameNode's or the KDC's refusal, as Java states it
        print(f"hvdtrain: error: {str(exc.java_exception.toString()).splitlines()[0]}", file=sys.stderr)
        return 4
    print(_ANSWER + json.dumps(answer), flush=True)
    return 0


class TokenRenewer:
    """An HDFS delegation token for the ranks of a job, renewed from the keytab while the job runs.

    A YARN container's own tokens (``HADOOP_TOKEN_FILE_LOCATION``) are renewed by the ResourceManager only when
    they came with the application's submission; an executor started after Spark replaced its tokens gets ones
    nobody renews, and its Python would lose HDFS a renewal interval later. Spark's fresh tokens reach only
    the executors' JVMs. So the driver (on the submitting host, with the keytab) gets a token of its own
    (:data:`TOKEN_ENV` for the ranks) and renews it half way to each lapse, or sooner when renewing takes long (a
    renewal starts a Python and a JVM: seconds, and on a busy host tens of them; :func:`renewal_wait`), up to the
    cluster's token max-lifetime; a failed renewal is logged and retried, well before the lapse."""

    def __init__(self, fs_uri: str, retry: float = 30.0):
        self.fs_uri, self._retry = fs_uri, retry
        started = time.monotonic()
        token, self.expires = _fetch(fs_uri)
        self._took = time.monotonic() - started  # how long a call of ours takes on this host, for the next one
        self.token = _known(token)
        self.renewals = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hvdtrain-hdfs-token", daemon=True)

    def _loop(self) -> None:
        wait = renewal_wait(self.expires - time.time(), self._took)
        while not self._stop.wait(max(1.0, wait)):
            started = time.monotonic()
            try:
                expires = renew(self.token)
                self._took = time.monotonic() - started
                if expires <= self.expires:  # its max lifetime: renewing cannot extend it any more
                    log.warning("the ranks' HDFS delegation token reached its max lifetime (the cluster's "
                                "dfs.namenode.delegation.token.max-lifetime); it lapses at %s",
                                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(expires)))
                    return
                self.expires = expires
                self.renewals += 1
                wait = renewal_wait(self.expires - time.time(), self._took)
            except ANY_ERROR as exc:  # the ranks keep the token until it lapses: try again soon
                self._took = max(self._took, time.monotonic() - started)
                wait = min(self._retry, renewal_wait(self.expires - time.time(), self._took))
                log.warning("renewing the ranks' HDFS delegation token failed (%s); retrying in %.0fs", exc, wait)

    def __enter__(self) -> "TokenRenewer":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def _held_token(jvm: Any, fs_uri: str) -> Optional[str]:
    """The HDFS token for ``fs_uri`` this JVM's user holds (a Spark driver's: the ones Spark got for the
    application; a token login cannot ask for more), or None (a local or standalone Spark session holds none)."""
    current = jvm.org.apache.hadoop.security.UserGroupInformation.getCurrentUser()
    held = [t for t in current.getCredentials().getAllTokens().toArray() if str(t.getKind()) == HDFS_TOKEN_KIND]
    services = [str(t.getService()) for t in held]
    found = hdfs_token([Token(b"", b"", HDFS_TOKEN_KIND, service) for service in services], _namenode(fs_uri))
    return str(held[services.index(found.service)].encodeToUrlString()) if found else None


def _token_from_jvm(jvm: Any, conf: Any, fs_uri: str) -> Any:
    """A new Java ``Token`` for ``fs_uri``, this user its renewer."""
    current = jvm.org.apache.hadoop.security.UserGroupInformation.getCurrentUser()
    fs = jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI(fs_uri), conf)
    user = current.getShortUserName()
    token = fs.getDelegationToken(user)
    if token is None:
        raise EnvironmentProblem(f"the NameNode of {fs_uri} gave no delegation token to {user}; is the cluster "
                                 "secured (hadoop.security.authentication in $HADOOP_CONF_DIR)?")
    return token


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
