"""docs/safety.md's bad-input table comes from scripts/safety_table.py: every case ends in a named error."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "safety_table.py"


def test_every_bad_input_ends_in_a_named_error_with_exit_2_or_3():
    spec = importlib.util.spec_from_file_location("safety_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["safety_table"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    assert len(module.CASES) >= 30
    text, codes = module.table()
    assert all(code in (2, 3) for code in codes), text
    assert "Traceback" not in text
