"""``hdfs://`` served from a local folder inside Spark's Python workers, recording what each write saw.

There is no Hadoop cluster here. To check that the ETL's shard-writing tasks set
up libhdfs in their own process (as YARN containers need), a test runs the real
:func:`etl.writer.write_batches` in real Spark tasks through
:func:`write_batches_in_container`, which first gives the worker what a YARN
container has (``HADOOP_HOME`` of a Hadoop client whose ``bin/hadoop classpath
--glob`` answers, a CLASSPATH of wildcards) and serves ``hdfs://`` from a local
folder; every file the task opens for writing appends the CLASSPATH and
ARROW_LIBHDFS_DIR it was opened under, and the pid, to ``_writes.jsonl``.
"""
from __future__ import annotations

import json
import os
import stat
from typing import Any, Iterable, Iterator

import pyarrow as pa
import pyarrow.fs as pafs

from hvdtrain.hadoop import fs

LOG = "_writes.jsonl"
CONTAINER_CLASSPATH = "/yarn/container/__spark_libs__/*:/yarn/container/__app__.jar"


def fake_hadoop_client(home: str) -> str:
    """A Hadoop client install as libhdfs set-up probes it: bin/hadoop (answers ``classpath --glob``) and
    lib/native/libhdfs.so. Returns the jar list ``hadoop classpath --glob`` prints."""
    jars = f"{home}/share/hadoop/common/hadoop-common-3.3.6.jar:{home}/share/hadoop/hdfs/hadoop-hdfs-3.3.6.jar"
    os.makedirs(os.path.join(home, "bin"), exist_ok=True)
    os.makedirs(os.path.join(home, "lib", "native"), exist_ok=True)
    script = os.path.join(home, "bin", "hadoop")
    with open(script, "w") as fh:
        fh.write(f'#!/bin/sh\n[ "$1 $2" = "classpath --glob" ] && echo "{jars}" && exit 0\nexit 1\n')
    os.chmod(script, os.stat(script).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    open(os.path.join(home, "lib", "native", "libhdfs.so"), "wb").close()
    return jars


class _Recording(pafs.FileSystemHandler):
    """A local folder as a filesystem; each output stream first logs the environment it was opened under."""

    def __init__(self, root: str):
        self.root, self.local = root, pafs.LocalFileSystem()

    def _p(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def __eq__(self, other): return isinstance(other, _Recording) and other.root == self.root
    def __ne__(self, other): return not self == other
    def get_type_name(self): return "hdfs-standin"
    def normalize_path(self, path): return path

    def get_file_info(self, paths):
        return [pafs.FileInfo(p, i.type, size=i.size) for p, i in zip(paths, self.local.get_file_info(
            [self._p(p) for p in paths]))]

    def get_file_info_selector(self, selector):
        raise pa.ArrowNotImplementedError("not needed by the write tasks")

    def create_dir(self, path, recursive):
        self.local.create_dir(self._p(path), recursive=recursive)

    def delete_dir(self, path): self.local.delete_dir(self._p(path))
    def delete_dir_contents(self, path, missing_dir_ok=False): self.local.delete_dir_contents(self._p(path))
    def delete_root_dir_contents(self): raise pa.ArrowNotImplementedError("no")
    def delete_file(self, path): self.local.delete_file(self._p(path))
    def move(self, src, dest): self.local.move(self._p(src), self._p(dest))
    def copy_file(self, src, dest): self.local.copy_file(self._p(src), self._p(dest))
    def open_input_stream(self, path): return self.local.open_input_stream(self._p(path), compression=None)
    def open_input_file(self, path): return self.local.open_input_file(self._p(path))
    def open_append_stream(self, path, metadata=None): raise pa.ArrowNotImplementedError("no")

    def open_output_stream(self, path, metadata=None):
        seen = {"pid": os.getpid(), "path": path, "CLASSPATH": os.environ.get("CLASSPATH"),
                "ARROW_LIBHDFS_DIR": os.environ.get("ARROW_LIBHDFS_DIR")}
        with open(os.path.join(self.root, LOG), "a") as fh:
            fh.write(json.dumps(seen) + "\n")
        return self.local.open_output_stream(self._p(path), compression=None)


def write_batches_in_container(batches: Iterable, *, root: str, hadoop_home: str, **kwargs: Any) -> Iterator[Any]:
    """In a Spark task: a YARN container's environment and ``hdfs://`` on ``root``, then the ETL's own task."""
    from etl import writer

    fs.register_scheme("hdfs", lambda netloc: pafs.PyFileSystem(_Recording(root)))
    os.environ["HADOOP_HOME"] = hadoop_home
    if "hadoop-common" not in os.environ.get("CLASSPATH", ""):  # this worker has not been set up yet
        os.environ["CLASSPATH"] = CONTAINER_CLASSPATH
        os.environ.pop("ARROW_LIBHDFS_DIR", None)
    try:
        yield from writer.write_batches(batches, **kwargs)
    finally:  # Python workers are reused: leave hdfs:// as it was for later tasks
        fs.register_scheme("hdfs", None)


def writes(root: str) -> list[dict[str, Any]]:
    with open(os.path.join(root, LOG)) as fh:
        return [json.loads(line) for line in fh]
