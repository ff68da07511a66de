#!/usr/bin/env bash
# scripts/gemm-stalls.sh's own logic, with a stub ncu (no GPU): ncu samples the matching kernel's
# third launch in caracal_gemm_bench with the source counters; the SASS CSV and the digest land in
# $OUT (the report elsewhere: $OUT's files are few); the digest sums the stall reasons over the
# kernel (the "(Not Issued)" duplicates left out) and lists the instructions holding the most
# samples; a failing ncu makes the exit status 1.
source "$(dirname "$0")/script_test_lib.sh"

mkdir -p "$work/bin" "$work/build" "$work/out"
echo build-commit >"$work/build/COMMIT"
stub_ncu_sampling "caracal::gemm::grouped_gemm_kernel<X>"
export STUB_ARGS="$work/args"

expect_status 0 "" env OUT="$work/out" WORK="$work/rep" bash "$root/scripts/gemm-stalls.sh" "$work/build" 'WeightGradGemm' deepseek-v3/uniform
grep -q -- "-k regex:WeightGradGemm --launch-skip 2 --launch-count 1 --section SourceCounters" "$work/args" ||
  fail "ncu samples the third matching launch"
grep -q -- "--case deepseek-v3/uniform" "$work/args" || fail "the case is passed to the bench"
[ -f "$work/out/stalls-WeightGradGemm-deepseek-v3-uniform.sass.csv" ] || fail "the SASS CSV in OUT"
[ -f "$work/out/stalls-WeightGradGemm-deepseek-v3-uniform.txt" ] || fail "the digest in OUT"
[ -f "$work/rep/stalls-WeightGradGemm-deepseek-v3-uniform.ncu-rep" ] || fail "the report in WORK"
grep -q "warp samples: 100 over 3 SASS instructions" <<<"$out" || fail "the samples counted"
grep -q "Duration .* 1.03" <<<"$out" || fail "the kernel's duration"
grep -q "by reason: barrier 50.0%, long_sb 20.0%$" <<<"$out" || fail "the reasons, largest first, once each"
grep -Eq "1 +50 +50.0% +WARPGROUP.DEPBAR.LE gsb0, 0x1 .*barrier 50" <<<"$out" || fail "the instruction rows"

out=$(STUB_FAIL=1 OUT="$work/out" WORK="$work/rep" bash "$root/scripts/gemm-stalls.sh" "$work/build" X c 2>&1)
[ $? -eq 1 ] || fail "a failing ncu: exit status 1"
grep -q FAILED <<<"$out" || fail "a failing ncu is reported"
finish test_gemm_stalls
