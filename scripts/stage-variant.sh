#!/usr/bin/env bash
# Packs some binaries of a build made here as one named variant for a device call beside a staged
# build-gpu/ (scripts/stage-gpu-build.sh): build-var/NAME/ (git-ignored) holds the tools asked for,
# the test binaries asked for under tests/, NCCL_VERSION and COMMIT (the short hash, +dirty when the
# tree has uncommitted changes), host debug symbols stripped; then build-pack/build-NAME.tar.xz
# (carry build-pack; on the device machine `tar xJf build-pack/build-NAME.tar.xz` first).
# Usage: scripts/stage-variant.sh NAME [BINARY...]
#   BINARY: a tool of the build folder (caracal, caracal-bench, caracal_gemm_bench, ...) or a GPU test
#   binary (test_gpu_*); none: caracal, caracal-bench and caracal_gemm_bench.
# BUILD (default build/) names the build folder. Exit status 1, naming it, when a binary is missing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
name="${1:?usage: scripts/stage-variant.sh NAME [BINARY...]}"
shift
case "$name" in
  *[!A-Za-z0-9_.-]* | .* ) echo "stage-variant: NAME must be letters, digits, '_', '-' or '.' (not first), got '$name'" >&2; exit 2 ;;
esac
build="${BUILD:-$root/build}"
[ $# -gt 0 ] || set -- caracal caracal-bench caracal_gemm_bench
stage="$root/build-var/$name"
rm -rf "$stage"
mkdir -p "$stage/tests"
for binary in "$@"; do
  case "$binary" in
    test_gpu_*) from="$build/tests/$binary" to="$stage/tests/$binary" ;;
    *) from="$build/$binary" to="$stage/$binary" ;;
  esac
  if [ ! -f "$from" ]; then
    echo "stage-variant: $from is missing (build it first: cmake --build $build --target $binary)" >&2
    exit 1
  fi
  cp "$from" "$to"
done
[ -f "$build/NCCL_VERSION" ] && cp "$build/NCCL_VERSION" "$stage/"
commit=$(git -C "$root" rev-parse --short HEAD)
git -C "$root" diff --quiet HEAD -- . ':(exclude)docs' || commit="$commit+dirty"
echo "$commit" >"$stage/COMMIT"
find "$stage" -type f -perm -u+x -exec strip --strip-debug {} + 2>/dev/null || true
mkdir -p "$root/build-pack"
tar -C "$root" -cf - "build-var/$name" | xz -T0 -6 >"$root/build-pack/build-$name.tar.xz"
echo "build-var/$name ($commit): $(cd "$stage" && find . -type f | sed 's|^\./||' | sort | tr '\n' ' ')"
echo "packed: build-pack/build-$name.tar.xz ($(du -h "$root/build-pack/build-$name.tar.xz" | cut -f1))"
