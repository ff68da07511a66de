#!/usr/bin/env bash
# Installs the dependencies, builds, and runs every test (CTest + GoogleTest).
# GPU tests run where a Hopper GPU is present and are reported as skipped elsewhere.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="${CARACAL_BUILD_DIR:-$root/build}"
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "test: no GPU on this machine: GPU tests will be reported as skipped"
fi
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" "$@"
