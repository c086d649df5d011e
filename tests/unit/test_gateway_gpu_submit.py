"""Submitting a GPU job from a gateway without GPUs (#56 item 8): ``yarn submit`` checks NCCL in the Horovod the
ranks will run (the archive's when ``yarn.env_archive`` names one), read from the archive's build record or from
its Horovod library, and ``hvdtrain yarn pack`` writes that record.

The archives here are real tar.gz files holding this environment's own Horovod TensorFlow library (built without
NCCL). No NCCL build of Horovod can be made on these machines, so the library "built with NCCL" is that same file
with the symbol NCCL builds call appended: the one stand-in, for the one fact this host cannot produce.
"""
from __future__ import annotations

import glob
import io
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from hvdtrain.core import config
from hvdtrain.core.errors import ConfigError
from hvdtrain.hadoop.envcheck import HorovodBuild
from yarn import pack, packaging, submit

CPU_BUILD = HorovodBuild(version="0.28.1", tensorflow=True, gloo=True)
GPU_BUILD = HorovodBuild(version="0.28.1", tensorflow=True, gloo=True, nccl=True, cuda=True)
LIBRARY = "lib/python3.11/site-packages/horovod/tensorflow/mpi_lib.cpython-311-x86_64-linux-gnu.so"


def _installed_library() -> bytes:
    import horovod

    found = glob.glob(os.path.join(os.path.dirname(horovod.__file__), "tensorflow", "mpi_lib*.so"))
    assert found, "this environment's Horovod has no TensorFlow library"
    return Path(found[0]).read_bytes()


def _archive(path: Path, library: bytes | None) -> str:
    """A packed environment's layout: bin/python, and Horovod's TensorFlow library deep inside."""
    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        for name, data in (("bin/activate", b"# venv\n"), ("lib/python3.11/site-packages/six.py", b"x = 1\n"),
                           *([(LIBRARY, library)] if library is not None else [])):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(path)


@pytest.fixture(scope="module")
def library() -> bytes:
    return _installed_library()


def job(archive: str | None, gpus: int = 1) -> config.JobConfig:
    return config.from_dict({"name": "g", "workdir": "/w", "source": {"table": "db.t"},
                             "etl": {"output": "hdfs://nn:8020/d"}, "train": {"output": "hdfs://nn:8020/r"},
                             "tracking": {"uri": "http://mlflow:5000"},
                             "yarn": {"gpus_per_worker": gpus, **({"env_archive": archive} if archive else {})}})


def test_the_installed_horovod_library_has_no_nccl_symbol(library: bytes) -> None:
    # what the library check stands on: this host's Horovod reports no NCCL, and its library never names NCCL's call
    from hvdtrain.hadoop.envcheck import probe_horovod_build

    assert probe_horovod_build().nccl is False and packaging._NCCL_SYMBOL not in library


def test_the_build_record_beside_an_archive_decides(tmp_path: Path, library: bytes) -> None:
    archive = _archive(tmp_path / "env.tar.gz", library)  # its library says no NCCL; the record is read first
    Path(archive + ".txt").write_text("horovod==0.28.1\nhorovod-build==tensorflow:1,gloo:1,nccl:1,mpi:0,cuda:1\n")
    assert packaging.archive_nccl(archive) == (True, f"its build record {archive}.txt")
    Path(archive + ".txt").write_text("horovod-build==tensorflow:1,gloo:1,nccl:0,mpi:0,cuda:0\n")
    assert packaging.archive_nccl(archive) == (False, f"its build record {archive}.txt")


def test_without_a_record_the_archive_s_horovod_library_decides(tmp_path: Path, library: bytes) -> None:
    plain = _archive(tmp_path / "cpu.tar.gz", library)
    assert packaging.archive_nccl(plain) == (False, f"its Horovod library {LIBRARY}")
    with_nccl = _archive(tmp_path / "gpu.tar.gz", library + packaging._NCCL_SYMBOL)
    assert packaging.archive_nccl(with_nccl) == (True, f"its Horovod library {LIBRARY}")
    neither = _archive(tmp_path / "none.tar.gz", None)
    nccl, how = packaging.archive_nccl(neither)
    assert nccl is None and "no build record" in how and "mpi_lib" in how


def test_a_gateway_without_nccl_submits_with_an_archive_that_has_it(tmp_path: Path, library: bytes) -> None:
    gpu = _archive(tmp_path / "gpu.tar.gz", library + packaging._NCCL_SYMBOL)
    submit.validate(job(gpu), "yarn", CPU_BUILD)  # this host has no NCCL; the ranks run the archive's Horovod
    conf = dict(submit.spark_conf(job(gpu), "yarn", "client", submit.Inputs("spark-submit", "python", "c.zip",
                                                                           "j.yaml", gpu, CPU_BUILD)))
    assert conf["spark.executor.resource.gpu.amount"] == "1"


