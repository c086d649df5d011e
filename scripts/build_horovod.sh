#!/usr/bin/env bash
# Build Horovod 0.28.1 from its PyPI sdist against the TensorFlow installed in
# the current Python environment, apply the project's patches (scripts/patches/*.patch,
# in file-name order), cache the wheel, and install it.
#
# Usage: scripts/build_horovod.sh PYTHON
#
# The wheel is cached under ${HVDTRAIN_CACHE:-~/.cache/hvdtrain}/wheels/<key>/,
# where <key> hashes everything the wheel depends on (Horovod version, every
# patch's diff, TensorFlow version, Python ABI, GPU operations). A second set-up
# with the same key installs the cached wheel and does not rebuild. A patch's
# DEP-3 header (docs/horovod-patches.md) is not in the key: patch(1) skips it.
#
# Environment:
#   HOROVOD_GPU_OPERATIONS=NCCL   build NCCL ops for GPU clusters (needs CUDA
#                                 and NCCL on the build host; default: CPU, Gloo)
#   HVDTRAIN_CACHE                cache root (default ~/.cache/hvdtrain)
set -euo pipefail

PY=${1:?usage: build_horovod.sh PYTHON}
HOROVOD_VERSION=0.28.1
HERE=$(cd "$(dirname "$0")" && pwd)
# Applied in this (file-name) order; the diff of each goes into the cache key.
PATCHES=("$HERE"/patches/*.patch)
[ -f "${PATCHES[0]}" ] || { echo "[horovod] error: no patches in $HERE/patches" >&2; exit 1; }
CACHE=${HVDTRAIN_CACHE:-$HOME/.cache/hvdtrain}

say() { echo "[horovod] $*"; }
die() { echo "[horovod] error: $*" >&2; exit 1; }
# What patch(1) applies: the lines from the first "diff " or "--- " on. The DEP-3
# header above them is documentation; editing it changes no wheel, so not the key.
diff_part() { awk '/^(diff |--- )/ { found = 1 } found' "$1"; }

check_build() {
  # horovodrun --check-build lists the frameworks and controllers built in.
  local out
  out=$("$(dirname "$PY")/horovodrun" --check-build 2>&1) || die "horovodrun --check-build failed: $out"
  echo "$out" | grep -q '\[X\] TensorFlow' || die "Horovod was built without TensorFlow:
$out"
  echo "$out" | grep -q '\[X\] Gloo' || die "Horovod was built without Gloo:
$out"
  if [ -n "${HOROVOD_GPU_OPERATIONS:-}" ]; then
    echo "$out" | grep -q '\[X\] NCCL' || die "HOROVOD_GPU_OPERATIONS=$HOROVOD_GPU_OPERATIONS but Horovod has no NCCL:
$out"
  fi
}

TF_VERSION=$("$PY" -c 'import importlib.metadata as m
for d in ("tensorflow", "tensorflow-cpu"):
    try:
        print(m.version(d)); break
    except m.PackageNotFoundError:
        pass' 2>/dev/null) || true
[ -n "$TF_VERSION" ] || die "TensorFlow is not installed in $PY; install the project first (pip install -e .)"
PY_TAG=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
KEY=$( { echo "$HOROVOD_VERSION $TF_VERSION $PY_TAG gpu=${HOROVOD_GPU_OPERATIONS:-none}"
        for p in "${PATCHES[@]}"; do basename "$p"; diff_part "$p"; done; } | sha256sum | cut -c1-16)
WHEEL_DIR="$CACHE/wheels/horovod-$HOROVOD_VERSION-$KEY"

# The environment remembers which build it has, so a re-run is a no-op.
MARKER="$("$PY" -c 'import sys; print(sys.prefix)')/.hvdtrain-horovod-build"
if [ "$(cat "$MARKER" 2>/dev/null)" = "$KEY" ] && "$PY" -c 'import horovod.tensorflow' 2>/dev/null; then
  say "Horovod $HOROVOD_VERSION already installed (build $KEY)"
  check_build
  exit 0
fi

WHEEL=$(ls "$WHEEL_DIR"/horovod-*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$WHEEL" ]; then
  say "building Horovod $HOROVOD_VERSION from sdist for TensorFlow $TF_VERSION ($PY_TAG, key $KEY); takes about 3 minutes on 2 cores"
  BUILD=$(mktemp -d)
  trap 'rm -rf "$BUILD"' EXIT
  "$PY" -m pip download --quiet --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$BUILD" \
    || die "could not download the horovod==$HOROVOD_VERSION sdist from PyPI"
  tar -xzf "$BUILD/horovod-$HOROVOD_VERSION.tar.gz" -C "$BUILD"
  for p in "${PATCHES[@]}"; do
    (cd "$BUILD/horovod-$HOROVOD_VERSION" && patch -p1 --forward --quiet < "$p") \
      || die "the patch $p does not apply to horovod $HOROVOD_VERSION"
  done
  export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1
  export HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1
  # gloo's cmake_minimum_required(2.8.12) is rejected by CMake 4 without this.
  export CMAKE_POLICY_VERSION_MINIMUM=3.5
  export MAKEFLAGS="-j$(nproc)"
  "$PY" -m pip wheel --no-build-isolation --no-deps -w "$BUILD/dist" "$BUILD/horovod-$HOROVOD_VERSION" \
    > "$BUILD/build.log" 2>&1 || { tail -n 40 "$BUILD/build.log" >&2; die "Horovod build failed (full log above was $BUILD/build.log)"; }
  mkdir -p "$CACHE/wheels"
  # Publish the cache entry atomically so a concurrent set-up never sees half a wheel.
  TMP_DIR=$(mktemp -d "$CACHE/wheels/.tmp-XXXXXX")
  cp "$BUILD"/dist/horovod-*.whl "$TMP_DIR/"
  rm -rf "$WHEEL_DIR" && mv "$TMP_DIR" "$WHEEL_DIR"
  WHEEL=$(ls "$WHEEL_DIR"/horovod-*.whl | head -n 1)
  say "cached $WHEEL"
else
  say "using cached wheel $WHEEL (no rebuild)"
fi

"$PY" -m pip install --quiet --force-reinstall --no-deps "$WHEEL"
"$PY" -m pip install --quiet "cloudpickle" "psutil" "packaging" "cffi>=1.4.0"
echo "$KEY" > "$MARKER"
check_build
say "Horovod $HOROVOD_VERSION ready: TensorFlow and Gloo built in"
