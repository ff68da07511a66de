#!/usr/bin/env bash
# A fused FP8 pass of two builds side by side, on one GPU in one device call:
# [PASS=forward|backward] scripts/fused-fp8-ab.sh OLD NEW   (each holds caracal-bench and COMMIT;
# NEW also tests/ with test_gpu_moe_layer_fp8 and, where staged, test_gpu_grouped_gemm_fp8:
# scripts/stage-variant.sh; OLD "-": NEW alone, for a pass OLD has not)
#   PASS (forward): the fused FP8 forward (--fused-fp8-forward) or the fused FP8 backward
#   (--fused-fp8-backward) is the one compared.
#   1. NEW's tests, each bounded by TEST_TIMEOUT s (180): the FP8 layer's (its fused pass against
#      the separate launches' bits at W = 1, 2, 4 among them), compute-sanitizer memcheck of that
#      bitwise test, and the FP8 grouped GEMMs' where staged. A failure stops the check here, before
#      the benchmarks spend the call's time;
#   2. caracal-bench --precision fp8 --ep 1 --graph --rounds 1 on each of LAYERS
#      (model:local experts:tokens; default Qwen3-30B-A3B 128 at T = 8192 and DeepSeek-V3 32 at
#      T = 4096): NEW's separate launches, OLD's and NEW's fused pass, alternated ROUNDS (2) times,
#      each bounded by BENCH_TIMEOUT s (120);
# then per layer the medians over the rounds (scripts/lib/fused_fp8_ab.py): each path's pass and
# fwd+bwd ms, and each fused pass over the separate launches' (above 1: slower).
# Files go to $OUT if set, else /tmp/caracal-fused-fp8-ab: fused-fp8-ab.md (the table),
# fused-fp8-ab.json (for docs/results/) and details.tgz (each run's log and bench JSON, packed at
# exit: the device tool brings back at most 8 files). The last line is
# "all passed" (exit 0) or "FAILED: <steps>" (exit 1). A bad setting exits 2 with one line naming it.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
old="${1:?usage: scripts/fused-fp8-ab.sh OLD NEW}"
new="${2:?usage: scripts/fused-fp8-ab.sh OLD NEW}"
out="${OUT:-/tmp/caracal-fused-fp8-ab}"
usage_error() {
  echo "fused-fp8-ab: $1" >&2
  exit 2
}
rounds=${ROUNDS:-2} test_limit=${TEST_TIMEOUT:-180} bench_limit=${BENCH_TIMEOUT:-120} pass=${PASS:-forward}
case "$pass" in
  forward) fused_flag=--fused-fp8-forward bits_test=FusedForwardGivesTheSeparateLaunchesBits ;;
  backward) fused_flag=--fused-fp8-backward bits_test=FusedBackwardGivesTheSeparateLaunchesBits ;;
  *) usage_error "PASS: expected forward or backward, got '$pass'" ;;
esac
for v in rounds test_limit bench_limit; do
  [[ "${!v}" =~ ^[0-9]+$ ]] || usage_error "$v: expected a whole number, got '${!v}'"
done
layers=(${LAYERS:-qwen3-30b-a3b:128:8192 deepseek-v3:32:4096})
for layer in "${layers[@]}"; do
  [[ "$layer" =~ ^[a-z0-9.-]+:[0-9]+:[0-9]+$ ]] || usage_error "LAYERS: expected model:experts:tokens, got '$layer'"
done
paths=(separate old new) builds=("$old" "$new")
if [ "$old" = - ]; then paths=(separate new) builds=("$new"); fi
for b in "${builds[@]}"; do
  [ -x "$b/caracal-bench" ] || usage_error "$b/caracal-bench is missing"
done
[ -x "$new/tests/test_gpu_moe_layer_fp8" ] || usage_error "$new/tests/test_gpu_moe_layer_fp8 is missing"
mkdir -p "$out"
source "$root/scripts/lib/pack-details.sh"
trap 'pack_details "$out" fused-fp8-ab.md fused-fp8-ab.json' EXIT
build="$new"
source "$root/scripts/lib/nccl-env.sh"
summary_width=40
source "$root/scripts/lib/summary.sh"

run() {  # run NAME LIMIT CMD...: its output to NAME.log; a failure is recorded and shown
  local name=$1 limit=$2 rc
  shift 2
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  rc=$?
  if [ "$rc" -eq 0 ]; then
    record "$name" "passed"
  else
    tail -n 20 "$out/$name.log"
    record_failed "$name" "FAILED (rc $rc)"
  fi
  return "$rc"
}

bits_filter="--gtest_filter=*$bits_test*"
tests_passed=1
run test_gpu_moe_layer_fp8 "$test_limit" "$new/tests/test_gpu_moe_layer_fp8" || tests_passed=0
if ((tests_passed)); then
  run memcheck_fused_fp8_bits "$test_limit" compute-sanitizer --tool memcheck --error-exitcode 1 \
    "$new/tests/test_gpu_moe_layer_fp8" "$bits_filter" || tests_passed=0
fi
if ((tests_passed)) && [ -x "$new/tests/test_gpu_grouped_gemm_fp8" ]; then
  run test_gpu_grouped_gemm_fp8 "$test_limit" "$new/tests/test_gpu_grouped_gemm_fp8" || tests_passed=0
fi

runs=()
if ((tests_passed)); then
  for ((round = 1; round <= rounds; ++round)); do
    for layer in "${layers[@]}"; do
      IFS=: read -r model experts tokens <<<"$layer"
      for path in "${paths[@]}"; do
        b="$new" extra=("$fused_flag")
        [ "$path" = old ] && b="$old"
        [ "$path" = separate ] && extra=()
        name="bench_${model}_${experts}_${tokens}_${path}_$round"
        run "$name" "$bench_limit" "$b/caracal-bench" --model "$model" --experts "$experts" --tokens "$tokens" \
          --ep 1 --graph --rounds 1 --precision fp8 "${extra[@]}" --json "$out/$name.json" &&
          runs+=("$layer:$path:$round:$out/$name.json")
      done
    done
  done
else
  record_failed benchmarks "not run: a test of the new build failed"
fi

if ((${#runs[@]})); then
  python3 "$root/scripts/lib/fused_fp8_ab.py" --pass "$pass" --old "$(cat "$old/COMMIT" 2>/dev/null || echo "-")" \
    --new "$(cat "$new/COMMIT" 2>/dev/null || echo "?")" --md "$out/fused-fp8-ab.md" \
    --json "$out/fused-fp8-ab.json" "${runs[@]}" || record_failed table "FAILED"
  cat "$out/fused-fp8-ab.md"
fi
echo
print_summary
verdict
