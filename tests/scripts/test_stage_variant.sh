#!/usr/bin/env bash
# scripts/stage-variant.sh's own logic, on a stub build (no GPU, no real binaries) in a scratch copy
# of the script's folder layout: the binaries asked for land in build-var/NAME (tests under tests/),
# with NCCL_VERSION and COMMIT, and in build-pack/build-NAME.tar.xz; the default set; a missing
# binary and a bad name are refused by name.
source "$(dirname "$0")/script_test_lib.sh"

repo="$work/repo"
mkdir -p "$repo/scripts" "$repo/build/tests"
cp "$root/scripts/stage-variant.sh" "$repo/scripts/"
git -C "$repo" init -q && git -C "$repo" -c user.email=t@t -c user.name=t commit -q --allow-empty -m stub
for f in caracal caracal-bench caracal_gemm_bench tests/test_gpu_stub; do
  printf '#!/bin/sh\necho %s\n' "$f" >"$repo/build/$f"
  chmod +x "$repo/build/$f"
done
echo 2.28.9 >"$repo/build/NCCL_VERSION"
commit=$(git -C "$repo" rev-parse --short HEAD)

out=$(bash "$repo/scripts/stage-variant.sh" v1 caracal-bench test_gpu_stub 2>&1) || fail "named binaries: exit $?"$'\n'"$out"
[ -x "$repo/build-var/v1/caracal-bench" ] || fail "caracal-bench not staged"$'\n'"$out"
[ -x "$repo/build-var/v1/tests/test_gpu_stub" ] || fail "the test binary not under tests/"$'\n'"$out"
[ ! -e "$repo/build-var/v1/caracal" ] || fail "caracal staged though not asked for"
[ "$(cat "$repo/build-var/v1/COMMIT")" = "$commit" ] || fail "COMMIT is not $commit: $(cat "$repo/build-var/v1/COMMIT")"
[ "$(cat "$repo/build-var/v1/NCCL_VERSION")" = 2.28.9 ] || fail "NCCL_VERSION not staged"
listed=$(tar tJf "$repo/build-pack/build-v1.tar.xz" 2>&1) || fail "no pack: $listed"
grep -qx "build-var/v1/tests/test_gpu_stub" <<<"$listed" || fail "the pack lacks the test binary"$'\n'"$listed"

out=$(bash "$repo/scripts/stage-variant.sh" v2 2>&1) || fail "default set: exit $?"$'\n'"$out"
for f in caracal caracal-bench caracal_gemm_bench; do
  [ -x "$repo/build-var/v2/$f" ] || fail "default set: $f not staged"$'\n'"$out"
done

echo change >"$repo/scripts/extra"
git -C "$repo" add scripts/extra
out=$(bash "$repo/scripts/stage-variant.sh" v3 caracal 2>&1) || fail "dirty tree: exit $?"$'\n'"$out"
[ "$(cat "$repo/build-var/v3/COMMIT")" = "$commit+dirty" ] || fail "a dirty tree's COMMIT: $(cat "$repo/build-var/v3/COMMIT")"

run_and_expect "a missing binary" 1 "stage-variant: $repo/build/tests/test_gpu_none is missing (build it first: cmake --build $repo/build --target test_gpu_none)" "" \
  bash "$repo/scripts/stage-variant.sh" v4 test_gpu_none
run_and_expect "a bad name" 2 "stage-variant: NAME must be letters, digits, '_', '-' or '.' (not first), got 'a/b'" "" \
  bash "$repo/scripts/stage-variant.sh" a/b
finish test_stage_variant
