"""Secrets are data with a lifetime: one redaction for everything hvdtrain prints, logs or tracks.

A secret is a value under a key that names one (``MLFLOW_TRACKING_TOKEN``,
``spark.ssl.keyStorePassword``, ``fs.azure.account.key.*``: the rule is in
:mod:`hvdtrain.core.redaction`), or a secret part of a URL (``mysql://user:PASSWORD@host``,
``?password=``, ``;password=``, ``&token=``). :func:`redact` hides both in config
values, :func:`redact_text` in free text, :func:`scrub` in error messages, and
:class:`RedactingFilter` in every log record; :func:`spark_redaction_conf` has
Spark hide them in its UI, event logs and plan strings. Secrets reach child processes by environment (see
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
import shutil
import tempfile
from typing import Any, Mapping, MutableMapping, Optional

from hvdtrain.core.errors import EnvironmentProblem

# What is a secret is decided in hvdtrain.core.redaction (the bottom layer, so that hvdtrain.core.errors masks too); these
# names are this module's as well, for its callers.
from hvdtrain.core.redaction import MASK as MASK
from hvdtrain.core.redaction import has_secret as has_secret
from hvdtrain.core.redaction import is_secret_key as is_secret_key
from hvdtrain.core.redaction import redact as redact
from hvdtrain.core.redaction import redact_text as redact_text
from hvdtrain.core.redaction import redact_url as redact_url
from hvdtrain.core.redaction import text_secrets

PRIVATE_UMASK = 0o077  # files 0600, folders 0700


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

    def clean(self, text: str) -> str:
        """``text`` with URL secrets and the registered values masked."""
        text = redact_text(text)
        for v in self.values:
            text = text.replace(v, MASK)
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = self.clean(message)
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


def scrub(text: str) -> str:
    """An error message with URL secrets, and every secret value this process was given, masked."""
    return _FILTER.clean(text)


def secret_values(flat: Mapping[str, Any]) -> list[str]:
    """The secret strings in a flat config (values under secret keys, URL secrets), for log masking."""
    out = []
    for key, value in flat.items():
        if isinstance(value, Mapping):
            out += secret_values({f"{key}.{k}": v for k, v in value.items()})
        elif isinstance(value, str):
            if is_secret_key(key):
                out.append(value)
            out += text_secrets(value)
    return out


# Spark's own redaction (its UI, event logs, the history server; SQL plans and their strings). Spark hides a
# setting's value when this matches its key or its value: Spark's default (secret|password|token|access[.]?key),
# the names hvdtrain.core.redaction knows beyond it, and values holding a URL password or a secret URL parameter.
SPARK_REDACTION_REGEX = ("(?i)secret|password|passwd|token|access[._-]?key|account[._-]key|credential|_pwd$"
                         "|(?:private|encryption|storage|api)[._-]?key$"
                         r"|://[^/@\s:]*:[^/@\s]+@|[?&;](?:pwd|key|sig|signature)=")
# In SQL and plan strings (a table's LOCATION, a JDBC URL), the secret itself: a URL's user:password and secret
# parameters (Spark replaces each match).
SPARK_SQL_REDACTION_REGEX = (r"(?i)(?<=://)[^/@\s:'\"]*:[^/@\s'\"]+(?=@)"
                             r"|(?<=[?&;])(?:password|passwd|pwd|token|secret|key|signature|sig)=[^&;#\s'\"]+")


def spark_redaction_conf(user: Mapping[str, str]) -> dict[str, str]:
    """The redaction settings hvdtrain gives every Spark application, but those the user set (pure)."""
    conf = {"spark.redaction.regex": SPARK_REDACTION_REGEX,
            "spark.sql.redaction.string.regex": SPARK_SQL_REDACTION_REGEX}
    return {k: v for k, v in conf.items() if k not in user}


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
# so the secrets stay in this file and each rank reads them back (hvdtrain.runtime.rank_env) before the program starts.
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
        raise EnvironmentProblem(f"{SEALED_ENV}={path}: cannot read the secret environment this process was started "
                                 f"with ({exc}); the launching hvdtrain process writes it (on this host for "
                                 "horovodrun, shipped with --files into a cluster job's containers): launch the job "
                                 "with hvdtrain, not by hand") from None
    for key, value in sealed.items():
        environ.setdefault(key, value)