@pytest.mark.parametrize("library_suffix, record, message", [
    (b"", None, f"ships Horovod without NCCL (its Horovod library {LIBRARY})"),
    (packaging._NCCL_SYMBOL, "horovod-build==tensorflow:1,gloo:1,nccl:0,mpi:0,cuda:0",
     "ships Horovod without NCCL (its build record"),
])
def test_an_archive_without_nccl_is_refused_in_one_line(tmp_path: Path, library: bytes, library_suffix: bytes,
                                                        record: str | None, message: str) -> None:
    archive = _archive(tmp_path / "env.tar.gz", library + library_suffix)
    if record:
        Path(archive + ".txt").write_text(record + "\n")
    with pytest.raises(ConfigError) as err:
        submit.validate(job(archive), "yarn", GPU_BUILD)  # NCCL here does not help: the archive ships
    assert str(err.value).startswith(f"yarn.env_archive {message}") and "\n" not in str(err.value)
    assert "hvdtrain yarn pack" in str(err.value)


def test_an_archive_that_does_not_say_or_is_missing_is_refused(tmp_path: Path) -> None:
    silent = _archive(tmp_path / "conda.tar.gz", None)
    with pytest.raises(ConfigError, match=r"does not say whether its Horovod has NCCL.*hvdtrain yarn pack"):
        submit.validate(job(silent), "yarn", CPU_BUILD)
    with pytest.raises(ConfigError, match=r"yarn.env_archive does not exist.*gone.tar.gz"):
        submit.validate(job(str(tmp_path / "gone.tar.gz")), "yarn", CPU_BUILD)


def test_without_an_archive_this_host_s_build_must_have_nccl(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"this host's build, which the job would ship, has none .*hvdtrain yarn pack"):
        submit.validate(job(None), "yarn", CPU_BUILD)
    submit.validate(job(None), "yarn", GPU_BUILD)
    submit.validate(job(None, gpus=0), "yarn", CPU_BUILD)  # no GPUs: nothing read, nothing needed


def test_yarn_pack_writes_the_record_submit_reads(tmp_path: Path, library: bytes, monkeypatch: Any) -> None:
    monkeypatch.delenv(packaging.PACK_CACHE_ENV, raising=False)
    packed: list[str] = []

    def pack_fn(prefix: str, output: str) -> None:  # stands in for venv-pack: a packed tree, this Horovod's library
        packed.append(prefix)
        _archive(Path(output), library)

    dest = str(tmp_path / "envs" / "gateway-env.tar.gz")
    lines: list[str] = []
    args = pack.parse_args([dest])
    assert pack.pack(args, probe=lambda: CPU_BUILD, pack_fn=pack_fn, out=lines.append) == 0
    assert packed and os.path.exists(dest) and lines[-1].startswith(f"hvdtrain: packed {dest} (Horovod 0.28.1")
    record = Path(dest + ".txt").read_text().splitlines()
    assert "horovod-build==tensorflow:1,gloo:1,nccl:0,mpi:0,cuda:0" in record
    assert Path(dest + ".sha256").read_text().strip() == packaging.file_sha256(dest)
    with pytest.raises(ConfigError, match="ships Horovod without NCCL \\(its build record"):
        submit.validate(job(dest), "yarn", GPU_BUILD)
    with pytest.raises(ConfigError, match="already exists, and jobs may be shipping it"):
        pack.pack(args, probe=lambda: CPU_BUILD, pack_fn=pack_fn, out=lines.append)
    beside = str(tmp_path / "user.tar.gz")
    Path(beside + ".txt").write_text("the user's own notes\n")  # a record would overwrite it: refused too
    with pytest.raises(ConfigError, match=r"already exists, and jobs may be shipping it \(found: \S*user.tar.gz.txt\)"):
        pack.pack(pack.parse_args([beside]), probe=lambda: CPU_BUILD, pack_fn=pack_fn)
    assert Path(beside + ".txt").read_text() == "the user's own notes\n" and not os.path.exists(beside)
    with pytest.raises(ConfigError, match=r"ARCHIVE must end in .tar.gz.*env.zip"):
        pack.pack(pack.parse_args([str(tmp_path / "env.zip")]), probe=lambda: CPU_BUILD, pack_fn=pack_fn)
