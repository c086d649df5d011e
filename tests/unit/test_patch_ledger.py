"""Every Horovod patch says why it is carried (a DEP-3 header), and docs/horovod-patches.md lists it.

A patch in scripts/patches/ is a header, then the diff from its first ``diff `` or ``--- `` line on: that is
where patch(1) starts reading, and the only part scripts/build_horovod.sh puts in the wheel cache key. The
header is RFC 822-like fields (``Name: value``, continued on lines that start with a space), as in Debian's
DEP-3 (https://dep-team.pages.debian.net/deps/dep3/).
"""
from __future__ import annotations

import datetime
import re
from pathlib import Path

import pytest

from tests.multiprocess.test_horovod_patch_tests import added_tests

REPO = Path(__file__).resolve().parents[2]
PATCHES = REPO / "scripts" / "patches"
LEDGER = REPO / "docs" / "horovod-patches.md"
FIELDS = ("Description", "Origin", "Bug", "Forwarded", "Last-Update", "Test")
DIFF_START = re.compile(r"^(?:diff |--- )", re.M)
# Lines patch(1) would read as diff syntax: in a header they would make the header part of the diff.
DIFF_SYNTAX = re.compile(r"^(?:\+\+\+ |@@|Index:|\*\*\* )", re.M)
# tests/<path>.py, optionally ::name and a [parameter].
TEST_REF = re.compile(r"(tests/[\w/]+\.py)(?:::(\w+)(?:\[([^\]\s]+)\])?)?")
PATCH_NAMES = sorted(p.name for p in PATCHES.glob("*.patch"))


def split_patch(text: str) -> tuple[str, str]:
    """(header, diff): the diff starts at the first line patch(1) reads as one (pure)."""
    start = DIFF_START.search(text)
    return (text, "") if start is None else (text[:start.start()], text[start.start():])


def header_fields(header: str) -> dict[str, str]:
    """{field: value} of a DEP-3 header; continuation lines are joined with newlines, " ." is a blank line."""
    fields: dict[str, str] = {}
    name = None
    for line in header.splitlines():
        if line.startswith((" ", "\t")) and name is not None:
            fields[name] += "\n" + ("" if line.strip() == "." else line.strip())
        elif re.match(r"^[A-Za-z][\w-]*:", line):
            name, value = line.split(":", 1)
            fields[name] = value.strip()
        elif line.strip():
            name = None  # free text after the fields belongs to no field
    return fields


def problems(name: str, text: str) -> list[str]:
    """What is wrong with one patch's header, as sentences that name the fix (pure but for the file checks)."""
    header, diff = split_patch(text)
    fields = header_fields(header)
    found = [f"{name} has no diff (no line starting 'diff ' or '--- ')"] if not diff else []
    missing = [f for f in FIELDS if not fields.get(f, "").strip()]
    if missing:
        found.append(f"{name} lacks the header field(s) {', '.join(missing)} above its first diff line "
                     f"(see docs/horovod-patches.md)")
    for line in DIFF_SYNTAX.findall(header):
        found.append(f"{name}'s header has a line starting {line!r}, which patch(1) reads as a diff")
    if fields.get("Last-Update"):
        try:
            datetime.date.fromisoformat(fields["Last-Update"])
        except ValueError:
            found.append(f"{name}: Last-Update must be a date YYYY-MM-DD (got {fields['Last-Update']!r})")
    if fields.get("Test"):
        found += named_test_problems(name, fields["Test"], diff)
    return found


def named_test_problems(name: str, test: str, diff: str) -> list[str]:
    """What is wrong with a patch's Test field: each tests/ path must exist, with the test it names."""
    refs = TEST_REF.findall(test)
    if not refs:
        return [f"{name}: Test names no file under tests/ (got {test.splitlines()[0]!r})"]
    found = []
    for path, function, parameter in refs:
        file = REPO / path
        if not file.is_file():
            found.append(f"{name}: Test names {path}, which does not exist")
        elif function and not re.search(rf"^def {function}\(", file.read_text(), re.M):
            found.append(f"{name}: Test names {path}::{function}, which {path} does not define")
        elif parameter and parameter != name:
            found.append(f"{name}: Test names {path}::{function}[{parameter}], another patch's parameter")
        elif parameter and not added_tests(diff):
            found.append(f"{name}: Test names {path}::{function}[{parameter}], but the patch adds no test "
                         f"file under test/ for it to run")
    return found


@pytest.mark.parametrize("name", PATCH_NAMES)
def test_each_patch_has_its_header_and_its_test_exists(name: str) -> None:
    found = problems(name, (PATCHES / name).read_text())
    assert not found, "\n".join(found)


@pytest.mark.parametrize("name", PATCH_NAMES)
def test_the_description_is_a_summary_then_why_and_bug_and_forwarded_take_dep3_values(name: str) -> None:
    fields = header_fields(split_patch((PATCHES / name).read_text())[0])
    summary, _, why = fields.get("Description", "").partition("\n")
    assert summary and why.strip(), f"{name}: Description needs a one-line summary, then the why below it"
    bug, forwarded = fields.get("Bug", ""), fields.get("Forwarded", "")
    assert re.match(r"(https://github\.com/horovod/|none found)", bug), \
        f"{name}: Bug is an upstream URL or 'none found' (got {bug!r})"
    assert re.match(r"(no|not-needed|yes|https?://)\b", forwarded), \
        f"{name}: Forwarded is no, not-needed, yes or a URL (got {forwarded!r})"


def test_the_ledger_lists_every_patch_and_no_other() -> None:
    rows = set(re.findall(r"^\| `([^`]+\.patch)`", LEDGER.read_text(), re.M))
    assert sorted(rows) == PATCH_NAMES, (f"docs/horovod-patches.md's table lacks {sorted(set(PATCH_NAMES) - rows)} "
                                         f"and lists patches that do not exist: {sorted(rows - set(PATCH_NAMES))}")


def test_a_missing_field_a_missing_test_file_and_diff_syntax_in_the_header_are_each_found() -> None:
    good = ("Description: Fix a thing\n Why it broke.\n .\n More why.\nOrigin: vendor, hvdtrain\nBug: none found\n"
            "Forwarded: no (unmaintained)\nLast-Update: 2026-11-23\nTest: tests/unit/test_patch_ledger.py\n\n"
            "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n")
    assert problems("p.patch", good) == []
    assert header_fields(split_patch(good)[0])["Description"] == "Fix a thing\nWhy it broke.\n\nMore why."
    assert problems("p.patch", good.replace("Bug: none found\n", "")) == [
        "p.patch lacks the header field(s) Bug above its first diff line (see docs/horovod-patches.md)"]
    assert problems("p.patch", good.replace("test_patch_ledger.py", "test_gone.py")) == [
        "p.patch: Test names tests/unit/test_gone.py, which does not exist"]
    assert problems("p.patch", good.replace("Origin:", "+++ b/y\nOrigin:")) == [
        "p.patch's header has a line starting '+++ ', which patch(1) reads as a diff"]
    # A '--- ' line in the prose would end the header there: the fields after it are missing, and say so.
    assert "Bug, Forwarded, Last-Update, Test" in problems("p.patch", good.replace("Origin:", "--- x\nOrigin:"))[0]
