"""Secrets are data with a lifetime: one redaction for everything hvdtrain prints, logs or tracks.

A secret is a value under a key that names one (``token``, ``secret``,
``password``, ``passwd``, ``credential``, ``api_key``), or the password in a
URL (``mysql://user:PASSWORD@host/db``). :func:`redact` hides both in config
values, :func:`redact_text` in free text, and :class:`RedactingFilter` in every
log record. Secrets reach child processes by environment (see
:mod:`hvdtrain.tune`) or a 0600 file (``spark-submit --properties-file``,
:mod:`yarn.submit`), never by argv; ranks that horovodrun starts get the
environment's secrets through a sealed 0600 file (:func:`seal_env`), because
horovodrun writes each rank's environment into its command line. :func:`private_files` makes what hvdtrain
writes (checkpoints, the MLflow SQLite store, logs, env archives) unreadable
to other users.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import re
import shutil
import tempfile
from typing import Any, Mapping, MutableMapping, Optional

from hvdtrain.errors import EnvironmentProblem

MASK = "***"
SECRET_KEY = re.compile(r"(?:^|[._-])(?:token|secret|password|passwd|credentials?|api[_-]?key)(?:$|[._-])",
                        re.IGNORECASE)
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@'\"]*:)(?P<password>[^\s@'\"/]+)(?=@)")
_DELEGATION = re.compile(r"(?<=[?&]delegation=)[^&\s'\"]+")
PRIVATE_UMASK = 0o077  # files 0600, folders 0700


def is_secret_key(key: str) -> bool:
    """Whether a config key, env variable or Spark setting names a secret (a word of it does)."""
    return bool(SECRET_KEY.search(str(key)))


def redact_text(text: str) -> str:
    """Free text with every URL password and WebHDFS delegation token (``delegation=`` in a query) masked."""
    return _DELEGATION.sub(MASK, _URL_PASSWORD.sub(lambda m: m.group("head") + MASK, text))


def redact_url(url: str) -> str:
    """A URL with its password masked (``None``-safe for optional settings)."""
    return redact_text(url) if isinstance(url, str) else url


def redact(value: Any, key: str = "") -> Any:
    """``value`` with secrets masked: text under secret keys, URL passwords anywhere (recursive)."""
    if key and isinstance(value, str) and value and is_secret_key(key):
        return MASK
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact(v) for v in value)
    return value


def has_secret(value: Any, key: str = "") -> bool:
    """Whether :func:`redact` would change ``value``."""
    return redact(value, key) != value


def split_secret_items(items: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(plain, secret) settings: secret when the key names one or the value holds a URL password (pure)."""
    plain: dict[str, str] = {}
    secret: dict[str, str] = {}
    for k, v in items.items():
        (secret if has_secret(v, k) else plain)[k] = v
    return plain, secret


class RedactingFilter(logging.Filter):
    """Masks secrets in a record's final message (URL passwords, and values registered with :meth:`add`)."""

    def __init__(self) -> None:
        super().__init__()
        self.values: set[str] = set()

    def add(self, *values: str) -> None:
        self.values.update(v for v in values if v and len(v) >= 4)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact_text(message)
        for v in self.values:
            clean = clean.replace(v, MASK)
        if clean != message:
            record.msg, record.args = clean, None
        return True


_FILTER = RedactingFilter()


def protect_logging(*known: str) -> RedactingFilter:
    """Install the redacting filter on every root handler (and on new ones via the root logger); ``known``
    are secret values to mask wherever they appear."""
    _FILTER.add(*known)
    root = logging.getLogger()
    for handler in root.handlers:
        if _FILTER not in handler.filters:
            handler.addFilter(_FILTER)
    return _FILTER


def secret_values(flat: Mapping[str, Any]) -> list[str]:
    """The secret strings in a flat config (values under secret keys, URL passwords), for log masking."""
    out = []
    for key, value in flat.items():
        if isinstance(value, Mapping):
            out += secret_values({f"{key}.{k}": v for k, v in value.items()})
        elif isinstance(value, str):
            if is_secret_key(key):
                out.append(value)
            out += [m.group("password") for m in _URL_PASSWORD.finditer(value)]
    return out


def private_files() -> int:
    """Files this process creates from now on are readable by its user only; returns the previous umask."""
    return os.umask(PRIVATE_UMASK)


def write_private(path: str, data: bytes) -> str:
    """Write ``data`` to a new 0600 file (for secrets handed to a child process)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(path, 0o600)
    return path


def write_properties(path: str, items: Mapping[str, str]) -> str:
    """Spark settings in a Java properties file only this user can read, for ``--properties-file``."""
    text = "".join(f"{k}={_escape_property(v)}\n" for k, v in items.items())
    return write_private(path, text.encode("utf-8"))


def _escape_property(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")


# A 0600 file holding the secret environment variables of a horovodrun launch: horovodrun's Gloo launcher writes
# each rank's whole environment into its ``/bin/sh -c env K=V ... python ...`` command line (visible to ``ps``),
# so the secrets stay in this file and each rank reads them back (hvdtrain.rank_env) before the program starts.
SEALED_ENV = "HVDTRAIN_SEALED_ENV"
_sealed_dir: Optional[str] = None


def seal_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with its secret variables (a secret name, a URL password) moved to a sealed file it names."""
    global _sealed_dir
    plain, secret = split_secret_items(dict(env))
    if not secret:
        return plain
    if _sealed_dir is None:
        _sealed_dir = tempfile.mkdtemp(prefix="hvdtrain-sealed-")  # 0700; removed when this process ends
        atexit.register(shutil.rmtree, _sealed_dir, True)
    fd, path = tempfile.mkstemp(dir=_sealed_dir, suffix=".json")
    os.close(fd)
    write_private(path, json.dumps(secret).encode("utf-8"))
    return {**plain, SEALED_ENV: path}


def unseal_env(environ: MutableMapping[str, str]) -> None:
    """Put the sealed secrets back into ``environ`` (a rank's own environment; values set there win)."""
    path = environ.pop(SEALED_ENV, None)
    if not path:
        return
    try:
        with open(path, encoding="utf-8") as fh:
            sealed = json.load(fh)
    except (OSError, ValueError) as exc:
        raise EnvironmentProblem(f"{SEALED_ENV}={path}: cannot read the secret environment this rank was started with "
                      f"({exc}); the launching hvdtrain process must run on this host") from None
    for key, value in sealed.items():
        environ.setdefault(key, value)
