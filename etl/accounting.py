"""Row accounting: every row in is written, rejected by a rule, or dropped as a duplicate.

Each term is counted where it happens, never derived from the others:

- ``rows_in``: rows read from the source;
- ``rejected``: rows each rule rejected (one count per rule);
- ``before_dedup`` / ``after_dedup``: rows that passed the rules, and their distinct
  keys, the rows dedup keeps (``duplicates`` is their difference); the kept rows
  themselves are counted by the next stage, so a dedup that kept more or fewer shows
  as a leak at ``split``;
- ``by_split`` and ``label_unknown``: rows entering the writers per split, and
  rows quarantined because their label never occurs in train;
- ``written``: records the write tasks report having written, per split.

:func:`check` then walks the stages in order and names the first one whose
rows in differ from its rows out plus the rows it set aside. The counts come
from aggregations the job runs anyway (the cached tagged rows, the dedup's
rows per key, the per-split group-by, the writers' results), so accounting adds no
full pass over the data. Spark accumulators are not used: they over-count
when a transformation's task is retried.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from hvdtrain.core.errors import DataError

LABEL_UNKNOWN = "label_unknown"  # the reject rule of rows whose label never occurs in train


@dataclass
class RowCounts:
    rows_in: int = 0
    rejected: dict[str, int] = field(default_factory=dict)  # rule -> rows (validation rules only)
    before_dedup: int = 0
    after_dedup: int = 0
    label_unknown: int = 0  # rows set aside by the label check (etl/labels.py)
    label_rule: str = LABEL_UNKNOWN  # its rule: label_unknown, or label_not_a_number for a regression
    by_split: dict[str, int] = field(default_factory=dict)
    written: dict[str, int] = field(default_factory=dict)

    @property
    def duplicates(self) -> int:
        return self.before_dedup - self.after_dedup

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values()) + self.label_unknown

    @property
    def by_rule(self) -> dict[str, int]:
        """Rejected rows per rule, the label check included."""
        return {**self.rejected, **({self.label_rule: self.label_unknown} if self.label_unknown else {})}

    @property
    def rows_written(self) -> int:
        return sum(self.written.values())


def stage_flows(c: RowCounts) -> list[tuple[str, int, int, int]]:
    """(stage, rows in, rows passed on, rows set aside) for each stage, in order."""
    return [
        ("validate", c.rows_in, c.before_dedup, sum(c.rejected.values())),
        ("split", c.after_dedup, sum(c.by_split.values()), c.label_unknown),
    ] + [(f"write ({s})", n, c.written.get(s, 0), 0) for s, n in c.by_split.items()]


def first_leak(c: RowCounts) -> Optional[str]:
    """A message naming the first stage whose rows do not add up, or None when all do."""
    for stage, rows_in, passed, set_aside in stage_flows(c):
        if rows_in != passed + set_aside:
            lost = rows_in - passed - set_aside
            what = f"lost {lost:,}" if lost > 0 else f"gained {-lost:,}"
            return (f"row accounting failed at stage '{stage}': {rows_in:,} rows in, {passed:,} passed on, "
                    f"{set_aside:,} set aside ({what})")
    if c.rows_in != c.rows_written + c.rejected_total + c.duplicates:
        return (f"row accounting failed: rows_in {c.rows_in:,} != written {c.rows_written:,} + rejected "
                f"{c.rejected_total:,} + duplicates {c.duplicates:,}")
    return None


def check(c: RowCounts) -> None:
    """Raise DataError naming the stage that lost (or gained) rows; nothing is published then."""
    leak = first_leak(c)
    if leak:
        raise DataError(f"{leak}; nothing was published. A task lost or duplicated records: rerun, and report "
                        "a bug if it repeats")
