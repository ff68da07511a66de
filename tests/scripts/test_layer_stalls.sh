#!/usr/bin/env bash
# scripts/layer-stalls.sh's own logic, with a stub ncu (no GPU): ncu samples the first matching
# launch of one profiled step of the layer (BENCH_ARGS and PROFILE_PATH passed to caracal-bench)
# with the source counters; the SASS CSV and the digest land in $OUT (the report in $WORK); the
# digest sums the stall reasons over the kernel and lists the instructions holding the most
# samples; a failing ncu, or one that matched no launch (no report), makes the exit status 1.
source "$(dirname "$0")/script_test_lib.sh"

mkdir -p "$work/bin" "$work/build" "$work/out"
echo build-commit >"$work/build/COMMIT"
echo 2.28.9 >"$work/build/NCCL_VERSION"
stub_ncu_sampling "caracal::fused::fused_forward_kernel<X>"
export STUB_ARGS="$work/args"

expect_status 0 "" env OUT="$work/out" WORK="$work/rep" BENCH_ARGS="--model qwen3-30b-a3b --precision fp8" \
  bash "$root/scripts/layer-stalls.sh" "$work/build" 'fused_forward_kernel'
grep -q -- "--profile-from-start off --clock-control none -k regex:fused_forward_kernel --launch-count 1 --section SourceCounters" \
  "$work/args" || fail "ncu samples the first matching launch of the profiled step"
grep -q -- "--model qwen3-30b-a3b --precision fp8 --no-validate --profile-step --profile-path fused" "$work/args" ||
  fail "the case and the fused layer are passed to the bench"
[ -f "$work/out/stalls-fused_forward_kernel.sass.csv" ] || fail "the SASS CSV in OUT"
[ -f "$work/out/stalls-fused_forward_kernel.txt" ] || fail "the digest in OUT"
[ -f "$work/rep/stalls-fused_forward_kernel.ncu-rep" ] || fail "the report in WORK"
grep -q "build-commit" <<<"$out" || fail "the header names the build"
grep -q "Duration .* 1.03" <<<"$out" || fail "the kernel's duration"
grep -q "warp samples: 100 over 3 SASS instructions" <<<"$out" || fail "the samples counted"
grep -q "by reason: barrier 50.0%, long_sb 20.0%$" <<<"$out" || fail "the reasons, largest first"
grep -Eq "1 +50 +50.0% +WARPGROUP.DEPBAR.LE gsb0, 0x1 .*barrier 50" <<<"$out" || fail "the instruction rows"

: >"$work/args"
expect_status 0 "" env OUT="$work/out" WORK="$work/rep" PROFILE_PATH=v1 bash "$root/scripts/layer-stalls.sh" "$work/build" combine
grep -q -- "--model deepseek-v3 --experts 32 --ep 1 --tokens 4096 --no-validate --profile-step --profile-path v1" \
  "$work/args" || fail "the default case, and PROFILE_PATH picks the layer"

out=$(STUB_NO_LAUNCH=1 OUT="$work/out" WORK="$work/rep2" bash "$root/scripts/layer-stalls.sh" "$work/build" nothing 2>&1)
[ $? -eq 1 ] || fail "no matching launch: exit status 1"
grep -q "FAILED: no launch matched 'nothing'" <<<"$out" || fail "no matching launch is reported"
out=$(STUB_FAIL=1 OUT="$work/out" WORK="$work/rep" bash "$root/scripts/layer-stalls.sh" "$work/build" X 2>&1)
[ $? -eq 1 ] || fail "a failing ncu: exit status 1"
grep -q "FAILED: ncu" <<<"$out" || fail "a failing ncu is reported"
finish test_layer_stalls
