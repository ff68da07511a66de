#!/usr/bin/env bash
# The GPU check, run on the device machine over a build folder made elsewhere:
#   every test binary (GPU tests run for real there), compute-sanitizer memcheck and racecheck on
#   the GPU tests, the SASS check (HGMMA present) and register/spill report of the kernels, and a
#   short summary table last. Usage: scripts/gpu-check.sh [build-dir]   (logs go to $OUT if set)
set -uo pipefail
build="${1:-build}"
logs="${OUT:-/tmp/caracal-gpu-check}"
mkdir -p "$logs"
export CARACAL_CLI="$PWD/$build/caracal"
export CARACAL_BENCH="$PWD/$build/caracal-bench"
source "$(dirname "$0")/lib/nccl-env.sh"
summary=()
record() { summary+=("$(printf '%-34s %s' "$1" "$2")"); }
record "libnccl.so.2" "$nccl_found"

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader \
  | tee "$logs/gpu.txt"

for t in "$build"/tests/test_*; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  if "$t" --gtest_brief=1 >"$logs/$name.log" 2>&1; then
    total=$(sed -n 's/^\[==========\] \([0-9]*\) tests\? from .* ran.*/\1/p' "$logs/$name.log" | tail -1)
    skipped=$(grep -o '\[  SKIPPED \] [0-9]* test' "$logs/$name.log" | grep -o '[0-9]*' | head -1)
    record "$name" "ok: ${total:-?} run, ${skipped:-0} skipped"
  else
    tail -n 30 "$logs/$name.log"
    record "$name" "FAILED (see $name.log)"
  fi
done

# The sanitizers run a small subset of each GPU suite (they slow kernels down 10-100x).
sanitizer_filter="${CARACAL_SANITIZER_FILTER:-*W2*:*m128_n128_k64*:LoopbackWorld.*:GpuScheduleFaults.*:*GroupedGemm*Reference*edge_counts:GroupedGemm*Empty.*:*MatchesTokenExchangeAtW1/uniform_shape0:-*shape1*:*NeverArrives*:*RefusesAGrid*}"
for t in "$build"/tests/test_gpu_*; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  # NCCL's own kernels are not ours to sanitize; the bench smoke runs the bench as a subprocess
  # (its kernels are the layer's, sanitized through test_gpu_moe_layer).
  case "$name" in test_gpu_comm_nccl | test_gpu_bench_smoke) continue ;; esac
  for tool in memcheck racecheck; do
    # NCCL probes its own kernel images at init and memcheck reports those failed CUDA calls as
    # errors: for suites that start NCCL, report memory errors only.
    quiet_api=()
    [ "$name" = test_gpu_nccl_baseline ] && quiet_api=(--report-api-errors no)
    if compute-sanitizer --tool "$tool" "${quiet_api[@]}" --error-exitcode 99 "$t" --gtest_brief=1 --gtest_filter="$sanitizer_filter" >"$logs/$name.$tool.log" 2>&1; then
      record "$name $tool" "clean ($(grep -oE '(ERROR|RACECHECK) SUMMARY: [0-9]+ [a-z]+' "$logs/$name.$tool.log" | tail -1))"
    else
      tail -n 20 "$logs/$name.$tool.log"
      record "$name $tool" "ERRORS (see $name.$tool.log)"
    fi
  done
done

lib="$build/libcaracal_kernels.a"
if [ -f "$lib" ]; then
  cuobjdump --dump-sass "$lib" >"$logs/kernels.sass" 2>&1
  record "SASS HGMMA instructions" "$(grep -c HGMMA "$logs/kernels.sass")"
  cuobjdump --dump-resource-usage "$lib" 2>&1 | grep -E 'Function|REG' >"$logs/kernels.resources" || true
  record "kernel resources" "$(grep -o 'REG:[0-9]*' "$logs/kernels.resources" | tr '\n' ' ')"
fi

echo
echo "==== Caracal GPU check: $(date -u +%F) commit $(cat "$build/COMMIT" 2>/dev/null || echo unknown) ===="
printf '%s\n' "${summary[@]}"
