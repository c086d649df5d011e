"""What a YARN job ships: the project code as a zip, the Python environment as an archive.

Code (``hvdtrain/``, ``etl/``, ``yarn/``) changes with every edit, so it is
zipped at each submission and sent with ``--py-files`` (a few hundred KB).

The environment (TensorFlow, Horovod, pyspark, ...: gigabytes) rarely changes,
so it is packed once with venv-pack and uploaded to
``yarn.env_cache/<hash>.tar.gz``; later submissions reuse it while the hash
is the same. The hash covers what decides the archive's content and whether it
runs on the cluster: every installed distribution's ``name==version`` (except
editable ones: that is this project, shipped as code), the Python version and
platform, and Horovod's build facts (a rebuild with NCCL keeps the version
number). ``yarn.env_archive`` names an archive to use as is instead.

venv-pack caveat: the archive links ``bin/python`` to the base interpreter
(for this venv, the ``home`` in ``pyvenv.cfg``), which must exist at the same
path on every NodeManager host.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import py_compile
import re
import shutil
import sys
import sysconfig
import tarfile
import tempfile
import uuid
import zipfile
from dataclasses import dataclass
from importlib import metadata
from typing import Callable, Iterable, Optional, Sequence

from hvdtrain.core.config import YarnConfig
from hvdtrain.core.errors import ANY_ERROR, ConfigError, EnvironmentProblem
from hvdtrain.hadoop import fs
from hvdtrain.hadoop.envcheck import HorovodBuild

CODE_PACKAGES = ("hvdtrain", "etl", "yarn")
CODE_SUFFIXES = (".py", ".sh")
# The editable install of this project: its finder points at the submitting host's checkout.
EDITABLE_FILES = "lib/python*/site-packages/__editable__*"
# Left out of the packed venv: nothing in a container reads them, and they were 40% of the archive (1.1 GB) that
# every NodeManager downloads and unpacks. Spark's jars (442 MB): the application master and executors run on
# the jars YARN localizes for them (spark.yarn.jars / spark.yarn.archive, or the submitter's upload); a
# container's Python only imports pyspark's modules. TensorFlow's C++ headers (287 MB): for compiling custom ops.
PACK_EXCLUDES = (EDITABLE_FILES, "lib/python*/site-packages/pyspark/jars/*",
                 "lib/python*/site-packages/tensorflow/include/*")

PackFn = Callable[[str, str], None]  # (venv prefix, output .tar.gz path)
PACK_CACHE_ENV = "HVDTRAIN_PACK_CACHE"  # a local folder keeping packed archives by hash (opt-in)


def project_root() -> str:
    """The folder holding the hvdtrain, etl and yarn packages."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- code --------------------------------------------------------------------------------

def code_files(root: str, packages: Sequence[str] = CODE_PACKAGES) -> list[tuple[str, str]]:
    """(absolute path, path in the zip) of every source file of the packages, sorted."""
    out = []
    for package in packages:
        base = os.path.join(root, package)
        if not os.path.isfile(os.path.join(base, "__init__.py")):
            raise EnvironmentProblem(f"cannot ship the code: {base} is not a Python package "
                                     "(run from a source checkout or an install of hvdtrain)")
        for folder, dirs, files in os.walk(base):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
            for name in sorted(files):
                if name.endswith(CODE_SUFFIXES):
                    path = os.path.join(folder, name)
                    out.append((path, os.path.relpath(path, root).replace(os.sep, "/")))
    return out


def user_code_files(folder: str) -> list[tuple[str, str]]:
    """(absolute path, path in the zip) of the Python files under ``model.code``, at the zip's top level (so its
    modules import as they do from that folder)."""
    if not os.path.isdir(folder):
        raise EnvironmentProblem(f"cannot ship model.code {folder}: not a folder on this host")
    out = []
    for base, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
        out += [(os.path.join(base, n), os.path.relpath(os.path.join(base, n), folder).replace(os.sep, "/"))
                for n in sorted(files) if n.endswith(".py")]
    return out


