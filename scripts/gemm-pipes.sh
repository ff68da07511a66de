#!/usr/bin/env bash
# How busy grouped-GEMM kernels keep the units a GEMM can be bound by: the tensor pipe (wgmma),
# shared memory (its banks, which the wgmmas' operand reads and TMA's writes share), the L2 and
# DRAM. ncu measures one launch (the third) of each kernel matching a regex in caracal_gemm_bench,
# free clocks, and one line per kernel is printed. Run on the device machine:
#   scripts/gemm-pipes.sh BUILD CASE REGEX...   e.g.  scripts/gemm-pipes.sh build-gpu deepseek-v3/uniform Fp8UpGate Blockwise
# Metrics the GPU's ncu does not know are left out (ncu --query-metrics) and named. The CSV of each
# kernel goes to $OUT (else /tmp/caracal-gemm-pipes) as pipes-REGEX-CASE.csv. Exit status 1 when
# ncu failed or matched no launch.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="${1:?usage: scripts/gemm-pipes.sh BUILD CASE REGEX...}"
case_name="${2:?usage: scripts/gemm-pipes.sh BUILD CASE REGEX...}"
shift 2
[ $# -ge 1 ] || { echo "usage: scripts/gemm-pipes.sh BUILD CASE REGEX..." >&2; exit 2; }
out="${OUT:-/tmp/caracal-gemm-pipes}"
mkdir -p "$out"

# The tensor pipe: ncu's general name first (wgmma, mma), then the older wgmma-only one.
wanted=(gpu__time_duration.sum sm__cycles_elapsed.avg.per_second
  sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active
  sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active
  l1tex__data_bank_reads.avg.pct_of_peak_sustained_elapsed
  l1tex__data_bank_writes.avg.pct_of_peak_sustained_elapsed
  lts__t_sectors.avg.pct_of_peak_sustained_elapsed
  dram__throughput.avg.pct_of_peak_sustained_elapsed)
known=$(ncu --query-metrics 2>/dev/null | awk '{print $1}')
metrics=""
for m in "${wanted[@]}"; do
  if grep -qx "${m%%.*}" <<<"$known"; then
    metrics+="${metrics:+,}$m"
  else
    # The tensor pipe's counters are named differently across ncu releases: list what this one has.
    hint=""
    [[ $m == *tensor* ]] && hint=" (its tensor-pipe metrics: $(grep -iE 'pipe_tensor' <<<"$known" | head -8 | tr '\n' ' '))"
    echo "not known to this ncu: $m$hint"
  fi
done
[ -n "$metrics" ] || { echo "FAILED: none of the metrics is known to ncu"; exit 1; }

echo "==== pipes of the kernels in $case_name, build $(cat "$build/COMMIT" 2>/dev/null)"
failed=0
for regex in "$@"; do
  csv="$out/pipes-${regex//[^A-Za-z0-9]/_}-${case_name//\//-}.csv"
  # The bench's first launches warm up; the third launch of the kernel is the one measured.
  if ! ncu --clock-control none --kernel-name-base demangled -k "regex:$regex" --launch-skip 2 --launch-count 1 \
      --metrics "$metrics" --csv --print-units base --log-file "$csv" \
      "$build/caracal_gemm_bench" --case "$case_name" --reps 2 --warmup 1 >"$csv.log" 2>&1; then
    echo "FAILED: ncu on '$regex' (see $csv.log)"; tail -n 3 "$csv.log"; failed=1; continue
  fi
  python3 "$root/scripts/lib/gemm_pipes.py" "$regex" "$csv" || failed=1
done
exit "$failed"
