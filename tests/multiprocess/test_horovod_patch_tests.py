"""The upstream-style tests that the project's Horovod patches add, run against the installed (patched) Horovod.

A patch under scripts/patches/ that fixes Horovod adds its test the way upstream would (a new file under
``test/``); the sdist has no tests and the built wheel installs none, so this test cuts each new test
file out of its patch and runs it with pytest, here, against the Horovod this environment built.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

PATCHES = Path(__file__).resolve().parents[2] / "scripts" / "patches"
# A new file in a unified diff: "+++ b/test/....py", a hunk from nothing, then only added lines.
ADDED_FILE = re.compile(r"^\+\+\+ b/(test/\S+\.py)\n@@ -0,0 \+1(?:,\d+)? @@\n((?:\+.*\n?)*)", re.M)


def added_tests(patch: str) -> dict[str, str]:
    """{path: text} of every new test file a unified diff adds (pure)."""
    return {m.group(1): "".join(line[1:] + "\n" for line in m.group(2).splitlines())
            for m in ADDED_FILE.finditer(patch)}


def test_the_new_test_files_of_a_patch_are_found() -> None:
    found = added_tests((PATCHES / "0003-horovod-0.28.1-elastic-local-discovery.patch").read_text())
    assert list(found) == ["test/single/test_elastic_local_hosts.py"]
    assert "class ElasticLocalHostsTests(unittest.TestCase):" in found["test/single/test_elastic_local_hosts.py"]


@pytest.mark.parametrize("patch", sorted(p.name for p in PATCHES.glob("*.patch") if added_tests(p.read_text())))
def test_a_patch_s_own_tests_pass_on_the_installed_horovod(patch: str, tmp_path: Path) -> None:
    files = added_tests((PATCHES / patch).read_text())
    paths = []
    for rel, text in files.items():
        paths.append(tmp_path / Path(rel).name)
        paths[-1].write_text(text)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir",
                           str(tmp_path), *map(str, paths)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (f"{patch}'s tests fail on the installed Horovod (rebuild it with `make env` "
                                  f"if the patch changed):\n{proc.stdout[-4000:]}{proc.stderr[-2000:]}")
