"""What a child Python of hvdtrain gets on its PYTHONPATH: the folder that holds the packages (or the code zip on
YARN), never a package's own folder. With hvdtrain/ itself there, ``data``, ``model``, ``core``, ``training`` ...
were top-level names in every child: the ETL's, the ranks', the token helper's, and through Spark's YARN client
(which passes the submitter's PYTHONPATH on) every container's."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import hvdtrain
from hvdtrain.runtime import launch

SUBPACKAGES = ("data", "model", "core", "hadoop", "training", "runtime", "observe", "score", "tune", "cli")
PROBE = ("import importlib.util as u, sys; print([n for n in sys.argv[1:] if u.find_spec(n)], "
         "u.find_spec('etl.job') is not None)")


def test_children_import_the_packages_from_their_root_and_hvdtrain_s_modules_only_by_their_full_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONPATH", raising=False)
    env = launch.child_env()
    first = env["PYTHONPATH"].split(os.pathsep)[0]
    assert first == hvdtrain.code_root()
    assert all(os.path.isfile(os.path.join(first, p, "__init__.py")) for p in ("hvdtrain", "etl", "yarn"))
    out = subprocess.run([sys.executable, "-c", PROBE, *SUBPACKAGES], env=env, cwd=tmp_path, capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == "[] True"


def test_from_the_code_zip_the_root_is_the_zip(tmp_path: Path) -> None:
    """On YARN the code runs from --py-files: a child (the HDFS token helper) gets the zip itself."""
    shipped = tmp_path / "hvdtrain-code.zip"
    with zipfile.ZipFile(shipped, "w") as zf:
        zf.write(hvdtrain.__file__, "hvdtrain/__init__.py")
    out = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import hvdtrain; "
                          "print(hvdtrain.code_root())", str(shipped)], cwd=tmp_path, capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == str(shipped)
