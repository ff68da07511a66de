#!/usr/bin/env bash
# The grouped-GEMM check, run on the device machine from the repo root over a build made elsewhere
# (carried as build/), in one go:
#   1. test_gpu_grouped_gemm and test_gpu_grouped_gemm_backward (their GPU tests run for real);
#   2. compute-sanitizer memcheck and racecheck on their small cases;
#   3. the SASS: HGMMA present, no local memory (LDL/STL); registers, stack, spills per kernel;
#   4. caracal_gemm_bench (our forward and backward vs cuBLAS dense GEMM of the same FLOPs) and
#      bench/python/torch_grouped_mm.py (torch._grouped_mm on the same rows, forward and autograd backward);
# then a short summary table last, and "FAILED: <steps>" or "all passed" on the last line (exit
# status 1 when a step failed). Usage: scripts/gemm-check.sh [build-dir]
# Logs go to $OUT if set (at most 8 files: the device tool returns no more), else /tmp. Each step
# has its own time limit (typical whole run: 4-6 minutes); if the tests time out (a hang), the
# other GPU steps are skipped.
set -uo pipefail
build="${1:-build}"
logs="${OUT:-/tmp/caracal-gemm-check}"
mkdir -p "$logs"
work=$(mktemp -d)
summary_width=36
source "$(dirname "$0")/lib/summary.sh"

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm \
  --format=csv,noheader >"$work/gpu.txt" 2>&1
cat "$work/gpu.txt"

# The bench links libcublas.so.13 from the toolkit; if the loader cannot find it there, use the
# copy shipped with PyTorch's CUDA wheels.
if ldd "$build/caracal_gemm_bench" 2>/dev/null | grep -q 'libcublas.*not found'; then
  for d in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) \
           /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu; do
    lib=$(find "$d" -name 'libcublas.so.13' 2>/dev/null | head -n 1)
    if [ -n "$lib" ]; then
      export LD_LIBRARY_PATH="$(dirname "$lib"):${LD_LIBRARY_PATH:-}"
      echo "gemm-check: using $lib"
      break
    fi
  done
fi

# ---- 1. tests ------------------------------------------------------------------------------------
{ cat "$work/gpu.txt"; echo; } >"$logs/test.log"
hung=0
for name in test_gpu_grouped_gemm test_gpu_grouped_gemm_backward; do
  [ "$hung" -eq 0 ] || break
  echo "==== $name" >>"$logs/test.log"
  timeout 150 "$build/tests/$name" --gtest_brief=0 >"$work/$name.log" 2>&1
  status=$?
  cat "$work/$name.log" >>"$logs/test.log"
  if [ "$status" -eq 0 ]; then
    passed=$(grep -c '^\[       OK \]' "$work/$name.log" || true)
    skipped=$(grep -c '^\[  SKIPPED \] .*(' "$work/$name.log" || true)
    record "$name" "ok: $passed passed, $skipped skipped"
  else
    grep -E '^\[  FAILED  \]|Failure|error' "$work/$name.log" | head -n 30
    if [ "$status" -eq 124 ]; then
      hung=1
      record_failed "$name" "TIMED OUT after 150 s: skipping the other GPU steps"
    else
      record_failed "$name" "FAILED, exit $status (see test.log)"
    fi
  fi
done
worst=$(grep -oE 'relative Frobenius error [0-9.e+-]+' "$logs/test.log" |
  awk '{ if ($NF + 0 > w) w = $NF + 0 } END { if (NR) printf "%.2e", w }')
record "  worst rel. Frobenius error" "${worst:-none printed} (limit 1e-2)"

# ---- 2. compute-sanitizer on the small cases ------------------------------------------------------
: >"$logs/sanitizer.log"
sanitize() {  # binary filter
  local t="$build/tests/$1"
  for tool in memcheck racecheck; do
    [ "$hung" -eq 0 ] || return
    echo "==== $1: compute-sanitizer --tool $tool ($2)" >>"$logs/sanitizer.log"
    if timeout 120 compute-sanitizer --tool "$tool" --error-exitcode 99 "$t" --gtest_filter="$2" \
         --gtest_brief=1 >"$work/$tool.log" 2>&1; then
      record "sanitizer $tool ($1)" "clean ($(grep -oE '(ERROR|RACECHECK) SUMMARY: [0-9]+ [a-z]+' "$work/$tool.log" | tail -n 1))"
    else
      tail -n 20 "$work/$tool.log"
      record_failed "sanitizer $tool ($1)" "ERRORS (see sanitizer.log)"
    fi
    cat "$work/$tool.log" >>"$logs/sanitizer.log"
  done
}
sanitize test_gpu_grouped_gemm 'Cases/GroupedGemmReference.*/edge_counts:GroupedGemmEmpty.*:GroupedGemmLayout.*'
sanitize test_gpu_grouped_gemm_backward 'Cases/GroupedGemmBackwardReference.MatchesFp64Reference/edge_counts:GroupedGemmBackwardEmpty.*'

