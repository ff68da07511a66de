#!/usr/bin/env bash
# Configures and builds Caracal (Release, Ninja, ccache) into build/ (or $CARACAL_BUILD_DIR).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="${CARACAL_BUILD_DIR:-$root/build}"
export PATH="/usr/local/cuda/bin:$PATH"
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
# CUTLASS translation units take ~4 GB each: keep parallelism within the machine's memory.
jobs=$(( $(nproc) < 4 ? $(nproc) : 4 ))
cmake --build "$build" -j "$jobs"
