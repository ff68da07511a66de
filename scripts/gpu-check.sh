#!/usr/bin/env bash
# The GPU check, run on the device machine over a build folder made elsewhere:
#   every test binary (GPU tests run for real there: CARACAL_REQUIRE_GPU=1 and CARACAL_REQUIRE_GPUS
#   = the GPUs present turn any skip a test could have run into a failure; tests needing more GPUs
#   skip visibly), compute-sanitizer memcheck and racecheck on the GPU tests (errors sorted into
#   Caracal's and NCCL's own start-up probes: only ours fail), the SASS check (HGMMA present), the
#   register report of the kernels, the largest numeric errors the tests measured (where their
#   bounds come from), and a short summary table last, then "FAILED: <steps>" or "all passed".
# Usage: [CARACAL_SANITIZE=0] [CARACAL_TESTS=0] [CARACAL_TEST_TIMEOUT=s] [CARACAL_SANITIZER_TIMEOUT=s]
#        [CARACAL_SANITIZER_JOBS=N]
#        scripts/gpu-check.sh [build-dir]   (CARACAL_SANITIZE=0: the tests only; CARACAL_TESTS=0: the
#        sanitizers and the SASS check only, for a device call of their own; CARACAL_TEST_BINARIES="test_gpu_a
#        test_gpu_b": these test binaries only (a subsystem's suites, and the errors they measure, in one
#        short call); CARACAL_SANITIZE_BINARIES="test_gpu_a
#        test_gpu_b": the sanitizers on these binaries only, to spread them over calls;
#        CARACAL_SANITIZER_JOBS=N: one test a sanitizer process, N at a time; logs: $OUT/gpu-check-logs.tgz and $OUT/errors.txt when
# OUT is set: the device tool brings back at most 8 files). Exit status 1 when a test binary failed
# or timed out, a sanitizer found errors of ours, the SASS has no HGMMA, or the logs could not be
# written (tests/scripts/test_gpu_check.sh checks this with a stub build).
set -uo pipefail
build="${1:-build}"
logs=$(mktemp -d)
export CARACAL_CLI="$PWD/$build/caracal"
export CARACAL_BENCH="$PWD/$build/caracal-bench"
source "$(dirname "$0")/lib/nccl-env.sh"
lib_dir="$(cd "$(dirname "$0")/lib" && pwd)"
export CARACAL_REQUIRE_GPU=1
CARACAL_REQUIRE_GPUS=$(nvidia-smi -L 2>/dev/null | wc -l)
export CARACAL_REQUIRE_GPUS
summary_width=34
source "$lib_dir/summary.sh"
record "libnccl.so.2" "$nccl_found"

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader \
  | tee "$logs/gpu.txt"

binaries=0
for t in "$build"/tests/test_*; do
  [ "${CARACAL_TESTS:-1}" = 1 ] || break  # CARACAL_TESTS=0: sanitizers only
  [ -x "$t" ] || continue
  name=$(basename "$t")
  if [ -n "${CARACAL_TEST_BINARIES:-}" ] && [[ " $CARACAL_TEST_BINARIES " != *" $name "* ]]; then continue; fi
  binaries=$((binaries + 1))
  # A bound per binary: a hung kernel fails its binary and the check goes on (the device tool's
  # call would otherwise end with nothing to show).
  timeout "${CARACAL_TEST_TIMEOUT:-240}" "$t" --gtest_brief=1 >"$logs/$name.log" 2>&1
  rc=$?
  if [ "$rc" -eq 124 ]; then
    record_failed "$name" "TIMED OUT after ${CARACAL_TEST_TIMEOUT:-240} s (a hang?)"
    continue
  fi
  if [ "$rc" -eq 0 ]; then
    total=$(sed -n 's/^\[==========\] \([0-9]*\) tests\? from .* ran.*/\1/p' "$logs/$name.log" | tail -1)
    skipped=$(grep -o '\[  SKIPPED \] [0-9]* test' "$logs/$name.log" | grep -o '[0-9]*' | head -1)
    record "$name" "ok: ${total:-?} run, ${skipped:-0} skipped"
  else
    tail -n 30 "$logs/$name.log"
    record_failed "$name" "FAILED (see $name.log)"
  fi
done
[ "$binaries" -gt 0 ] || [ "${CARACAL_TESTS:-1}" != 1 ] ||
  record_failed "test binaries" "none in $build/tests${CARACAL_TEST_BINARIES:+ of CARACAL_TEST_BINARIES ($CARACAL_TEST_BINARIES)}"

