#!/usr/bin/env bash
# Builds the "OLD" side of scripts/ab-check.sh from a git revision, without touching build/ or the
# working tree: a worktree of REV in build-ab-src/ (git-ignored, kept between runs so that ccache
# and ninja reuse its objects), its own build folder there, and caracal-bench, caracal-soak,
# caracal_gemm_bench and COMMIT packed into build-ab/old.tar.xz (~4 MB: the carried tree is capped
# at 64 MiB, beside a staged build-gpu/).
# Usage: scripts/stage-ab-old.sh REV     then carry build-ab and, on the device machine:
#   mkdir -p /tmp/old && tar xJf build-ab/old.tar.xz -C /tmp/old && scripts/ab-check.sh /tmp/old build-gpu
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rev="${1:?usage: scripts/stage-ab-old.sh REV}"
commit=$(git -C "$root" rev-parse --short "$rev^{commit}")
src="$root/build-ab-src"
if [ -d "$src" ]; then
  git -C "$src" checkout -q --detach "$commit"
else
  git -C "$root" worktree add -q --detach "$src" "$commit"
fi
export PATH="/usr/local/cuda/bin:$PATH"
# CUTLASS and the other dependencies as the main tree has them (scripts/install-deps.sh puts them in .deps/).
[ -e "$src/.deps" ] || ln -s "$root/.deps" "$src/.deps"
if [ ! -f "$src/build/build.ninja" ]; then
  cmake -S "$src" -B "$src/build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
jobs=$(( $(nproc) < 4 ? $(nproc) : 4 ))
cmake --build "$src/build" -j "$jobs" --target caracal-bench caracal-soak caracal_gemm_bench
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp "$src/build/caracal-bench" "$src/build/caracal-soak" "$src/build/caracal_gemm_bench" "$stage/"
strip --strip-debug "$stage"/caracal* 2>/dev/null || true
echo "$commit" >"$stage/COMMIT"
mkdir -p "$root/build-ab"
tar cJf "$root/build-ab/old.tar.xz" -C "$stage" .
echo "stage-ab-old: $commit -> build-ab/old.tar.xz ($(du -h "$root/build-ab/old.tar.xz" | cut -f1))"
