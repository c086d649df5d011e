"""``hvdtrain env check``: what this host has, and what it lacks, for each path.

Each check returns a :class:`Check` naming what was looked at, what was found
and, when something is wrong, the command that fixes it. Checks marked
``required`` are what the local path needs (Spark ETL, ``horovodrun``, a local
``yarn.submit`` rehearsal); the others only matter on a Hadoop cluster (HDFS
through libhdfs, Kerberos, YARN submission) and do not fail the exit code.

Every probe takes its collaborators as arguments (the environment, ``which``,
a command runner, the Horovod build facts), so tests drive the failure paths
with fakes. Horovod's build is probed in a child process
(:func:`probe_horovod_build`): importing ``horovod.tensorflow`` pulls in
TensorFlow, and :mod:`hvdtrain.runtime.distributed` stays the only in-process owner of
Horovod.
"""
from __future__ import annotations

import datetime
import glob
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

from hvdtrain.core.errors import EnvironmentProblem
from hvdtrain.hadoop import kerberos

Which = Callable[[str], Optional[str]]


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    output: str  # stdout and stderr together


Runner = Callable[[Sequence[str]], CommandResult]


def run_command(cmd: Sequence[str], timeout: float = 120.0, env: Optional[Mapping[str, str]] = None) -> CommandResult:
    """Run a short command; a missing binary or a timeout is a failed result, not an exception."""
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout,
                              env=dict(env) if env is not None else None)
    except FileNotFoundError as exc:
        return CommandResult(127, str(exc))
    except OSError as exc:  # found but not runnable (permissions, a bad interpreter line)
        return CommandResult(126, f"{cmd[0]}: {exc}")
    except subprocess.TimeoutExpired:
        return CommandResult(124, f"{cmd[0]} did not answer within {timeout:.0f}s")
    return CommandResult(proc.returncode, (proc.stdout or "") + (proc.stderr or ""))


@dataclass(frozen=True)
class Check:
    """One line of the report."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    scope: str = "local"  # "local": the local path needs it; "cluster" or "gpu": only those do

    @property
    def required(self) -> bool:
        return self.scope == "local"

    def line(self) -> str:
        mark = "✓" if self.ok else "✗"
        scope = "" if self.required else f" ({self.scope})"
        text = f"{mark} {self.name}{scope}: {self.detail}"
        return text if self.ok or not self.fix else f"{text}\n    fix: {self.fix}"


# -- Horovod build facts --------------------------------------------------------------

@dataclass(frozen=True)
class HorovodBuild:
    """What ``horovodrun --check-build`` would report, as data."""

    version: Optional[str] = None
    tensorflow: bool = False
    gloo: bool = False
    nccl: bool = False
    mpi: bool = False
    cuda: bool = False
    error: Optional[str] = None  # why horovod or horovod.tensorflow did not import

    def describe(self) -> str:
        if self.version is None:
            return f"Horovod not importable ({self.error})"
        yes = lambda flag: "yes" if flag else "no"  # noqa: E731
        return (f"Horovod {self.version}: TensorFlow {yes(self.tensorflow)}, Gloo {yes(self.gloo)}, "
                f"NCCL {yes(self.nccl)}, MPI {yes(self.mpi)}")


_PROBE = r"""
import json
out = {}
try:
    import horovod
    out["version"] = horovod.__version__
    import horovod.tensorflow as hvd
    out.update(tensorflow=True, gloo=bool(hvd.gloo_built()), nccl=bool(hvd.nccl_built()),
               mpi=bool(hvd.mpi_built()), cuda=bool(hvd.cuda_built()))
except Exception as exc:
    out["error"] = "%s: %s" % (type(exc).__name__, exc)
print("HVDTRAIN_HOROVOD_BUILD " + json.dumps(out))
"""
_PROBE_MARK = "HVDTRAIN_HOROVOD_BUILD "


def parse_build_probe(output: str) -> HorovodBuild:
    """The facts from the probe's output line (pure)."""
    for line in output.splitlines():
        if line.startswith(_PROBE_MARK):
            data = json.loads(line[len(_PROBE_MARK):])
            return HorovodBuild(**{k: data[k] for k in data if k in HorovodBuild.__dataclass_fields__})
    tail = output.strip().splitlines()[-1:] or ["no output"]
    return HorovodBuild(error=f"the build probe failed: {tail[0]}")


