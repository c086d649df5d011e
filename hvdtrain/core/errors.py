"""User-facing errors: one message naming what is wrong, the value and the fix.

Every hvdtrain command (``hvdtrain ...``, ``python -m hvdtrain.training.train``,
``python -m etl.job``, ``spark-submit etl/job.py``) ends with one of these exit
codes, so a script or a scheduler can tell the kind of failure apart:

====  ======================================================================
code  meaning
====  ======================================================================
0     success
1     unexpected failure: a bug or a crash; its traceback is printed
2     usage or config error: command line, config file, ``key=value`` override
3     data error: source table, dataset, manifest, checkpoints, a storage path
4     environment problem: Java, Hadoop client, Horovod build, cluster settings
5     a job step failed without a hvdtrain error (a rank, a Spark task, a YARN
      application); the messages above it say why
74    storage (HDFS, the local disk) failed after retries (a retry may succeed)
75    a rank stalled and was ended by the watchdog (a retry may succeed)
130   interrupted (Ctrl-C)
====  ======================================================================
"""
from __future__ import annotations

import sys

from hvdtrain.core import redaction

EXIT_OK = 0
EXIT_UNEXPECTED = 1
EXIT_STALLED = 75  # EX_TEMPFAIL: a retry of the job may succeed
EXIT_INTERRUPTED = 130

# Every code a hvdtrain command may end with (the table above), for messages and docs.
EXIT_CODES: dict[int, str] = {
    0: "success",
    1: "unexpected failure (a bug or a crash)",
    2: "usage or config error",
    3: "data error",
    4: "environment problem",
    5: "a job step failed",
    74: "storage failed after retries",
    75: "a rank stalled",
    130: "interrupted",
}

# Broad exception handlers (docs/lint.md). Where catching everything is the point -- tracking, monitoring and
# Kerberos renewal never break training, clean-up never hides the real error, a background thread hands its
# failure to the thread that waits on it, one failed benchmark group does not hide the others -- the handler says
# so by catching one of these names, and reports what it caught (a warning, an error handed on or re-raised
# elsewhere). Anywhere else ruff's BLE001 rejects `except Exception` / `except BaseException`: name the errors.
ANY_ERROR = Exception
ANY_FAILURE = BaseException  # only for a background thread that hands even SystemExit to its waiter


class HvdtrainError(Exception):
    """A mistake the user can act on (config, data, paths, environment).

    The CLI prints these as one line without a traceback and exits with the
    class's ``exit_code``; anything else is a bug and keeps its traceback.
    """

    exit_code = 2


class ConfigError(HvdtrainError):
    """A config value is wrong: names the dotted field, the value and what is allowed.

    The message masks the value under a secret name and the secret parts of a URL (:mod:`hvdtrain.core.redaction`);
    ``value`` keeps it as given."""

    exit_code = 2

    def __init__(self, field: str, value: object, expected: str):
        self.field = field
        self.value = value
        self.expected = expected
        super().__init__(f"{field} {expected} (got {redaction.shown(value, field)})")

    def under(self, prefix: str) -> "ConfigError":
        """The same error with the field named from one level up."""
        return ConfigError(f"{prefix}.{self.field}" if self.field else prefix, self.value, self.expected)


class UsageError(HvdtrainError):
    """The command line is wrong (a missing or unknown argument)."""

    exit_code = 2


class DataError(HvdtrainError):
    """A dataset (source table, shards, manifest) does not meet its contract."""

    exit_code = 3


class StorageError(DataError):
    """The storage (HDFS, the local disk) failed after retries: not the user's data, and worth a restart."""

    exit_code = 74  # EX_IOERR: hvdtrain.runtime.supervise relaunches the job


class AccessDenied(DataError, PermissionError):
    """The storage refused this user a path (HDFS permissions, a local folder's mode): not retried, since only a
    change of rights or of user can help. Still a ``PermissionError``, for code that handles the storage's own."""


class EnvironmentProblem(HvdtrainError):
    """The machine lacks something a step needs (Java, libhdfs, Horovod build...)."""

    exit_code = 4


class StepFailed(HvdtrainError):
    """A step's process (the ETL, a rank, spark-submit) failed; ``exit_code`` says of what kind.

    5 when the process did not say (it crashed, or was killed), else the code of the error it
    reported (a child's DataError relayed by the launcher keeps its 3).
    """

    exit_code = 5

    def __init__(self, message: str, exit_code: int = 5):
        super().__init__(message)
        self.exit_code = exit_code


def exit_code(exc: BaseException) -> int:
    """The exit code a command ends with after ``exc`` (see the table above)."""
    if isinstance(exc, HvdtrainError):
        return exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    return EXIT_UNEXPECTED


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``, also on Python 3.10 (no ``add_note``): there hvdtrain's console reads ``__notes__``."""
    if sys.version_info >= (3, 11):
        exc.add_note(note)
    else:
        exc.__notes__ = [*getattr(exc, "__notes__", ()), note]  # type: ignore[attr-defined]  # 3.11+ in typeshed
