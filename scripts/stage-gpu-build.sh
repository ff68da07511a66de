#!/usr/bin/env bash
# Copies what the device-machine scripts run out of a build made here into build-gpu/ (git-ignored;
# carried to the GPU machine, whose carried tree is capped at 64 MiB): the test binaries, the tools
# and benchmarks, the libraries the SASS check reads, the PyTorch extension when built, and the
# commit and NCCL release stamps. Host debug symbols are stripped (the CUDA fatbins stay).
# Usage: [PACK=1] scripts/stage-gpu-build.sh [build-dir [python-build-dir]]   then carry build-gpu.
# With PACK=1 it also packs the folder into build-pack/build-gpu.tar.xz (~7 MB against ~75 MB: every
# test binary, benchmark and the extension fit the device tool's 64 MiB with room for an old build
# beside them): carry build-pack instead and run `tar -xJf build-pack/build-gpu.tar.xz` there first.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="${1:-$root/build}"
python_build="${2:-$root/build-python}"
stage="$root/build-gpu"
rm -rf "$stage"
mkdir -p "$stage/tests"
cp "$build"/tests/test_gpu_* "$stage/tests/"  # the host-only tests run in CI

for f in caracal caracal-bench caracal-soak caracal_transfer_bench caracal_gemm_bench caracal_gather_bench \
         libcaracal_gemm.a libcaracal_transfer.a NCCL_VERSION; do
  cp "$build/$f" "$stage/"
done
torch_ext="$python_build/python/libcaracal_torch.so"
if [ -f "$torch_ext" ]; then
  cp "$torch_ext" "$stage/"
  # Built by its own tree: say so when it is older than the kernels staged beside it.
  [ "$torch_ext" -nt "$build/libcaracal_gemm.a" ] || echo "stage-gpu-build: warning: $torch_ext is older than $build/libcaracal_gemm.a (rebuild it: cd $python_build && ninja caracal_torch)" >&2
fi
git -C "$root" rev-parse --short HEAD >"$stage/COMMIT"
git -C "$root" diff --quiet HEAD || echo "$(cat "$stage/COMMIT")+dirty" >"$stage/COMMIT"
find "$stage" -maxdepth 2 -type f -perm -u+x ! -name '*.so' -exec strip --strip-debug {} + 2>/dev/null || true
du -sh "$stage"
if [ "${PACK:-0}" = 1 ]; then
  mkdir -p "$root/build-pack"
  tar -C "$root" -cf - "$(basename "$stage")" | xz -T0 -6 >"$root/build-pack/build-gpu.tar.xz"
  du -sh "$root/build-pack/build-gpu.tar.xz"
fi