# ---- 3. SASS and resources ---------------------------------------------------------------------
lib="$build/libcaracal_gemm.a"
{
  echo "==== cuobjdump --dump-resource-usage $lib"
  cuobjdump --dump-resource-usage "$lib" 2>&1 | grep -E 'Function|REG'
  cuobjdump --dump-sass "$lib" >"$work/gemm.sass" 2>&1
  echo "==== HGMMA instructions by kind"
  grep -oE 'HGMMA\.[0-9x]+\.[A-Z0-9.]+' "$work/gemm.sass" | sort | uniq -c
  echo "==== local-memory instructions (LDL/STL): $(grep -cE '\b(LDL|STL)(\.|\s)' "$work/gemm.sass")"
  echo "==== consumer main loop (around the first HGMMA)"
  grep -n -m 1 HGMMA "$work/gemm.sass" | cut -d: -f1 |
    { read -r n; [ -n "$n" ] && sed -n "$((n - 20)),$((n + 40))p" "$work/gemm.sass"; }
} >"$logs/sass.txt"
hgmma=$(grep -c HGMMA "$work/gemm.sass")
if [ "$hgmma" -gt 0 ]; then record "SASS HGMMA instructions" "$hgmma"; else record_failed "SASS HGMMA instructions" "none (see sass.txt)"; fi
local_memory=$(grep -cE '\b(LDL|STL)(\.|\s)' "$work/gemm.sass")
if [ "$local_memory" -eq 0 ]; then record "SASS LDL/STL (local memory)" 0; else record_failed "SASS LDL/STL (local memory)" "$local_memory (see sass.txt)"; fi
cuobjdump --dump-resource-usage "$lib" 2>&1 | awk '
  /Function/ { name = $2; sub(/:$/, "", name); kind = ""
               if (name ~ /UpGateSwigluGemm/) kind = "up_gate_swiglu"
               else if (name ~ /DownProjGemm/) kind = "down_proj"
               else if (name ~ /DownDgradSwigluGemm/) kind = "down_dgrad_swiglu"
               else if (name ~ /GateUpDgradGemm/) kind = "gate_up_dgrad"
               else if (name ~ /WeightGradGemm/) kind = "weight_grad"
               else if (name ~ /reduce_router_grad/) kind = "reduce_router_grad" }
  /REG:/ && kind != "" { reg = $0; sub(/.*REG:/, "", reg); sub(/ .*/, "", reg)
                          stack = $0; sub(/.*STACK:/, "", stack); sub(/ .*/, "", stack)
                          local = $0; sub(/.*LOCAL:/, "", local); sub(/ .*/, "", local)
                          printf "%s regs=%s stack=%s local=%s\n", kind, reg, stack, local; kind = "" }' \
  >"$work/resources.txt"
while read -r kernel rest; do record "kernel $kernel" "$rest"; done <"$work/resources.txt"

# ---- 4. benchmarks -----------------------------------------------------------------------------
if [ "$hung" -eq 0 ]; then
  timeout 240 "$build/caracal_gemm_bench" --json "$logs/gemm_bench.json" >"$logs/gemm_bench.log" 2>&1
  status=$?
  case $status in
    0) record "caracal_gemm_bench" "ok (spot checks passed)" ;;
    2) record_failed "caracal_gemm_bench" "SPOT CHECK FAILED (see gemm_bench.log)" ;;
    *) record_failed "caracal_gemm_bench" "FAILED, exit $status (see gemm_bench.log)" ;;
  esac
  cat "$logs/gemm_bench.log"
fi
if [ "$hung" -eq 0 ] && [ -f "$logs/gemm_bench.json" ]; then
  if PYTHONUNBUFFERED=1 timeout 240 python3 bench/python/torch_grouped_mm.py "$logs/gemm_bench.json" \
       --json "$logs/torch_grouped_mm.json" >"$logs/torch_grouped_mm.log" 2>&1; then
    record "torch_grouped_mm.py" "ok"
  else
    record_failed "torch_grouped_mm.py" "FAILED (see torch_grouped_mm.log)"
  fi
  cat "$logs/torch_grouped_mm.log"
fi

# ---- summary (last) ----------------------------------------------------------------------------
{
  echo
  echo "==== Caracal grouped-GEMM check: $(date -u +%F) commit $(cat "$build/COMMIT" 2>/dev/null || echo unknown)"
  cat "$work/gpu.txt"
  print_summary
  python3 - "$logs/gemm_bench.json" "$logs/torch_grouped_mm.json" <<'EOF'
import json, sys
try:
    bench = json.load(open(sys.argv[1]))
except OSError:
    sys.exit(0)
try:
    torch = {c["name"]: c.get("results", {}) for c in json.load(open(sys.argv[2]))["cases"]}
except OSError:
    torch = {}
def tf(d, k):
    return d[k]["tflops"] if k in d else None
def f(v):
    return f"{v:7.1f}" if v is not None else "      -"
def r(a, b):
    return f"{a / b:6.3f}" if a and b else "     -"
def table(header, pass_name, parts, torch_keys):
    """One row a case: our kernels' parts and pass, torch's, cuBLAS's pass, the two ratios."""
    print(header)
    for c in bench["cases"]:
        o, t = c["results"], torch.get(c["name"], {})
        ours, cublas = tf(o, pass_name), tf(o, "cublas_" + pass_name)
        # torch's columns right-aligned under "torch fwd" / "torch bwd"
        theirs = "  ".join(f(tf(t, k)) for k in torch_keys).rjust(9)
        print(f"{c['name']:<24} {' '.join(f(tf(o, k)) for k in parts)} {f(ours)} | {theirs} | {f(cublas)}    | "
              f"{r(ours, tf(t, pass_name))} {r(ours, cublas)}")
table("TFLOP/s on real rows   up+swiglu   down  forward | torch fwd  +swiglu | cuBLAS fwd | /torch /cuBLAS",
      "forward", ["up_gate_swiglu", "down"], ["forward", "forward_swiglu"])
table("TFLOP/s on real rows   dgrad+sw     dx  wgrad backward | torch bwd | cuBLAS bwd | /torch /cuBLAS",
      "backward", ["dgrad_swiglu", "dx", "wgrad"], ["backward"])
EOF
  verdict
} | tee "$logs/summary.txt"
status=$?  # the verdict's (pipefail)
rm -rf "$work"
exit "$status"
