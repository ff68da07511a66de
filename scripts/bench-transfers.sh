#!/usr/bin/env bash
# The token-exchange benchmarks (issue 3), run on the device machine from the repo root over a build
# made elsewhere (carried as build/), in one go:
#   1. tests/test_gpu_nccl_baseline: the NCCL baseline exchange equals TokenExchange at W = 1;
#   2. caracal_transfer_bench: schedule build and the four transfers in the loopback world (W = 8
#      and 1, DeepSeek-V3 and Kimi K2, uniform and zipf:1.2), each against a device-to-device copy
#      of the same bytes, and the NCCL baseline at W = 1;
# then the benchmark's summary table last. Typical run: under a minute.
# Usage: scripts/bench-transfers.sh [build-dir [caracal_transfer_bench options...]]
# Files (3) go to $OUT if set, else /tmp/caracal-bench-transfers: test_nccl_baseline.log,
# transfer_bench.log (every case in detail) and transfer_bench.json. The last line is
# "FAILED: <steps>" (exit status 1) or "all passed".
set -uo pipefail
build="${1:-build}"
[ $# -gt 0 ] && shift
logs="${OUT:-/tmp/caracal-bench-transfers}"
mkdir -p "$logs"
source "$(dirname "$0")/lib/nccl-env.sh"
summary_width=24
source "$(dirname "$0")/lib/summary.sh"

gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm \
  --format=csv,noheader 2>&1 | head -n 1)
record "GPU" "$gpu"
record "libnccl.so.2" "$nccl_found"

# ---- 1. the baseline's test ----------------------------------------------------------------------
log="$logs/test_nccl_baseline.log"
timeout 60 "$build/tests/test_gpu_nccl_baseline" --gtest_brief=1 >"$log" 2>&1
status=$?
if [ "$status" -eq 0 ]; then
  ran=$(sed -n 's/^\[==========\] \([0-9]*\) tests\? from .* ran.*/\1/p' "$log" | tail -n 1)
  skipped=$(grep -o '\[  SKIPPED \] [0-9]* test' "$log" | grep -o '[0-9]*' | head -n 1)
  record "test_gpu_nccl_baseline" "ok: ${ran:-?} run, ${skipped:-0} skipped"
else
  tail -n 30 "$log"
  [ "$status" -eq 124 ] && what="TIMED OUT after 60 s" || what="FAILED, exit $status"
  record_failed "test_gpu_nccl_baseline" "$what (see test_nccl_baseline.log)"
fi

# ---- 2. the benchmark ----------------------------------------------------------------------------
log="$logs/transfer_bench.log"
timeout 150 "$build/caracal_transfer_bench" --json "$logs/transfer_bench.json" "$@" >"$log" 2>&1
status=$?
case $status in
  0) record "caracal_transfer_bench" "ok (every spot check passed)" ;;
  2) record_failed "caracal_transfer_bench" "SPOT CHECK FAILED (see transfer_bench.log)" ;;
  124) record_failed "caracal_transfer_bench" "TIMED OUT after 150 s (see transfer_bench.log)" ;;
  *) record_failed "caracal_transfer_bench" "FAILED, exit $status (see transfer_bench.log)" ;;
esac
# Errors and failed checks first, the table last.
sed '/^==== caracal_transfer_bench summary/,$d' "$log" | grep -E 'ERROR|CHECK FAILED|error:' | head -n 20

echo
echo "==== Caracal transfer benchmarks: $(date -u +%F) commit $(cat "$build/COMMIT" 2>/dev/null || echo unknown)"
print_summary
if grep -q '^==== caracal_transfer_bench summary' "$log"; then
  sed -n '/^==== caracal_transfer_bench summary/,$p' "$log"
else
  tail -n 40 "$log"
fi
verdict
