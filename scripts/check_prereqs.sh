#!/usr/bin/env bash
# Stop early, with one line each, when the machine lacks what the set-up needs.
# Usage: scripts/check_prereqs.sh PYTHON
set -u
PY=${1:-python3}
fail=0
miss() { echo "missing prerequisite: $*" >&2; fail=1; }

if ! command -v "$PY" >/dev/null 2>&1; then
  miss "$PY not found; install Python 3.10-3.12 (e.g. apt-get install python3.11 python3.11-venv) or run make PYTHON=/path/to/python3.11"
elif ! "$PY" -c 'import sys; sys.exit(0 if (3, 10) <= sys.version_info[:2] <= (3, 12) else 1)'; then
  miss "Python $("$PY" -c 'import platform; print(platform.python_version())') at $(command -v "$PY") is unsupported; TensorFlow 2.21 + Horovod need 3.10-3.12: run make PYTHON=/path/to/python3.11"
elif ! "$PY" -c 'import venv, ensurepip' 2>/dev/null; then
  miss "$PY has no venv/ensurepip module; install it (e.g. apt-get install python3-venv)"
fi
if ! command -v java >/dev/null 2>&1; then
  miss "java not found; Spark needs Java 17: apt-get install openjdk-17-jre-headless (or set PATH/JAVA_HOME to a JDK 17)"
else
  jv=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n 1)
  if [ -z "$jv" ] || [ "$jv" -lt 17 ]; then
    miss "java on PATH is version '${jv:-unknown}'; Spark 4 needs Java 17 or newer: apt-get install openjdk-17-jre-headless"
  fi
fi
command -v "${CXX:-g++}" >/dev/null 2>&1 || command -v c++ >/dev/null 2>&1 \
  || miss "no C++ compiler (g++); Horovod is built from source: apt-get install g++"
command -v "${CC:-gcc}" >/dev/null 2>&1 || command -v cc >/dev/null 2>&1 \
  || miss "no C compiler (gcc); the TFRecord writer's loops (native/) are compiled: apt-get install gcc"
command -v cmake >/dev/null 2>&1 \
  || miss "cmake not found; Horovod's build needs CMake >= 3.13: apt-get install cmake (or pip install 'cmake<4')"
command -v patch >/dev/null 2>&1 || miss "patch not found; the Horovod build applies a patch: apt-get install patch"
exit $fail