def cache_root() -> str:
    """hvdtrain's per-user cache folder ($HVDTRAIN_CACHE, else ~/.cache/hvdtrain)."""
    return os.environ.get("HVDTRAIN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "hvdtrain")


BUILD_CACHE = "horovod-build.json"  # in cache_root(): probe answers by build_fingerprint()
# What the probe's answer depends on: Horovod's TensorFlow extension and the TensorFlow library it was built
# against. A reinstall of either (another wheel, another version) changes their size or mtime.
_FINGERPRINT_FILES = (("horovod", "tensorflow/mpi_lib*.so"), ("tensorflow", "libtensorflow_framework.so*"))


def build_fingerprint(python: str = sys.executable) -> Optional[str]:
    """A hash of this interpreter's Horovod and TensorFlow libraries (path, size, mtime), read from the files
    without importing either; None for another interpreter or when a library is not found."""
    if python != sys.executable:
        return None
    parts = [python]
    for package, pattern in _FINGERPRINT_FILES:
        spec = importlib.util.find_spec(package)  # a top-level package: found, not imported
        roots = list(spec.submodule_search_locations or []) if spec is not None else []
        files = sorted(glob.glob(os.path.join(roots[0], pattern))) if roots else []
        if not files:
            return None
        for path in files:
            try:
                st = os.stat(path)
            except OSError:  # a dangling link: no fingerprint, so the probe is asked
                return None
            parts.append(f"{path}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def probe_horovod_build(python: str = sys.executable, run: Optional[Runner] = None,
                        cache_dir: Optional[str] = None) -> HorovodBuild:
    """Ask a child interpreter what its Horovod was built with (about 5 s: it imports TensorFlow). The answer
    is kept in the cache folder by :func:`build_fingerprint`, so an unchanged environment is asked once, not on
    every submission; a failed probe is never kept."""
    fingerprint = build_fingerprint(python)
    path = os.path.join(cache_dir or cache_root(), BUILD_CACHE)
    known = _read_build_cache(path) if fingerprint else {}
    entry = known.get(fingerprint) if fingerprint else None
    if isinstance(entry, dict):
        return HorovodBuild(**{k: v for k, v in entry.items() if k in HorovodBuild.__dataclass_fields__})
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    runner = run or (lambda cmd: run_command(cmd, timeout=180, env=env))
    build = parse_build_probe(runner([python, "-c", _PROBE]).output)
    if fingerprint and build.error is None:
        _write_build_cache(path, {**known, fingerprint: build.__dict__})
    return build


def _read_build_cache(path: str) -> dict:
    try:
        with open(path) as fh:
            doc = json.load(fh)
        return doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):  # none yet, or unreadable: probe
        return {}


def _write_build_cache(path: str, doc: dict) -> None:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(f"{path}.{os.getpid()}.tmp", "w") as fh:
            json.dump(doc, fh)
        os.replace(f"{path}.{os.getpid()}.tmp", path)
    except OSError:  # a read-only home: the next submission probes again
        pass


# -- finding spark-submit -------------------------------------------------------------------

def spark_submit_candidates(env: Mapping[str, str], which: Which, python: str) -> list[str]:
    """Where spark-submit may be, best first.

    $SPARK_HOME (a Spark install chosen on purpose), then the pyspark of ``python``'s environment
    (its ``bin/spark-submit`` finds its own Spark home, and matches the pyspark the driver
    imports), then PATH. The ``spark-submit`` wrapper pip puts beside the interpreter comes last:
    it looks for Spark with whatever ``python3`` is on PATH unless PYSPARK_PYTHON is set.
    """
    out = []
    if env.get("SPARK_HOME"):
        out.append(os.path.join(env["SPARK_HOME"], "bin", "spark-submit"))
    if python == sys.executable:  # this interpreter's pyspark, wherever it is installed (found, not imported)
        spec = importlib.util.find_spec("pyspark")
        if spec is not None and spec.origin:
            out.append(os.path.join(os.path.dirname(spec.origin), "bin", "spark-submit"))
    lib = os.path.join(os.path.dirname(os.path.dirname(python)), "lib")
    out.extend(sorted(glob.glob(os.path.join(lib, "python3*", "site-packages", "pyspark", "bin", "spark-submit"))))
    on_path = which("spark-submit")
    if on_path:
        out.append(on_path)
    out.append(os.path.join(os.path.dirname(python), "spark-submit"))
    return list(dict.fromkeys(out))