def build_code_zip(output: str, root: Optional[str] = None, packages: Sequence[str] = CODE_PACKAGES,
                   user_code: Optional[str] = None) -> str:
    """Zip the project's packages (and ``model.code``, the user's model code) for ``--py-files``; returns
    ``output``."""
    files = code_files(root or project_root(), packages) + (user_code_files(user_code) if user_code else [])
    with zipfile.ZipFile(output, "w", compression=zipfile.ZIP_DEFLATED) as zf, \
            tempfile.TemporaryDirectory(prefix="hvdtrain-pyc-") as scratch:
        for i, (path, arcname) in enumerate(files):
            zf.write(path, arcname)
            if arcname.endswith(".py"):
                pyc = _checked_pyc(path, arcname, os.path.join(scratch, f"{i}.pyc"))
                if pyc:
                    zf.write(pyc, arcname + "c")
    return output


def _checked_pyc(path: str, arcname: str, cfile: str) -> Optional[str]:
    """``path`` compiled to ``cfile`` as a hash-checked .pyc, or None when it does not compile (the rank then
    reports the error from the source, as it would have).

    Python cannot cache what it compiles from a zip, so without these every rank process and Spark Python
    worker compiled the shipped code again (0.3-0.5 s for hvdtrain's modules). zipimport reads ``x.pyc``
    beside ``x.py`` only while the hash of that ``x.py`` matches, and a cluster Python of another version
    rejects the .pyc by its magic number: either way it falls back to the source."""
    try:
        return py_compile.compile(path, cfile=cfile, dfile=arcname, doraise=True,
                                  invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    except py_compile.PyCompileError:
        return None


# -- environment identity ------------------------------------------------------------------

@dataclass(frozen=True)
class Distribution:
    name: str
    version: str
    editable: bool = False


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def installed_distributions(site_packages: Optional[str] = None) -> list[Distribution]:
    """Distributions installed in a site-packages folder (default: this interpreter's)."""
    path = site_packages or sysconfig.get_paths()["purelib"]
    out = []
    for dist in metadata.distributions(path=[path]):
        name = dist.metadata["Name"]
        if not name:
            continue
        direct = dist.read_text("direct_url.json")
        editable = bool(direct and json.loads(direct).get("dir_info", {}).get("editable"))
        out.append(Distribution(_canonical(name), dist.version, editable))
    return out


BUILD_LINE = "horovod-build=="  # the identity line holding Horovod's build facts
IDENTITY_SUFFIX = ".txt"  # beside an archive: its identity lines (written when hvdtrain packs it)


def env_identity(dists: Iterable[Distribution], python_version: str, platform_tag: str,
                 build: Optional[HorovodBuild]) -> list[str]:
    """The lines the environment hash covers, sorted and deduplicated (pure)."""
    lines = {f"{d.name}=={d.version}" for d in dists if not d.editable}
    lines.add(f"python=={python_version}")
    lines.add(f"platform=={platform_tag}")
    lines.add("packed-without==" + ",".join(PACK_EXCLUDES))  # what the archive holds, not only what is installed
    if build is not None:
        lines.add(BUILD_LINE + ",".join(f"{k}:{int(getattr(build, k))}"
                                               for k in ("tensorflow", "gloo", "nccl", "mpi", "cuda")))
    return sorted(lines)


def recorded_build(identity: Sequence[str]) -> Optional[dict[str, bool]]:
    """Horovod's build facts from an archive's identity lines (:func:`env_identity`), or None without them (pure)."""
    for line in identity:
        if line.startswith(BUILD_LINE):
            pairs = (item.split(":", 1) for item in line[len(BUILD_LINE):].split(",") if ":" in item)
            return {key: value == "1" for key, value in pairs}
    return None


# Horovod's TensorFlow library in a packed environment (venv-pack and conda-pack both keep site-packages' layout)
_HOROVOD_TF_LIBRARY = re.compile(r"(^|/)site-packages/horovod/tensorflow/mpi_lib[^/]*\.so$")
# A library built with NCCL calls it (HOROVOD_GPU_OPERATIONS=NCCL); without NCCL the name is nowhere in it
_NCCL_SYMBOL = b"ncclAllReduce"


def archive_nccl(uri: str) -> tuple[Optional[bool], str]:
    """Whether the Horovod an environment archive ships was built with NCCL, and how that was found: from the
    build record beside it (``<archive>.txt``, written when ``hvdtrain`` packs an archive, ``hvdtrain yarn pack``
    too), else from Horovod's TensorFlow library inside it (the archive is read as a stream up to that file).
    None when neither tells."""
    record = uri + IDENTITY_SUFFIX
    if fs.exists(record):
        build = recorded_build(fs.read_bytes(record).decode("utf-8", "replace").splitlines())
        if build is not None and "nccl" in build:
            return build["nccl"], f"its build record {record}"
    with fs.open_input(uri) as raw, tarfile.open(fileobj=raw, mode="r|*") as tar:
        for member in tar:
            if member.isfile() and _HOROVOD_TF_LIBRARY.search(member.name):
                data = tar.extractfile(member)
                found = data is not None and _NCCL_SYMBOL in data.read()
                return found, f"its Horovod library {member.name}"
    return None, (f"no build record ({record}) and no Horovod TensorFlow library (horovod/tensorflow/mpi_lib*.so) "
                  "inside it")


def env_hash(identity: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(identity).encode()).hexdigest()[:24]


def current_identity(build: Optional[HorovodBuild]) -> list[str]:
    """This environment's identity lines."""
    return env_identity(installed_distributions(), platform.python_version(),
                        f"{sys.platform}-{platform.machine()}", build)


def archive_uri(env_cache: str, digest: str) -> str:
    return fs.join(env_cache, f"{digest}.tar.gz")


# -- packing and uploading ------------------------------------------------------------------

def venv_prefix() -> str:
    """This interpreter's virtual environment, or EnvironmentProblem."""
    if sys.prefix == sys.base_prefix:
        raise EnvironmentProblem(
            f"the current Python ({sys.executable}) is not a virtual environment, so venv-pack cannot pack it; "
            "run from the project venv (make env), or set yarn.env_archive to a packed environment")
    return sys.prefix


PACK_COMPRESS_LEVEL = 1


def venv_pack(prefix: str, output: str) -> None:
    """Pack a venv with venv-pack, leaving out the editable install of this project and PACK_EXCLUDES."""
    import venv_pack as vp  # only the packing path needs it

    try:
        # gzip level 1, not venv-pack's 4: this 3 GB venv packed in 23 s instead of 36 s (2 cores, idle) into
        # 760 MB instead of 698 (+9 % to upload once and to localize per NodeManager, where it unpacks as fast)
        vp.pack(prefix=prefix, output=output, force=True, compress_level=PACK_COMPRESS_LEVEL,
                filters=[("exclude", p) for p in PACK_EXCLUDES])
    except vp.VenvPackException as exc:
        raise EnvironmentProblem(f"venv-pack could not pack {prefix}: {exc}") from exc


@dataclass(frozen=True)
class EnvArchive:
    """The archive a job ships with ``--archives <uri>#env``."""

    uri: str
    digest: Optional[str]  # None when yarn.env_archive was given
    uploaded: bool  # packed and uploaded by this call


def planned_archive(yarn: YarnConfig, identity: Sequence[str]) -> EnvArchive:
    """Where the archive is (or will be), without touching anything (pure)."""
    if yarn.env_archive:
        return EnvArchive(yarn.env_archive, None, False)
    digest = env_hash(identity)
    return EnvArchive(archive_uri(yarn.env_cache, digest), digest, False)


def ensure_env_archive(yarn: YarnConfig, identity: Sequence[str], prefix: Optional[str] = None,
                       pack: PackFn = venv_pack, log: Callable[[str], None] = print) -> EnvArchive:
    """The archive for this environment: the cached one when its hash matches, else pack and upload."""
    planned = planned_archive(yarn, identity)
    if planned.digest is None:
        if not fs.exists(planned.uri):
            raise ConfigError("yarn.env_archive", planned.uri,
                              "does not exist; point it at a venv-pack/conda-pack archive, or unset it to pack "
                              "this environment into yarn.env_cache")
        return planned
    if fs.exists(planned.uri):
        problem = cached_archive_problem(planned.uri)
        if problem is None:
            log(f"env archive: reusing {planned.uri} (hash {planned.digest}, content verified)")
            return planned
        log(f"env archive: not reusing {planned.uri}: {problem}; packing it again")
        fs.delete(planned.uri)
    pack_to(planned.uri, identity, prefix, pack, log)
    return EnvArchive(planned.uri, planned.digest, True)


def pack_to(uri: str, identity: Sequence[str], prefix: Optional[str] = None, pack: PackFn = venv_pack,
            log: Callable[[str], None] = print) -> None:
    """Pack the environment and upload it to ``uri`` with its records beside it: the identity lines (Horovod's
    build among them, which :func:`archive_nccl` reads), the archive's SHA-256 and the storage's checksum."""
    digest = env_hash(identity)
    with tempfile.TemporaryDirectory(prefix="hvdtrain-pack-") as tmp:
        local = _packed(digest, prefix, pack, log, tmp)
        log(f"env archive: uploading {os.path.getsize(local) / 2**20:.0f} MB to {uri}")
        content, length = file_sha256(local), os.path.getsize(local)
        ours = upload_once(local, uri)
    fs.write_bytes_atomic(uri + IDENTITY_SUFFIX, ("\n".join(identity) + "\n").encode())
    fs.write_bytes_atomic(uri + SHA_SUFFIX, (content + "\n").encode())
    if ours and fs.size(uri) == length:  # our bytes, whole: the storage's checksum may vouch for them
        record_storage_checksum(uri)


SHA_SUFFIX = ".sha256"  # beside a cached archive: the SHA-256 of its bytes, checked before every reuse
# Beside it on HDFS: HDFS's own checksum of the uploaded archive. When it still matches, the archive is unchanged
# without reading its gigabytes back (4 s per submission for 1.1 GB on the one-machine cluster); when it does not
# (or the storage has none), the SHA-256 decides.
STORAGE_SUFFIX = ".checksum"


def file_sha256(local: str, chunk: int = 8 << 20) -> str:
    digest = hashlib.sha256()
    with open(local, "rb") as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def cached_archive_problem(uri: str, chunk: int = 8 << 20) -> Optional[str]:
    """None when the cached archive's bytes match its recorded SHA-256, else what is wrong (its name is
    only the environment's hash: a truncated, replaced or corrupted file must not be shipped). The storage's
    own checksum, recorded at upload, vouches for it without a read when it still matches."""
    if not fs.exists(uri + SHA_SUFFIX):
        return f"no {SHA_SUFFIX} beside it to verify its content"
    stored = _storage_checksum(uri)
    if stored is not None and fs.exists(uri + STORAGE_SUFFIX) and \
            stored == fs.read_bytes(uri + STORAGE_SUFFIX).decode().strip():
        return None
    expected = fs.read_bytes(uri + SHA_SUFFIX).decode().strip()
    digest = hashlib.sha256()
    with fs.open_input(uri) as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            digest.update(block)
    if digest.hexdigest() != expected:
        return f"its content hash {digest.hexdigest()[:16]} is not the recorded {expected[:16]}"
    _keep_storage_checksum(uri, stored)  # verified by a full read: it vouches for the archive from now on
    return None


def record_storage_checksum(uri: str) -> None:
    """Keep the storage's checksum of a verified archive beside it (nothing where the storage has none)."""
    _keep_storage_checksum(uri, _storage_checksum(uri))


def _keep_storage_checksum(uri: str, stored: Optional[str]) -> None:
    if stored is not None:
        fs.write_bytes_atomic(uri + STORAGE_SUFFIX, (stored + "\n").encode())


def _storage_checksum(uri: str) -> Optional[str]:
    """The storage's checksum, or None when it has none or refuses to tell (the SHA-256 then decides)."""
    try:
        return fs.storage_checksum(uri)
    except ANY_ERROR:
        return None


def _packed(digest: str, prefix: Optional[str], pack: PackFn, log: Callable[[str], None], tmp: str) -> str:
    """The packed archive's local path: from $HVDTRAIN_PACK_CACHE when set and it holds this hash (packing a
    large venv takes minutes; a fresh cluster, e.g. the test tier's minicluster, still needs the upload), else
    packed now (and kept there for next time)."""
    cache = os.environ.get(PACK_CACHE_ENV)
    cached = os.path.join(cache, f"{digest}.tar.gz") if cache else None
    if cached and os.path.exists(cached):
        log(f"env archive: packed earlier, {cached}")
        return cached
    prefix = prefix or venv_prefix()
    log(f"env archive: packing {prefix} (hash {digest}; once per environment change) ...")
    local = os.path.join(tmp, f"{digest}.tar.gz")
    pack(prefix, local)
    if cached and cache:
        os.makedirs(cache, exist_ok=True)
        shutil.copyfile(local, f"{cached}.part")
        os.replace(f"{cached}.part", cached)
    return local


def upload_once(local: str, uri: str, chunk: int = 8 << 20) -> bool:
    """Copy a local file to ``uri`` under a temporary name, then rename; a concurrent upload of the
    same content that lands first wins, and ours is dropped. True when ours landed."""
    tmp = f"{uri}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        with open(local, "rb") as src, fs.open_output(tmp) as dst:
            shutil.copyfileobj(src, dst, chunk)
        if fs.exists(uri):  # someone uploaded the same hash meanwhile
            fs.delete(tmp)
            return False
        try:
            fs.move(tmp, uri)
        except ANY_ERROR:  # HDFS will not rename over a file: one that landed since the check above
            if not fs.exists(uri):
                raise
            fs.delete(tmp)
            return False
        return True
    except BaseException:
        try:
            fs.delete(tmp)
        except ANY_ERROR:  # clean-up must not hide the real error
            pass
        raise


# -- Spark's own Python libraries -------------------------------------------------------------

# Spark's YARN client ships pyspark.zip and py4j's zip with every Python application, uploading them from
# SPARK_HOME into the application's staging folder each time (one HDFS file create and close apiece, about 0.4 s
# per submission on the one-machine cluster) unless this variable names copies already on the cluster.
PYSPARK_ARCHIVES_ENV = "PYSPARK_ARCHIVES_PATH"
SPARK_LIBS_FOLDER = "spark-python"  # inside yarn.env_cache: <sha256 of the file>/<its name>


def spark_python_libs(spark_submit: str) -> list[str]:
    """The pyspark and py4j zips Spark's YARN client would upload, from the SPARK_HOME of ``spark_submit``;
    [] when that SPARK_HOME does not have them where Spark's own client looks (Spark then finds its own)."""
    lib = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(spark_submit))), "python", "lib")
    py4j = sorted(n for n in os.listdir(lib) if re.fullmatch(r"py4j-.+-src\.zip", n)) if os.path.isdir(lib) else []
    zips = [os.path.join(lib, "pyspark.zip"), *(os.path.join(lib, n) for n in py4j[-1:])]
    return zips if len(zips) == 2 and all(os.path.isfile(z) for z in zips) else []


def ensure_spark_python_libs(env_cache: str, libs: Sequence[str]) -> list[str]:
    """Each of ``libs`` copied once into ``env_cache`` under its content's SHA-256; their URIs, in order.

    A copy lands by rename (:func:`upload_once`: two submissions at once keep one). It is read back and hashed
    before every reuse (3 MB: what shipping it would have written), because every container runs it: one that
    does not hold the bytes its name says (written there by something else) is replaced."""
    uris = []
    for local in libs:
        digest = file_sha256(local)
        uri = fs.join(env_cache, SPARK_LIBS_FOLDER, digest[:32], os.path.basename(local))
        if fs.exists(uri):
            if hashlib.sha256(fs.read_bytes(uri)).hexdigest() == digest:
                uris.append(uri)
                continue
            fs.delete(uri)
        upload_once(local, uri)
        uris.append(uri)
    return uris
