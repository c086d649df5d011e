"""What is a secret, and how it is masked (pure; no first-party imports, so :mod:`hvdtrain.core.errors` can mask too).

**Names.** A key (config key, environment variable, Spark or Hadoop setting) is split into lower-case words at
``.``, ``_``, ``-``, ``/`` and camelCase (``spark.ssl.keyStorePassword`` is spark ssl key store password). It
names a secret when:

- a word is, or ends with, ``password``, ``passwd``, ``passphrase`` or ``secret`` (``PGPASSWORD``,
  ``javax.jdo.option.ConnectionPassword``, ``fs.s3a.secret.key``), or is ``accesskey``, ``apikey`` ...;
- its **last** word is ``token``, ``credential(s)``, ``signature``, or ``pwd`` after another word
  (``MLFLOW_TRACKING_TOKEN``, ``MYSQL_PWD``). Inside a name these are settings about secrets, not secrets:
  ``unknown_token_threshold``, ``HADOOP_TOKEN_FILE_LOCATION`` (a path), ``fs.s3a.aws.credentials.provider``;
  and ``tokens``, ``tokenizer`` are other words;
- it has ``access key`` or ``account key`` anywhere (``AWS_ACCESS_KEY_ID``, as Spark's ``access[.]?key``;
  ``fs.azure.account.key.<account>...``), or ends with a qualified ``key`` (``fs.s3a.encryption.key``,
  ``fs.gs.auth.service.account.private.key``, ``AZURE_STORAGE_KEY``, ``apiKey``).

That is Spark's own ``spark.redaction.regex`` (``secret|password|token|access[.]?key``) without its substring
false positives (``max_tokens``), plus the Hadoop account keys, credentials and connection passwords.

**Values.** Anywhere in a value or free text: a URL's password (``mysql://user:PASSWORD@host``), a URL's query
or matrix parameter that names a secret (``?password=``, ``;password=``, ``&token=``, ``sig=``, ``key=``,
``X-Amz-Signature=``, WebHDFS's ``delegation=``), and a Java ``-D<secret name>=value`` option.
"""
from __future__ import annotations

import re
from typing import Any, Mapping

MASK = "***"

_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
_ENDS_SECRET = ("password", "passwd", "passphrase", "secret")  # a word ending so: PGPASSWORD, clientsecret
_COMPOUNDS = {"accesskey", "apikey", "secretkey", "privatekey", "accountkey", "sastoken", "authtoken"}
_LAST = {"token", "credential", "credentials", "signature"}
_KEY_ANYWHERE = {"access", "account"}  # access key (Spark's access[.]?key), fs.azure.account.key.<account>
_KEY_LAST = {"api", "private", "encryption", "signing", "master", "shared", "storage", "client"}
# URL parameters that carry a secret whatever the rule above says of their name (``key=``, ``sig=`` ...).
URL_PARAMS = ("password", "passwd", "pwd", "token", "secret", "key", "signature", "sig", "delegation")
# Near misses of these, as a key's last word, count as secret in error messages (``tracking.pasword``).
_MISSPELT = ("password", "passwd", "secret", "token", "credential", "credentials")

_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@'\"]*:)(?P<password>[^\s@'\"/]+)(?=@)")
_URL_PARAM = re.compile(r"(?P<head>[?&;](?P<name>[A-Za-z0-9_.\-]+)=)(?P<value>[^&;#\s'\"]+)")
_JAVA_OPTION = re.compile(r"(?P<head>(?<![\w-])-D(?P<name>[\w.\-]+)=)(?P<value>[^\s'\"]+)")


def words(key: str) -> list[str]:
    """``key``'s words, lower case (pure): ``spark.ssl.keyStorePassword`` -> spark ssl key store password."""
    return [w.lower() for w in _WORD.findall(str(key))]


def is_secret_key(key: str) -> bool:
    """Whether a config key, environment variable or Spark setting names a secret (the rule above)."""
    ws = words(key)
    if not ws:
        return False
    if any(w.endswith(_ENDS_SECRET) or w in _COMPOUNDS for w in ws):
        return True
    last = ws[-1]
    if last in _LAST or (last == "pwd" and len(ws) > 1):
        return True
    pairs = list(zip(ws, ws[1:]))
    return any(a in _KEY_ANYWHERE and b == "key" for a, b in pairs) or (
        last == "key" and len(ws) > 1 and ws[-2] in _KEY_LAST)


def looks_secret_key(key: str) -> bool:
    """:func:`is_secret_key`, or a key whose last word is a near miss of a secret's name (edit distance <= 2:
    ``tracking.pasword``): for the messages about a mistyped key, which would otherwise echo its value."""
    if is_secret_key(key):
        return True
    ws = words(key)
    return bool(ws) and len(ws[-1]) >= 4 and any(edit_distance(ws[-1], name) <= 2 for name in _MISSPELT)


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (pure)."""
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


def _secret_param(name: str) -> bool:
    return name.lower() in URL_PARAMS or is_secret_key(name)


def redact_text(text: str) -> str:
    """Free text with every URL password, secret URL parameter and secret ``-D`` option masked."""
    text = _URL_PASSWORD.sub(lambda m: m.group("head") + MASK, text)
    text = _URL_PARAM.sub(lambda m: m.group("head") + MASK if _secret_param(m.group("name")) else m.group(0), text)
    return _JAVA_OPTION.sub(lambda m: m.group("head") + MASK if is_secret_key(m.group("name")) else m.group(0), text)


def text_secrets(text: str) -> list[str]:
    """The secret strings :func:`redact_text` would mask in ``text`` (for masking them in log lines)."""
    out = [m.group("password") for m in _URL_PASSWORD.finditer(text)]
    out += [m.group("value") for m in _URL_PARAM.finditer(text) if _secret_param(m.group("name"))]
    return out + [m.group("value") for m in _JAVA_OPTION.finditer(text) if is_secret_key(m.group("name"))]


def redact_url(url: str) -> str:
    """A URL with its secrets masked (``None``-safe for optional settings)."""
    return redact_text(url) if isinstance(url, str) else url


def redact(value: Any, key: str = "") -> Any:
    """``value`` with secrets masked: any value under a secret key, URL secrets anywhere (recursive)."""
    if key and is_secret_key(key) and _is_set(value):
        return MASK
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact(v) for v in value)
    return value


def _is_set(value: Any) -> bool:
    return value is not None and value != "" and not isinstance(value, (Mapping, list, tuple))


def has_secret(value: Any, key: str = "") -> bool:
    """Whether :func:`redact` would change ``value``."""
    return redact(value, key) != value


def shown(value: Any, key: str) -> str:
    """``repr(value)`` for an error message about ``key``, with secrets masked."""
    return repr(redact(value, key))
