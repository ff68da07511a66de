#!/usr/bin/env bash
# Issue 47's check, on one GPU in one device call:
#   1. the FP8 GPU tests: the quantizers, the forward and backward FP8 GEMMs, the FP8 weight
#      gradients, the e4m3 pulls of x and dy, the FP8 expert pass and the FP8 layer (each a test
#      binary of BUILD/tests), compute-sanitizer memcheck and racecheck on the quantizers', the
#      weight gradients' and the pulls' small cases, then tests/python/test_moe_fp8.py where BUILD holds libcaracal_torch.so
#      (SKIP_PYTHON=1: not);
#   2. caracal_gemm_bench on the FP8 cases (GEMM_CASES: DeepSeek-V3 and Kimi K2 uniform,
#      Qwen3-30B-A3B E128 T8192);
#   3. caracal-bench --precision fp8 at W = 1 on each of LAYERS (model:local experts:tokens;
#      DeepSeek-V3 32 and Kimi K2 48 at T = 4096, Qwen3-30B-A3B 128 at T = 8192), --graph --rounds
#      ROUNDS (2) --reps REPS (10), the bf16 fused layer, bf16 v1 and NCCL + GEMMs in the same runs;
#   4. the plain PyTorch FP8 and bf16 layers on the first layer's shape (PLAIN_LAYERS=all: every
#      layer's, or a list of LAYERS' entries; bench/python/torch_fp8_moe_layer.py --check;
#      SKIP_PYTHON=1: not). Issue 47's five presets in one call: LAYERS="deepseek-v3:32:4096
#      kimi-k2:48:4096 qwen3.5-397b:64:4096 glm-5:32:4096 deepseek-v4-pro:48:4096" PLAIN_LAYERS=all;
# then issue 47's targets against the figures (scripts/lib/fp8_summary.py: two markdown tables for
# docs/PERF.md, fp8-check.json for docs/results/), the layers' ceilings (bench/python/fp8_ceiling.py:
# fp8-ceiling.md and .json, for the layers whose model has a uniform case among GEMM_CASES; the
# others are named on the ceilings' row) and the summary of the steps.
# Usage: scripts/fp8-check.sh [build-dir]   (caracal-bench, caracal_gemm_bench and tests/ as
#        scripts/stage-gpu-build.sh stages them; default build)
#   STEP_TIMEOUT (150 s) bounds each step; CHECK_BUDGET_S (540): no bench starts once the check has
#   run this long (those are "not run": failed). FP8_WEIGHT_GRADS (fp8): the layers' --fp8-weight-grads.
# Files go to $OUT if set, else /tmp/caracal-fp8-check: fp8-check.md, fp8-check.json, each step's
# log and JSON. The last line is "all passed" (exit 0) or "FAILED: <steps>" (exit 1): a test or
# bench that fails, times out or was not run, and the targets when one is missed (the line above
# the summary names them). A bad setting exits 2 with one line naming it.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="${1:-build}"
out="${OUT:-/tmp/caracal-fp8-check}"
usage_error() {
  echo "fp8-check: $1" >&2
  exit 2
}
rounds=${ROUNDS:-2} reps=${REPS:-10} step_limit=${STEP_TIMEOUT:-150} budget=${CHECK_BUDGET_S:-540}
for v in rounds reps step_limit budget; do
  [[ "${!v}" =~ ^[0-9]+$ ]] || usage_error "$v: expected a whole number, got '${!v}'"
done
wgrad=${FP8_WEIGHT_GRADS:-fp8}
case "$wgrad" in fp8 | bf16) ;; *) usage_error "FP8_WEIGHT_GRADS: expected fp8 or bf16, got '$wgrad'" ;; esac
layers=${LAYERS:-deepseek-v3:32:4096 kimi-k2:48:4096 qwen3-30b-a3b:128:8192}
for l in $layers; do
  [[ "$l" =~ ^[a-z0-9.-]+:[0-9]+:[0-9]+$ ]] || usage_error "LAYERS: expected model:experts:tokens, got '$l'"
