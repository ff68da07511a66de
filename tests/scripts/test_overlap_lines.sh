#!/usr/bin/env bash
# bench/python/overlap_lines.py (arithmetic, no GPU): on a made-up case whose figures put a kernel on
# its no-overlap line (overlap 0%) and another at its floor (overlap 100%), the bf16 rate taken from the
# run's cuBLAS figure and the FP8 one from --fp8-tflops; medians over two JSONs; a missing figure and
# bad arguments refused with exit 1 or 2.
source "$(dirname "$0")/script_test_lib.sh"
script="$root/bench/python/overlap_lines.py"

# D = I = 1024, one expert, 8,000 real rows padded to 8,192 (the figures below follow from these).
python3 - "$work" <<'PY'
import json, sys
D = I = 1024; P = 8192; R = 8000
wgrad_flops = 2.0 * P * D * 3 * I                    # FLOPs the kernel runs (padded rows)
grads = 3 * I * D
wgrad_bytes = grads * 4 + P * (D + 2 * I + D + I) * 2
flop_ms = wgrad_flops / 100e12 * 1e3                  # the bf16 rate below: 100 TFLOP/s
byte_ms = wgrad_bytes / 0.1e12 * 1e3                  # at --tbs 0.1: bytes longer than FLOPs
cublas_ms = 2.0 * R * D * 3 * I / 100e12 * 1e3        # cuBLAS runs the real rows at 100 TFLOP/s
fp8_flop_ms = wgrad_flops / 200e12 * 1e3              # --fp8-tflops 200
fp8_byte_ms = (grads * 4 + P * (D + 2 * I + D + I)) / 0.1e12 * 1e3
def case(scale):
    return {"name": "toy/uniform", "hidden": D, "intermediate": I, "num_experts": 1, "rows": R, "padded_rows": P,
            "results": {"wgrad": {"ms": (flop_ms + byte_ms) * scale},              # the no-overlap line
                        "cublas_wgrad": {"ms": cublas_ms}, "wgrad_bf16": {"ms": 1.0},
                        "cublas_dgrad": {"ms": 1.0}, "dgrad_swiglu": {"ms": 1.0},
                        "fp8_wgrad": {"ms": max(fp8_flop_ms, fp8_byte_ms)},           # the floor
                        "fp8_wgrad_bf16": {"ms": 1.0}, "fp8_dgrad_swiglu": {"ms": 1.0}}}
json.dump({"cases": [case(0.9)]}, open(f"{sys.argv[1]}/a.json", "w"))
json.dump({"cases": [case(1.1)]}, open(f"{sys.argv[1]}/b.json", "w"))
broken = case(1.0); del broken["results"]["cublas_wgrad"]
json.dump({"cases": [broken]}, open(f"{sys.argv[1]}/broken.json", "w"))
PY

out=$(python3 "$script" --gemm "$work/a.json" --gemm "$work/b.json" --fp8-tflops 200 --tbs 0.1 2>&1) || fail "a good run exited $?: $out"
grep -qE "^\| toy/uniform \| weight gradients, fp32 \| .* \| 1\.00 \| 0% \|$" <<<"$out" ||
  fail "the median of 0.9x and 1.1x the no-overlap line is on it (overlap 0%):"$'\n'"$out"
grep -qE "^\| toy/uniform \| weight gradients, fp32 \| [0-9.]+ \| [0-9.]+ \(100\) \|" <<<"$out" ||
  fail "the bf16 rate is the run's cuBLAS rate over the real rows (100 TFLOP/s):"$'\n'"$out"
grep -qE "^\| toy/uniform \| FP8 weight gradients, fp32 \| [0-9.]+ \| [0-9.]+ \(200\) \| .* \| 100% \|$" <<<"$out" ||
  fail "a kernel at its floor (bytes the longer) overlaps wholly, at --fp8-tflops:"$'\n'"$out"

run_and_expect "a missing figure" 1 "overlap_lines.py: case toy/uniform: no 'cublas_wgrad' figure" "" \
  python3 "$script" --gemm "$work/broken.json"
run_and_expect "no case matches" 1 "overlap_lines.py: no case in the inputs matches --case 'kimi'" "" \
  python3 "$script" --gemm "$work/a.json" --case kimi
run_and_expect "a bad rate" 1 "overlap_lines.py: --fp8-tflops and --tbs must be positive, got 0.0 and 3.0" "" \
  python3 "$script" --gemm "$work/a.json" --fp8-tflops 0
finish test_overlap_lines
