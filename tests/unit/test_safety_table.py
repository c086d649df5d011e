"""docs/safety.md's bad-input table comes from scripts/safety_table.py: every case ends in a named error."""
from __future__ import annotations

import importlib.util
import re
import sys
import tempfile
from pathlib import Path

from hvdtrain.core.errors import ANY_ERROR

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "safety_table.py"
DOC = ROOT / "docs" / "safety.md"


def _script():
    spec = importlib.util.spec_from_file_location("safety_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["safety_table"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _doc_rows() -> list[str]:
    """The rows of the doc's "Bad inputs tried" table."""
    section = DOC.read_text().split("## Bad inputs tried", 1)[1]
    return [line for line in section.splitlines() if re.match(r"\| \d+ \|", line)]


def test_every_bad_input_ends_in_a_named_error_with_exit_2_or_3():
    module = _script()
    text, codes = module.table()
    rows = _doc_rows()
    # The full count: every case is in the doc, numbered 1..N, and the doc lists no case the script lacks.
    assert len(codes) == len(module.CASES) == len(rows), (len(module.CASES), len(rows))
    assert [int(row.split("|")[1]) for row in rows] == list(range(1, len(rows) + 1))
    assert [row.split("|")[2].strip() for row in rows] == [case.name for case in module.CASES]
    assert all(code in (2, 3) for code in codes), text
    assert "Traceback" not in text


def test_every_bad_input_error_is_one_line():
    """What the user reads is the whole message, not the table's first 110 characters: one line, no notes."""
    long = []
    for case in _script().CASES:
        with tempfile.TemporaryDirectory(prefix="hvdtrain-bad-") as folder:
            try:
                case.run(Path(folder))
            except ANY_ERROR as exc:
                if "\n" in str(exc) or getattr(exc, "__notes__", None):
                    long.append((case.name, str(exc), getattr(exc, "__notes__", None)))
    assert not long, long
