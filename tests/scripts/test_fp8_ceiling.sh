#!/usr/bin/env bash
# bench/python/fp8_ceiling.py (arithmetic, no GPU): the ceilings of a made-up case worked by hand
# (its shared expert in bf16, then in FP8),
# the committed figures of 2026-12-06 (the DeepSeek-V3 row and its ceilings below issue 47's 1.35x
# fwd+bwd while the weights are quantized every step), and the refusals: a bf16 layer run, a model
# without a GEMM case.
source "$(dirname "$0")/script_test_lib.sh"
script="$root/bench/python/fp8_ceiling.py"

python3 - "$script" "$work" <<'PY' || fail "a case worked by hand"
import json, subprocess, sys
script, tmp = sys.argv[1], sys.argv[2]
names = ("up_gate_swiglu", "down", "dgrad_swiglu", "dx", "wgrad")
results = {k: {"ms": v} for k, v in zip(names, (4.0, 2.0, 2.0, 4.0, 8.0))}           # bf16: 20 ms
results.update({f"fp8_{k}": {"ms": v} for k, v in zip(names, (2.0, 1.0, 1.5, 2.5, 6.0))})  # FP8: 13 ms
# 1,000 routed rows of I 100 against 100 tokens of shared I 200: the shared expert is 0.2 of the routed FLOPs.
gemm = {"cases": [{"name": "m/uniform", "model": "m", "counts": [500, 500], "results": results}]}
layer = {"precision": "fp8", "ep": 1, "model": "m", "device": {"name": "test"},
         "layer": {"hidden": 64, "intermediate": 100, "shared_intermediate": 200, "shared_experts": 1,
                   "local_experts": 2},
         "layer_options": {"fp8": {"fp8_weight_gradients": True}},
         "runs": [{"tokens_per_rank": 100, "fp8_weight_quantization_ms": 2.0,
                   "forward": {"ms": 5.0}, "fwd_bwd": {"ms": 20.0},
                   "bf16_fused": {"forward": {"ms": 9.0}, "fwd_bwd": {"ms": 30.0}}}]}
for name, obj in (("g.json", gemm), ("l.json", layer)):
    with open(f"{tmp}/{name}", "w") as f:
        json.dump(obj, f)
subprocess.run([sys.executable, script, "--layer", f"{tmp}/l.json", "--gemm", f"{tmp}/g.json", "--json",
                f"{tmp}/out.json"], check=True, capture_output=True)
row = json.load(open(f"{tmp}/out.json"))["rows"][0]
near = lambda a, b: abs(a - b) < 1e-9  # noqa: E731
# forward floor 2 + 1 + 0.2 * 6 = 4.2; backward 1.5 + 2.5 + 6 + 0.2 * 14 = 12.8; + 2 ms of weights
assert near(row["gemms_forward_ms"], 4.2) and near(row["gemms_backward_ms"], 12.8), row
assert near(row["ceiling"][0], 9.0 / 4.2) and near(row["ceiling"][1], 30.0 / 19.0), row
assert near(row["ceiling_quantization_amortized"][1], 30.0 / 17.0), row
# at the targets: (4 + 2 + 2 + 4) / 1.6 + 8 / 1.5 + 0.2 * 20, then + 2
assert near(row["ceiling_gemm_targets"][1], 30.0 / (12 / 1.6 + 8 / 1.5 + 4.0 + 2.0)), row
assert near(row["measured"][0], 9.0 / 5.0) and near(row["measured"][1], 1.5), row
assert row["shared_precision"] == "bf16", row  # a run that does not say
# The shared expert in FP8 (layer.shared_precision): its GEMMs at the routed FP8 rate, and at the
# targets like the routed ones. Forward 1.2 * 3 = 3.6; backward 10 + 0.2 * 10 = 12.
layer["layer"]["shared_precision"] = "fp8"
with open(f"{tmp}/l8.json", "w") as f:
    json.dump(layer, f)
subprocess.run([sys.executable, script, "--layer", f"{tmp}/l8.json", "--gemm", f"{tmp}/g.json", "--json",
                f"{tmp}/out8.json"], check=True, capture_output=True)
row = json.load(open(f"{tmp}/out8.json"))["rows"][0]
assert near(row["gemms_forward_ms"], 3.6) and near(row["gemms_backward_ms"], 12.0), row
assert near(row["ceiling"][1], 30.0 / 17.6) and row["shared_precision"] == "fp8", row
assert near(row["ceiling_gemm_targets"][0], 9.0 / (1.2 * 6 / 1.6)), row
assert near(row["ceiling_gemm_targets"][1], 30.0 / (1.2 * (12 / 1.6 + 8 / 1.5) + 2.0)), row
PY

results="$root/docs/results"
out=$(python3 "$script" --layer "$results/2026-12-06-fp8-check-layer-deepseek-v3-e32-t4096-h100-9959f2c.json" \
  --gemm "$results/2026-12-06-fp8-check-gemm-bench-h100-9959f2c.json" 2>&1) || fail "the committed figures: exit $?"$'\n'"$out"
grep -q "^| deepseek-v3 E32 T4096 | 1.257 / 1.037 | 1.478 / 1.161 | 1.542 / 1.276 | 1.478 / 1.336 |" <<<"$out" ||
  fail "the DeepSeek-V3 row of 2026-12-06"$'\n'"$out"

python3 -c "import json,sys; d=json.load(open(sys.argv[1])); d['precision']='bf16'; json.dump(d, open(sys.argv[2],'w'))" \
  "$results/2026-12-06-fp8-check-layer-deepseek-v3-e32-t4096-h100-9959f2c.json" "$work/bf16.json"
run_and_expect "a bf16 run" 1 "fp8_ceiling.py: $work/bf16.json: expected a caracal-bench run at --ep 1 with --precision fp8" "" \
  python3 "$script" --layer "$work/bf16.json" --gemm "$results/2026-12-06-fp8-check-gemm-bench-h100-9959f2c.json"
run_and_expect "no GEMM case" 1 \
  "fp8_ceiling.py: $results/2026-12-06-fp8-check-layer-deepseek-v3-e32-t4096-h100-9959f2c.json: no uniform GEMM case of deepseek-v3 in the --gemm JSONs" "" \
  python3 "$script" --layer "$results/2026-12-06-fp8-check-layer-deepseek-v3-e32-t4096-h100-9959f2c.json" --gemm "$work/g.json"
finish test_fp8_ceiling
