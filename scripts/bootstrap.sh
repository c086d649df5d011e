#!/usr/bin/env bash
# Create the project environment: check prerequisites, make a venv, install the
# project with its tested dependency ranges, then build (or reuse) Horovod.
# Usage: scripts/bootstrap.sh PYTHON VENV
set -euo pipefail
PY=${1:-python3}
VENV=${2:-.venv}
HERE=$(cd "$(dirname "$0")" && pwd)

bash "$HERE/check_prereqs.sh" "$PY" || { echo "make: fix the prerequisites above and run make again" >&2; exit 1; }
if [ ! -x "$VENV/bin/python" ]; then
  echo "[env] creating $VENV with $("$PY" -c 'import sys; print(sys.executable)')"
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade "pip>=24" "setuptools>=70,<81" wheel
echo "[env] installing hvdtrain and its dependencies (TensorFlow, Spark, MLflow; a few minutes the first time)"
"$VENV/bin/python" -m pip install --quiet -e "$HERE/..[dev]"
# The TFRecord writer's compiled loops (native/): installed, not editable, so a packed YARN environment carries them
echo "[env] building hvdtrain-native (the TFRecord writer's compiled loops)"
"$VENV/bin/python" -m pip install --quiet --no-build-isolation "$HERE/../native"
bash "$HERE/build_horovod.sh" "$VENV/bin/python"
# The one-machine Hadoop's jars (hvdtrain cluster, the hadoop test tier): fetched once by Maven, here rather
# than inside the first test session. Without a JDK and Maven the tier says so itself; nothing else needs them.
if command -v javac > /dev/null && command -v mvn > /dev/null; then
  "$VENV/bin/hvdtrain" cluster fetch \
    || echo "[env] note: the Hadoop minicluster jars could not be fetched (above); hvdtrain cluster up will try again" >&2
fi
echo "[env] ready: $VENV"
