"""User-facing errors: one message naming what is wrong, the value and the fix."""
from __future__ import annotations


class HvdtrainError(Exception):
    """A mistake the user can act on (config, data, paths, environment).

    The CLI prints these as one line without a traceback and exits with the
    class's ``exit_code``; anything else is a bug and keeps its traceback.
    """

    exit_code = 2


class ConfigError(HvdtrainError):
    """A config value is wrong: names the dotted field, the value and what is allowed."""

    def __init__(self, field: str, value: object, expected: str):
        self.field = field
        self.value = value
        self.expected = expected
        super().__init__(f"{field} {expected} (got {value!r})")

    def under(self, prefix: str) -> "ConfigError":
        """The same error with the field named from one level up."""
        return ConfigError(f"{prefix}.{self.field}" if self.field else prefix, self.value, self.expected)


class DataError(HvdtrainError):
    """A dataset (source table, shards, manifest) does not meet its contract."""

    exit_code = 3


class StorageError(DataError):
    """The storage (HDFS, the local disk) failed after retries: not the user's data, and worth a restart."""

    exit_code = 74  # EX_IOERR: hvdtrain.supervise relaunches the job


class EnvironmentProblem(HvdtrainError):
    """The machine lacks something a step needs (Java, libhdfs, Horovod build...)."""

    exit_code = 4