def find_spark_submit(env: Mapping[str, str] = os.environ, which: Which = shutil.which,
                      python: str = sys.executable, is_file: Callable[[str], bool] = os.path.isfile) -> str:
    """The spark-submit to use, or EnvironmentProblem naming where it looked."""
    candidates = spark_submit_candidates(env, which, python)
    for path in candidates:
        if is_file(path):
            return path
    raise EnvironmentProblem(
        f"spark-submit not found (looked in {', '.join(candidates)}); install pyspark into this environment "
        "(pip install 'pyspark>=3.5,<4.1') or set SPARK_HOME to a Spark installation")


# -- the checks ---------------------------------------------------------------------------

def parse_java_major(text: str) -> Optional[int]:
    """17 from ``openjdk version "17.0.15"``, 8 from ``java version "1.8.0_292"`` (pure)."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def check_java(which: Which, run: Runner) -> Check:
    fix = "install Java 17: apt-get install openjdk-17-jre-headless (or set JAVA_HOME and put $JAVA_HOME/bin on PATH)"
    java = which("java")
    if java is None:
        return Check("Java", False, "java not found on PATH; Spark needs Java 17", fix)
    result = run([java, "-version"])
    major = parse_java_major(result.output)
    if major is None:
        return Check("Java", False, f"could not read the version from `java -version` ({result.output.strip()[:80]})",
                     fix)
    if major < 17:
        return Check("Java", False, f"Java {major} at {java}; Spark 4 needs Java 17 or newer", fix)
    return Check("Java", True, f"Java {major} at {java}")


def check_spark_submit(env: Mapping[str, str], which: Which, python: str,
                       is_file: Callable[[str], bool]) -> Check:
    try:
        path = find_spark_submit(env, which, python, is_file)
    except EnvironmentProblem as exc:
        return Check("spark-submit", False, str(exc).split(";")[0],
                     "pip install 'pyspark>=3.5,<4.1' into this environment, or set SPARK_HOME")
    return Check("spark-submit", True, path)


def check_horovod(build: HorovodBuild) -> list[Check]:
    rebuild = "rebuild Horovod: make env (scripts/build_horovod.sh); `make check-build` shows what it has"
    if build.version is None:
        return [Check("Horovod", False, f"not importable ({build.error})", rebuild)]
    found = f"Horovod {build.version}"
    return [
        Check("Horovod TensorFlow ops", build.tensorflow,
              f"{found} {'has' if build.tensorflow else 'lacks'} TensorFlow support"
              + ("" if build.tensorflow else f" ({build.error})"),
              f"{rebuild} with HOROVOD_WITH_TENSORFLOW=1"),
        Check("Horovod Gloo", build.gloo, f"Gloo controller {'built' if build.gloo else 'missing'} "
              "(horovodrun --gloo and YARN jobs use it)", f"{rebuild} with HOROVOD_WITH_GLOO=1 (needs CMake)"),
        Check("Horovod NCCL", build.nccl,
              "NCCL built: GPU all-reduce" if build.nccl else "no NCCL: CPU training only (GPU jobs need it)",
              "on a CUDA host with NCCL: HOROVOD_GPU_OPERATIONS=NCCL make env", scope="gpu"),
    ]


def check_hadoop_home(env: Mapping[str, str], is_dir: Callable[[str], bool]) -> Check:
    home = env.get("HADOOP_HOME")
    fix = "export HADOOP_HOME=/path/to/hadoop (the Hadoop client install, e.g. /opt/hadoop or /usr/lib/hadoop)"
    if not home:
        return Check("HADOOP_HOME", False, "not set; hdfs:// paths need the Hadoop client", fix, scope="cluster")
    if not is_dir(home):
        return Check("HADOOP_HOME", False, f"{home} is not a directory", fix, scope="cluster")
    return Check("HADOOP_HOME", True, home, scope="cluster")


def check_libhdfs(env: Mapping[str, str], is_file: Callable[[str], bool]) -> Check:
    folders = [d for d in (env.get("ARROW_LIBHDFS_DIR"),
                           os.path.join(env["HADOOP_HOME"], "lib", "native") if env.get("HADOOP_HOME") else None) if d]
    for folder in folders:
        path = os.path.join(folder, "libhdfs.so")
        if is_file(path):
            return Check("libhdfs", True, path, scope="cluster")
    where = (f"not found in {' or '.join(folders)}" if folders
             else "not looked for: neither ARROW_LIBHDFS_DIR nor HADOOP_HOME is set")
    return Check("libhdfs", False, f"libhdfs.so {where}",
                 "install the Hadoop native libraries, or export ARROW_LIBHDFS_DIR=/folder/with/libhdfs.so",
                 scope="cluster")


def check_classpath(env: Mapping[str, str]) -> Check:
    fix = "export CLASSPATH=$(hadoop classpath --glob)"
    entries = [e for e in env.get("CLASSPATH", "").split(os.pathsep) if e]
    if not entries:
        return Check("CLASSPATH", False, "not set; libhdfs needs the Hadoop jars on it", fix, scope="cluster")
    if not any("hadoop" in os.path.basename(e) and e.endswith(".jar") for e in entries):
        wildcard = any(e.endswith("*") for e in entries)
        detail = ("lists folder wildcards, which libhdfs (JNI) does not expand" if wildcard
                  else "has no hadoop-*.jar")
        return Check("CLASSPATH", False, detail, fix, scope="cluster")
    jars = sum(e.endswith(".jar") for e in entries)
    return Check("CLASSPATH", True, f"{jars} jars including Hadoop's", scope="cluster")


def check_hadoop_conf(env: Mapping[str, str]) -> Check:
    conf = env.get("HADOOP_CONF_DIR") or env.get("YARN_CONF_DIR")
    if not conf:
        return Check("HADOOP_CONF_DIR", False, "not set; spark-submit --master yarn needs the cluster's client "
                     "configs", "export HADOOP_CONF_DIR=/etc/hadoop/conf", scope="cluster")
    return Check("HADOOP_CONF_DIR", True, conf, scope="cluster")


def check_kerberos(which: Which, run: Runner) -> Check:
    klist = which("klist")
    if klist is None:
        return Check("Kerberos ticket", True, "klist not found: skipped (only Kerberized clusters need a ticket)",
                     scope="cluster")
    if run([klist, "-s"]).returncode == 0:
        listing = run([klist])
        ticket = kerberos.parse_klist(listing.output) if listing.returncode == 0 else None
        detail = kerberos.describe(ticket, datetime.datetime.now()) if ticket else "valid ticket in the credential cache"
        return Check("Kerberos ticket", True, detail, scope="cluster")
    return Check("Kerberos ticket", False, "no valid ticket (klist -s failed)",
                 "kinit user@REALM, or kinit -kt user.keytab user@REALM; YARN jobs can pass --principal/--keytab",
                 scope="cluster")


def check(env: Optional[Mapping[str, str]] = None, which: Which = shutil.which, run: Runner = run_command,
          build: Optional[HorovodBuild] = None, python: str = sys.executable,
          is_file: Callable[[str], bool] = os.path.isfile,
          is_dir: Callable[[str], bool] = os.path.isdir) -> list[Check]:
    """Every check, in the order printed. ``build`` defaults to probing this environment's Horovod."""
    env = os.environ if env is None else env
    build = build if build is not None else probe_horovod_build(python)
    return [
        check_java(which, run),
        check_spark_submit(env, which, python, is_file),
        *check_horovod(build),
        check_hadoop_home(env, is_dir),
        check_libhdfs(env, is_file),
        check_classpath(env),
        check_hadoop_conf(env),
        check_kerberos(which, run),
    ]


def exit_code(checks: Sequence[Check]) -> int:
    """0 when everything the local path needs is there."""
    return 0 if all(c.ok for c in checks if c.required) else 1


def render(checks: Sequence[Check]) -> str:
    lines = [c.line() for c in checks]
    for scope, title in (("local", "local path"), ("cluster", "cluster path"), ("gpu", "GPU training")):
        missing = [c.name for c in checks if c.scope == scope and not c.ok]
        lines.append(f"{title}: {'missing ' + ', '.join(missing) if missing else 'ready'}")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Print each check with ✓/✗ and its fix; 0 when the local path is ready."""
    checks = check()
    print(render(checks), flush=True)
    return exit_code(checks)


if __name__ == "__main__":
    sys.exit(main())
