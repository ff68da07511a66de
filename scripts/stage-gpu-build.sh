#!/usr/bin/env bash
# Copies what the device-machine scripts run out of a build made here into build-gpu/ (git-ignored;
# carried to the GPU machine, whose carried tree is capped at 64 MiB): the test binaries, the tools
# and benchmarks, the libraries the SASS check reads, the PyTorch extension when built, and the
# commit and NCCL release stamps. Host debug symbols are stripped (the CUDA fatbins stay).
# Usage: scripts/stage-gpu-build.sh [build-dir [python-build-dir]]   then carry build-gpu.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="${1:-$root/build}"
python_build="${2:-$root/build-python}"
stage="$root/build-gpu"
rm -rf "$stage"
mkdir -p "$stage/tests"
cp "$build"/tests/test_gpu_* "$stage/tests/"  # the host-only tests run in CI

for f in caracal caracal-bench caracal-soak caracal_transfer_bench caracal_gemm_bench libcaracal_kernels.a \
         libcaracal_gemm.a libcaracal_transfer.a NCCL_VERSION; do
  cp "$build/$f" "$stage/"
done
[ -f "$python_build/python/libcaracal_torch.so" ] && cp "$python_build/python/libcaracal_torch.so" "$stage/"
git -C "$root" rev-parse --short HEAD >"$stage/COMMIT"
git -C "$root" diff --quiet HEAD || echo "$(cat "$stage/COMMIT")+dirty" >"$stage/COMMIT"
find "$stage" -maxdepth 2 -type f -perm -u+x ! -name '*.so' -exec strip --strip-debug {} + 2>/dev/null || true
du -sh "$stage"
