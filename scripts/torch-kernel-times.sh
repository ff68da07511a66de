#!/usr/bin/env bash
# Where caracal.MoE's fused path spends a PyTorch step against v1's: ncu over one
# forward+backward step of each (bench/python/torch_profile_step.py; --profile-from-start off), the kernels
# side by side in launch order (scripts/lib/kernel_table.py: fused as NEW, v1 as OLD), and each
# step's median ms without the profiler, so that the kernels' sum can be set against it. Run on the
# device machine:  scripts/torch-kernel-times.sh [path/to/libcaracal_torch.so]
# MODEL (deepseek-v3) and TOKENS (4096) set the case. CSVs and logs go to $OUT if set, else
# /tmp/caracal-torch-kernel-times. Exit status 1 when a run failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out="${OUT:-/tmp/caracal-torch-kernel-times}"
mkdir -p "$out"
if [ $# -ge 1 ]; then
  export CARACAL_TORCH_LIBRARY="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
  export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}"
fi
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
python="${PYTHON:-python3}"
model="${MODEL:-deepseek-v3}"
failed=0
profile() {  # profile VARIANT [FLAG]: 0 when its CSV is there
  local variant=$1
  shift
  ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    --log-file "$out/kernels_$variant.csv" "$python" "$root/bench/python/torch_profile_step.py" --model "$model" \
    --tokens "${TOKENS:-4096}" "$@" >"$out/step_$variant.log" 2>&1 && return 0
  echo "FAILED: ncu on the $variant step (see $out/step_$variant.log)"
  failed=1
  return 1
}
profile fused && fused_csv="$out/kernels_fused.csv" || fused_csv=""
profile v1 --v1 && v1_csv="$out/kernels_v1.csv" || v1_csv=""
echo "==== kernel times, one PyTorch step of caracal.MoE ($model): v1 (old) vs fused (new)"
grep -h ' ms (median' "$out/step_fused.log" "$out/step_v1.log" 2>/dev/null
if [ -n "$fused_csv" ]; then
  python3 "$root/scripts/lib/kernel_table.py" "$fused_csv" ${v1_csv:+"$v1_csv"} || failed=1
fi
exit "$failed"
