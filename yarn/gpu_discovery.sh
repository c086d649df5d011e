#!/usr/bin/env bash
# Spark GPU discovery script, shipped with YARN jobs (--files) and named by
# spark.executor.resource.gpu.discoveryScript=./gpu_discovery.sh.
# Prints the GPUs this container may use as Spark's resource JSON:
#   {"name": "gpu", "addresses": ["0", "1"]}
# YARN's GPU isolation (yarn.io/gpu) decides which devices the container sees.
set -euo pipefail

if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "gpu_discovery.sh: nvidia-smi not found on $(hostname); GPU executors need the NVIDIA driver" >&2
  exit 1
fi

addresses=$(nvidia-smi --query-gpu=index --format=csv,noheader | tr -d ' ' | paste -sd, - | sed 's/,/","/g')
if [ -n "$addresses" ]; then
  echo "{\"name\": \"gpu\", \"addresses\": [\"${addresses}\"]}"
else
  echo "{\"name\": \"gpu\", \"addresses\": []}"
fi
