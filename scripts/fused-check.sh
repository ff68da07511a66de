#!/usr/bin/env bash
# The fused kernels' check, one device-machine call over a staged build (scripts/stage-gpu-build.sh):
#   1. their tests and the layer's (CARACAL_REQUIRE_GPU=1), each bounded in time;
#   2. racecheck and memcheck on a small subset of them;
#   3. caracal-soak's digest of every output of 1,000 steps against v1's (ba2e7906cd1d588b: the
#      fused path must give the same bits);
#   4. caracal bench, DeepSeek-V3, W = 1 (32 experts) and loopback W = 2 (64 experts), T = 4096,
#      fused and v1 forward in the same run (JSON to $OUT when set);
# and a summary table last, then "FAILED: <steps>" or "all passed" (exit status 1 when a step failed,
# a test binary is missing or the soak's digest differs). Every step has a time bound, so a hang
# costs one step, not the call. Usage: scripts/fused-check.sh [build-dir]
set -uo pipefail
build="${1:-build-gpu}"
out="${OUT:-$(mktemp -d)}"
logs=$(mktemp -d)
source "$(dirname "$0")/lib/nccl-env.sh"
export CARACAL_REQUIRE_GPU=1
summary_width=40
source "$(dirname "$0")/lib/summary.sh"

# bounded NAME SECONDS COMMAND...: the command's output goes to $logs/NAME.log; records the outcome.
bounded() {
  local name=$1 limit=$2
  shift 2
  timeout "$limit" "$@" >"$logs/$name.log" 2>&1
  local rc=$?
  case $rc in
    0) record "$name" "ok $(grep -E '^\[  PASSED|SUMMARY' "$logs/$name.log" | tail -1)" ;;
    124) record_failed "$name" "TIMED OUT after $limit s"; tail -n 5 "$logs/$name.log" ;;
    *) record_failed "$name" "FAILED (exit $rc)"; tail -n 25 "$logs/$name.log" ;;
  esac
  return 0
}

for t in test_gpu_gathered_rows test_gpu_fused_forward test_gpu_moe_layer test_gpu_moe_layer_faults; do
  if [ -x "$build/tests/$t" ]; then bounded "$t" 180 "$build/tests/$t" --gtest_brief=1; else record_failed "$t" "missing"; fi
done
filter='*W2*:*W1_one*:GatheredRows.*'
for tool in racecheck memcheck; do
  bounded "test_gpu_fused_forward $tool" 300 compute-sanitizer --tool "$tool" --error-exitcode 1 \
    "$build/tests/test_gpu_fused_forward" --gtest_brief=1 --gtest_filter="$filter"
done
bounded soak 180 "$build/caracal-soak" --backend loopback --ep 4 --steps 1000 --seed 2026
digest=$(grep -o 'digest of every output checksum: [0-9a-f]*' "$logs/soak.log" | awk '{print $NF}')
if [ "$digest" = ba2e7906cd1d588b ]; then
  record "soak digest (v1: ba2e7906cd1d588b)" "$digest same"
else
  record_failed "soak digest (v1: ba2e7906cd1d588b)" "${digest:-none} DIFFERS"
fi
bounded "bench W=1" 180 "$build/caracal-bench" --model deepseek-v3 --experts 32 --ep 1 --tokens 4096 --reps 20 \
  --quiet --json "$out/fused_bench_w1.json"
bounded "bench loopback W=2" 240 "$build/caracal-bench" --model deepseek-v3 --experts 64 --ep 2 --tokens 4096 \
  --reps 20 --quiet --no-validate --json "$out/fused_bench_w2_loopback.json"

python3 - "$out" <<'PY'
import json, os, sys
for name in ("fused_bench_w1.json", "fused_bench_w2_loopback.json"):
    try:
        r = json.load(open(os.path.join(sys.argv[1], name)))["runs"][0]
    except (OSError, ValueError, KeyError, IndexError):
        print(f"{name}: no figures")
        continue
    f, v = r["forward"]["ms"], r["v1"]["forward"]["ms"]
    print(f"{name}: forward fused {f:.3f} ms, v1 {v:.3f} ms ({v / f:.2f}x); fwd+bwd fused "
          f"{r['fwd_bwd']['ms']:.3f}, v1 {r['v1']['fwd_bwd']['ms']:.3f}")
PY
echo
echo "==== Fused check: $(date -u +%F) commit $(cat "$build/COMMIT" 2>/dev/null || echo unknown) ===="
print_summary
verdict