# The sanitizers run a small subset of each GPU suite (they slow kernels down 10-100x). The stall
# tests are timing tests (200 ms timeouts) and stay out.
sanitizer_filter="${CARACAL_SANITIZER_FILTER:-*W2*:*m128_n128_k64*:LoopbackWorld.*:ReadyFlags.ConsumersSeeWhatProducersPublished:GpuScheduleFaults.*:*GroupedGemm*Reference*edge_counts:GroupedGemm*Empty.*:GroupedGemmBackwardWindows.*:*MatchesTokenExchangeAtW1/uniform_shape0:GpuMoELayerNumerics.*:NcclWorld.SingleRankExchange:-*shape1*:*NeverArrives*:*RefusesAGrid*:*Stall*}"
# A sanitizer unit is one process: a binary's filtered tests together, or with
# CARACAL_SANITIZER_JOBS=N > 1 one test a process, N processes at a time (the fused suites take
# minutes each under the sanitizers; in parallel they fit a device call).
sanitizer_jobs="${CARACAL_SANITIZER_JOBS:-1}"
sanitized=()
units=()
for t in "$build"/tests/test_gpu_*; do
  [ "${CARACAL_SANITIZE:-1}" = 1 ] || break  # CARACAL_SANITIZE=0: tests only
  [ -x "$t" ] || continue
  name=$(basename "$t")
  if [ -n "${CARACAL_SANITIZE_BINARIES:-}" ] && [[ " $CARACAL_SANITIZE_BINARIES " != *" $name "* ]]; then continue; fi
  # The bench and soak smokes run the tools as subprocesses (their kernels are the layer's, sanitized
  # through test_gpu_moe_layer).
  case $name in test_gpu_bench_smoke | test_gpu_soak_smoke) continue ;; esac
  # A binary none of whose tests match the filter would run no CUDA call (the sanitizer calls that
  # an error): say so instead.
  listed=$("$t" --gtest_list_tests --gtest_filter="$sanitizer_filter" 2>/dev/null)
  if ! grep -q '^  ' <<<"$listed"; then
    record "$name sanitizers" "no test matches the filter"
    continue
  fi
  sanitized+=("$name")
  if [ "$sanitizer_jobs" -gt 1 ]; then
    filters=$(awk '/^[^ ]/ { suite = $1 } /^  / { print suite $1 }' <<<"$listed")
  else
    filters=$sanitizer_filter
  fi
  for tool in memcheck racecheck; do
    i=0
    while read -r filter; do
      units+=("$t|$tool|$filter|$logs/$name.$tool.$i")
      i=$((i + 1))
    done <<<"$filters"
  done
done

run_sanitizer_unit() {  # run_sanitizer_unit "BINARY|TOOL|FILTER|LOG-STEM": LOG-STEM.log, and "rc seconds" in LOG-STEM.rc
  local t tool filter stem start rc
  IFS='|' read -r t tool filter stem <<<"$1"
  start=$(date +%s)
  timeout "${CARACAL_SANITIZER_TIMEOUT:-900}" compute-sanitizer --tool "$tool" "$t" --gtest_brief=1 \
    --gtest_filter="$filter" >"$stem.log" 2>&1
  rc=$?
  echo "$rc $(($(date +%s) - start))" >"$stem.rc"
}
for unit in "${units[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$sanitizer_jobs" ]; do wait -n; done
  run_sanitizer_unit "$unit" &
done
wait
# A unit the host killed (SIGKILL: racecheck holds up to ~120 GiB of host memory on the fused
# suites' ring tests, so units side by side can run the host out of memory) runs again alone.
rerun=0
for unit in "${units[@]}"; do
  read -r unit_rc _ <"${unit##*|}.rc"
  case $unit_rc in
    9 | 137)
      run_sanitizer_unit "$unit"
      rerun=$((rerun + 1))
      ;;
  esac
done
[ "$rerun" -eq 0 ] || record "sanitizer processes rerun alone" "$rerun (killed beside others)"

for name in "${sanitized[@]}"; do
  for tool in memcheck racecheck; do
    log="$logs/$name.$tool.log"
    cat "$logs/$name.$tool".[0-9]*.log >"$log"
    rc=0 longest=0 processes=0 cut=0
    for f in "$logs/$name.$tool".[0-9]*.rc; do
      read -r unit_rc seconds <"$f"
      processes=$((processes + 1))
      [ "$seconds" -le "$longest" ] || longest=$seconds
      [ "$unit_rc" -eq 0 ] || rc=$unit_rc
      [ "$unit_rc" -ne 124 ] || cut=$((cut + 1))
    done
    sorted=$(python3 "$lib_dir/sanitizer_report.py" "$log")
    ours=$?
    took="$processes process(es), longest ${longest} s"
    if [ "$cut" -gt 0 ]; then
      record_failed "$name $tool" "CUT: $cut of $processes process(es) past ${CARACAL_SANITIZER_TIMEOUT:-900} s; $sorted"
    elif [ "$ours" -eq 0 ] && [ "$rc" -eq 0 ]; then
      record "$name $tool" "clean: $sorted ($took)"
    else
      tail -n 20 "$log"
      record_failed "$name $tool" "ERRORS: $sorted (see $name.$tool.log)"
    fi
  done
done

lib="$build/libcaracal_gemm.a"
if [ -f "$lib" ]; then
  cuobjdump --dump-sass "$lib" >"$logs/kernels.sass" 2>&1
  hgmma=$(grep -c HGMMA "$logs/kernels.sass")
  if [ "$hgmma" -gt 0 ]; then
    record "SASS HGMMA instructions" "$hgmma"
  else
    record_failed "SASS HGMMA instructions" "none (see kernels.sass)"
  fi
  cuobjdump --dump-resource-usage "$lib" 2>&1 | grep -E 'Function|REG' >"$logs/kernels.resources" || true
  record "kernel resources" "$(grep -o 'REG:[0-9]*' "$logs/kernels.resources" | tr '\n' ' ')"
else
  record_failed "SASS HGMMA instructions" "no $lib"
fi

echo
echo "==== Largest numeric errors measured (the tests' bounds are about 3x these) ===="
python3 "$lib_dir/error_summary.py" "$logs"/test_gpu_*.log | tee "$logs/errors.txt"
if [ -n "${OUT:-}" ]; then
  { mkdir -p "$OUT" && tar czf "$OUT/gpu-check-logs.tgz" -C "$logs" . && cp "$logs/errors.txt" "$OUT/errors.txt"; } ||
    record_failed "logs" "not written to $OUT"
fi
echo
echo "==== Caracal GPU check: $(date -u +%F) commit $(cat "$build/COMMIT" 2>/dev/null || echo unknown) ===="
print_summary
verdict