done
case "${PLAIN_LAYERS:-first}" in
  first) plain_layers=${layers%% *} ;;
  all) plain_layers=$layers ;;
  *)
    plain_layers=$PLAIN_LAYERS
    for l in $plain_layers; do
      [[ " $layers " == *" $l "* ]] || usage_error "PLAIN_LAYERS: expected first, all or layers of LAYERS, got '$l'"
    done
    ;;
esac
cases=${GEMM_CASES:-deepseek-v3/uniform kimi-k2/uniform qwen3-30b-a3b/uniform/w1}
mkdir -p "$out"
source "$root/scripts/lib/nccl-env.sh"
export NCCL_NVLS_ENABLE=0 CARACAL_REQUIRE_GPU=1  # the NCCL baseline without multicast; no test may skip
summary_width=34
source "$root/scripts/lib/summary.sh"
start=$SECONDS

# step NAME LOG COMMAND...: COMMAND bounded by STEP_TIMEOUT, its output into LOG, a summary row.
step() {
  local name=$1 log=$2
  shift 2
  local t0=$SECONDS
  timeout "$step_limit" "$@" >"$log" 2>&1
  local rc=$?
  local took="$((SECONDS - t0)) s"
  if [ "$rc" -eq 0 ]; then
    local passed
    passed=$(grep -E '^\[  PASSED  \]|passed' "$log" | tail -n 1)
    record "$name" "ok ($took${passed:+; $passed})"
  elif [ "$rc" -eq 124 ]; then
    record_failed "$name" "timed out after $step_limit s"
  else
    record_failed "$name" "exit $rc ($took; $log)"
  fi
  return "$rc"
}

for t in test_gpu_quantize_fp8 test_gpu_grouped_gemm_fp8 test_gpu_grouped_gemm_fp8_backward test_gpu_weight_grad_fp8 \
  test_gpu_dispatch_fp8 test_gpu_expert_pass_fp8 test_gpu_moe_layer_fp8; do
  if [ -x "$build/tests/$t" ]; then
    step "$t" "$out/$t.log" "$build/tests/$t" --gtest_brief=1
  else
    record_failed "$t" "not built ($build/tests/$t)"
  fi
done
# compute-sanitizer memcheck and racecheck on small cases: the quantizers (rows, columns of bf16 and
# of e4m3 rows, weights, partial blocks), the FP8 weight gradients (edge counts, empty experts) and
# the e4m3 pulls of x and dy (W = 1 and 4, all-to-one, -1 slots, graph replay).
sanitize() {  # sanitize BINARY FILTER
  local tool
  for tool in memcheck racecheck; do
    if [ ! -x "$build/tests/$1" ]; then
      record_failed "sanitizer $tool ($1)" "not built"
      continue
    fi
    step "sanitizer $tool ($1)" "$out/sanitizer-$tool-$1.log" compute-sanitizer --tool "$tool" --error-exitcode 99 \
      "$build/tests/$1" --gtest_filter="$2" --gtest_brief=1
  done
}
sanitize test_gpu_quantize_fp8 '*/260x200_stride260_exact:*/260x256_stride260_exact:*/3x264x200_exact:*/257x1000_exact_row_major'
sanitize test_gpu_weight_grad_fp8 'Cases/Fp8WeightGradReference.*/edge_counts:Fp8WeightGradEmpty.*'
sanitize test_gpu_dispatch_fp8 '*/W1_uniform_shape0_*:*/W4_all_to_one_shape0_*:*/W4_empty_slots_shape0_*:GpuDispatchFp8Graph.*'

if [ "${SKIP_PYTHON:-0}" = 1 ]; then
  record "test_moe_fp8.py" "skipped (SKIP_PYTHON=1)"
elif [ -f "$build/libcaracal_torch.so" ]; then
  step "test_moe_fp8.py" "$out/test_moe_fp8.log" env CARACAL_TORCH_LIBRARY="$(cd "$build" && pwd)/libcaracal_torch.so" \
    python3 -m pytest -q "$root/tests/python/test_moe_fp8.py"
else
  record_failed "test_moe_fp8.py" "no $build/libcaracal_torch.so (SKIP_PYTHON=1 to leave it out)"
fi

