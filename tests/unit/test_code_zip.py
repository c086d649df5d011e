"""The --py-files zip (yarn/packaging.build_code_zip): every module ships with a hash-checked .pyc beside its
source, so the ranks and Spark's Python workers do not compile the code again on every start, and a .pyc
that no longer matches its source is never used."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from yarn import packaging

PROBE = "import sys; sys.path.insert(0, sys.argv[1]); import pkg.m as m; print(m.X, m.f.__code__.co_filename)"


def _package(root: Path, body: str) -> None:
    (root / "pkg").mkdir(parents=True, exist_ok=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "m.py").write_text(body)
    (root / "pkg" / "broken.py").write_text("def oops(:\n")


def _import(zip_path: Path) -> list[str]:
    proc = subprocess.run([sys.executable, "-I", "-c", PROBE, str(zip_path)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_the_zip_ships_a_pyc_beside_each_module_and_python_imports_it(tmp_path: Path) -> None:
    _package(tmp_path, "X = 1\ndef f():\n    return X\n")
    out = packaging.build_code_zip(str(tmp_path / "code.zip"), root=str(tmp_path), packages=("pkg",))
    names = set(zipfile.ZipFile(out).namelist())
    assert {"pkg/__init__.py", "pkg/__init__.pyc", "pkg/m.py", "pkg/m.pyc", "pkg/broken.py"} <= names
    assert "pkg/broken.pyc" not in names  # does not compile: shipped as source, its error raised where imported
    # compiled here (co_filename is the path in the zip the .pyc was made for), not from the zip's source
    # (which would name the file inside the zip's own path)
    assert _import(Path(out)) == ["1", "pkg/m.py"]


def test_a_pyc_that_no_longer_matches_its_source_is_not_used(tmp_path: Path) -> None:
    _package(tmp_path, "X = 1\ndef f():\n    return X\n")
    built = Path(packaging.build_code_zip(str(tmp_path / "code.zip"), root=str(tmp_path), packages=("pkg",)))
    edited = tmp_path / "edited.zip"
    with zipfile.ZipFile(built) as src, zipfile.ZipFile(edited, "w") as dst:
        for item in src.infolist():  # the same entries, m.py changed and the old m.pyc kept
            data = b"X = 2\ndef f():\n    return X\n" if item.filename == "pkg/m.py" else src.read(item)
            dst.writestr(item, data)
    value, filename = _import(edited)
    assert value == "2" and filename.endswith(str(Path("edited.zip") / "pkg" / "m.py"))
