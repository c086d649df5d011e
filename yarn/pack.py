"""``hvdtrain yarn pack ARCHIVE``: pack this Python environment into ARCHIVE (a local path or ``hdfs://``) for
YARN jobs to ship as ``yarn.env_archive``, with its build record beside it.

Run it where the environment was built for the cluster: on a CUDA build host, after ``HOROVOD_GPU_OPERATIONS=NCCL
make env``. A gateway without GPUs then submits GPU jobs with ``yarn.env_archive=ARCHIVE``: ``yarn submit`` reads
the record (``ARCHIVE.txt``: Horovod's build among the identity lines) instead of this host's Horovod.
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable, Optional, Sequence

from hvdtrain.core import secrets
from hvdtrain.core.errors import ConfigError, EnvironmentProblem
from hvdtrain.hadoop import fs
from hvdtrain.hadoop.envcheck import HorovodBuild, probe_horovod_build
from yarn import packaging, submit


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hvdtrain yarn pack", description=__doc__.split("\n\n")[0])
    p.add_argument("archive", help="where to write it, e.g. hdfs:///envs/gpu-env.tar.gz")
    return p.parse_args(argv)


def pack(args: argparse.Namespace, probe: Callable[[], HorovodBuild] = probe_horovod_build,
         pack_fn: packaging.PackFn = packaging.venv_pack, out: Callable[[str], None] = print) -> int:
    """Pack and upload; an existing ARCHIVE is refused (jobs may be shipping it)."""
    if not args.archive.endswith((".tar.gz", ".tgz")):
        raise ConfigError("ARCHIVE", args.archive, "must end in .tar.gz or .tgz (YARN unpacks it by its suffix)")
    taken = [uri for uri in (args.archive, *(args.archive + s for s in (packaging.IDENTITY_SUFFIX,
                                                                        packaging.SHA_SUFFIX))) if fs.exists(uri)]
    if taken:  # the archive, or a file beside it that the records would overwrite
        raise ConfigError("ARCHIVE", args.archive, "already exists, and jobs may be shipping it (found: "
                          f"{', '.join(map(secrets.redact_url, taken))}): pack to a new path (e.g. with a date) "
                          "and point yarn.env_archive at it")
    build = probe()
    if build.version is None or not build.tensorflow:
        raise EnvironmentProblem(f"this environment cannot train: {build.describe()}; build it with `make env` "
                                 "before packing it")
    packaging.pack_to(args.archive, packaging.current_identity(build), pack=pack_fn, log=out)
    shown = secrets.redact_url(args.archive)
    out(f"hvdtrain: packed {shown} ({build.describe()}); ship it with yarn.env_archive={shown}")
    return 0


def main(argv: Optional[Sequence[str]] = None, deps: Optional[submit.Collaborators] = None) -> int:
    collaborators = deps or submit.Collaborators()
    return submit.guarded(lambda args, d: pack(args, d.probe_build, out=lambda line: print(line, file=d.out,
                                                                                          flush=True)),
                          parse_args(argv), collaborators)


if __name__ == "__main__":
    sys.exit(main())