gemm_args=()
for c in $cases; do gemm_args+=(--case "$c"); done
summary_args=() ceiling_args=() no_gemm_case=()
has_gemm_case() {  # has_gemm_case MODEL: one of GEMM_CASES is MODEL's uniform routing (its ceiling's GEMMs)
  local c m r
  for c in $cases; do
    IFS=/ read -r m r _ <<<"$c"
    [ "$m" = "$1" ] && [ "$r" = uniform ] && return 0
  done
  return 1
}
if step "caracal_gemm_bench" "$out/gemm-bench.log" "$build/caracal_gemm_bench" --reps 20 "${gemm_args[@]}" \
  --json "$out/gemm-bench.json"; then
  summary_args+=(--gemm "$out/gemm-bench.json")
fi

for l in $layers; do
  IFS=: read -r model experts tokens <<<"$l"
  name="$model-e$experts-t$tokens"
  if [ $((SECONDS - start)) -ge "$budget" ]; then
    record_failed "layer $name" "not run (CHECK_BUDGET_S = $budget s spent)"
    continue
  fi
  if step "layer $name" "$out/layer-$name.log" "$build/caracal-bench" --model "$model" --experts "$experts" --ep 1 \
    --tokens "$tokens" --precision fp8 --fp8-weight-grads "$wgrad" --graph --rounds "$rounds" --reps "$reps" \
    --json "$out/layer-$name.json"; then
    summary_args+=(--layer "$name=$out/layer-$name.json")
    if has_gemm_case "$model"; then
      ceiling_args+=(--layer "$out/layer-$name.json")
    else
      no_gemm_case+=("$name")
    fi
  fi
done

# The plain PyTorch layers (FP8 and bf16) on PLAIN_LAYERS' shapes, each checked against the other.
for l in $plain_layers; do
  IFS=: read -r model experts tokens <<<"$l"
  name="$model-e$experts-t$tokens"
  if [ "${SKIP_PYTHON:-0}" = 1 ]; then
    record "plain PyTorch layers $name" "skipped (SKIP_PYTHON=1)"
  elif [ $((SECONDS - start)) -ge "$budget" ]; then
    record_failed "plain PyTorch layers $name" "not run (CHECK_BUDGET_S = $budget s spent)"
  elif step "plain PyTorch layers $name" "$out/plain-$name.log" python3 "$root/bench/python/torch_fp8_moe_layer.py" \
    --model "$model" --experts "$experts" --tokens "$tokens" --check --json "$out/plain-$name.json"; then
    [[ " ${summary_args[*]} " == *" $name="* ]] && summary_args+=(--plain "$name=$out/plain-$name.json")
  fi
done

if [ "${#summary_args[@]}" -gt 0 ]; then
  python3 "$root/scripts/lib/fp8_summary.py" "${summary_args[@]}" --json "$out/fp8-check.json" >"$out/fp8-check.md"
  rc=$?
  cat "$out/fp8-check.md"
  if [ "$rc" -ne 0 ]; then
    record_failed "targets" "fp8_summary.py failed (exit $rc)"
  elif [ "$(tail -n 1 "$out/fp8-check.md")" != "all targets met" ]; then
    record_failed "targets" "missed (the MISS line above)"
  else
    record "targets" "all met"
  fi
else
  record_failed "targets" "no figures to check"
fi
# What the FP8 GEMMs allow (bench/python/fp8_ceiling.py): the layers' ceilings over the bf16 fused layer.
if [ "${#ceiling_args[@]}" -gt 0 ] && [ -f "$out/gemm-bench.json" ]; then
  if python3 "$root/bench/python/fp8_ceiling.py" "${ceiling_args[@]}" --gemm "$out/gemm-bench.json" \
      --json "$out/fp8-ceiling.json" >"$out/fp8-ceiling.md" 2>&1; then
    echo
    cat "$out/fp8-ceiling.md"
    record "ceilings" "ok (fp8-ceiling.md)${no_gemm_case[*]:+; left out, no uniform GEMM case: ${no_gemm_case[*]}}"
  else
    record_failed "ceilings" "fp8_ceiling.py failed ($out/fp8-ceiling.md)"
  fi
fi
echo
echo "fp8-check: $build ($(cat "$build/COMMIT" 2>/dev/null || echo "no COMMIT")), $((SECONDS - start)) s, files in $out"
print_summary
verdict
