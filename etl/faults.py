"""Test-only fault hooks for the ETL: the one seam tests use to break a run on purpose.

Never active by default: a hook is armed only when the environment variable
``HVDTRAIN_ETL_FAULT`` is set in the driver's environment when :func:`etl.job.run`
starts. The driver parses it once and ships the parsed :class:`Fault` to the
Spark tasks inside the write task's closure, so executors need no environment
of their own. Values (one hook at a time):

- ``drop_row:<stage>:<key>`` drops the row with that key at a stage boundary:
  ``validate`` (rows that passed the rules, before dedup), ``split`` (after
  dedup, before the split/label stage) or ``write`` (inside the write task).
  Row accounting must then fail naming that stage.
- ``fail_write_once:<partition>``: the first attempt of that partition's write
  task writes one record, flushes, and raises; the retried attempt
  (``local[N,F]`` retries tasks) must publish the same bytes as a clean run.
- ``write_twice:<partition>``: that partition's write runs twice, as a
  speculative attempt would: two complete staged copies exist; exactly one
  may be published.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

from hvdtrain.core.errors import ConfigError

ENV = "HVDTRAIN_ETL_FAULT"
DROP_STAGES = ("validate", "split", "write")


class InjectedFault(RuntimeError):
    """Raised by an armed hook inside a Spark task."""


@dataclass(frozen=True)
class Fault:
    kind: str  # drop_row | fail_write_once | write_twice
    stage: str = ""
    key: str = ""
    partition: int = -1

    def drops(self, stage: str) -> Optional[str]:
        """The key to drop at ``stage``, if this hook drops one there."""
        return self.key if self.kind == "drop_row" and self.stage == stage else None

    def fails_write(self, partition: int, attempt_number: int) -> bool:
        return self.kind == "fail_write_once" and partition == self.partition and attempt_number == 0

    def writes_twice(self, partition: int) -> bool:
        return self.kind == "write_twice" and partition == self.partition


def parse(value: str) -> Fault:
    """One hook from its ``HVDTRAIN_ETL_FAULT`` spelling (see the module docstring)."""
    kind, _, rest = value.partition(":")
    if kind == "drop_row":
        stage, _, key = rest.partition(":")
        if stage in DROP_STAGES and key:
            return Fault(kind, stage=stage, key=key)
    elif kind in ("fail_write_once", "write_twice") and rest.isdigit():
        return Fault(kind, partition=int(rest))
    raise ConfigError(ENV, value, f"is not a fault hook: use drop_row:<{'|'.join(DROP_STAGES)}>:<key>, "
                      "fail_write_once:<partition> or write_twice:<partition>, or unset it")


def from_env() -> Optional[Fault]:
    """The armed hook, or None (the default: no variable, no hook)."""
    value = os.environ.get(ENV, "")
    return parse(value) if value else None


def drop_rows(df: Any, fault: Optional[Fault], stage: str) -> Any:
    """``df`` without the hook's row at ``stage`` (``df`` itself when no hook drops there)."""
    key = fault.drops(stage) if fault else None
    if key is None:
        return df
    from pyspark.sql import functions as F

    return df.where(F.col("key") != F.lit(key))
