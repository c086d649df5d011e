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
bash "$HERE/build_horovod.sh" "$VENV/bin/python"
echo "[env] ready: $VENV"
