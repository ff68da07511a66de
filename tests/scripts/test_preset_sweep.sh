#!/usr/bin/env bash
# scripts/preset-sweep.sh's own logic, with a stub build (no GPU): the rows it runs (each preset
# `caracal models --json` gives, E/8 experts, after issue 49's fine-grained shapes) with the sweep's
# arguments; a refused preset listed with its reason, not run; a passing sweep exits 0 with "all
# passed" and writes the table and the combined JSON; a row where fused is slower than v1, or a
# pass over its GEMMs alone past 1.06, or v1 not run, is a MISS; a bench that fails or times out, or
# a row the budget leaves unrun, is a failed step; each of those exits 1 naming the rows on the
# last line. CLOCK_TRACE=1 runs each bench under scripts/clock-trace.py (a stub NVML here) and adds a
# table of each path's clocks.
source "$(dirname "$0")/script_test_lib.sh"
stub_device_tools

# The stub build: `caracal models --json` lists alpha (64 experts), beta (refused) and
# qwen3-30b-a3b (STUB_MODELS_RC fails it). caracal-bench logs its arguments and writes caracal
# bench's JSON; for arguments containing STUB_FAIL it fails, STUB_HANG hangs, STUB_SLOW makes fused
# slower than v1, STUB_BWD the backward 1.5x its GEMMs alone, STUB_NO_V1 skips v1.
build="$work/build"
mkdir -p "$build"
echo stub-commit >"$build/COMMIT"
cat >"$build/caracal" <<'STUB'
#!/usr/bin/env bash
[ "$*" = "models --json" ] || { echo "caracal: error: stub: unexpected '$*'" >&2; exit 2; }
[ "${STUB_MODELS_RC:-0}" = 0 ] || { echo "caracal: error: stub models failure" >&2; exit "$STUB_MODELS_RC"; }
cat <<'JSON'
{"presets": [
  {"name": "alpha", "hidden": 4096, "intermediate": 1024, "experts": 64, "top_k": 8, "shared_intermediate": 1024, "supported": true},
  {"name": "beta", "hidden": 2880, "intermediate": 2880, "experts": 128, "top_k": 4, "shared_intermediate": 0, "supported": false,
   "unsupported": "its experts have biases and a clamped SwiGLU"},
  {"name": "qwen3-30b-a3b", "hidden": 2048, "intermediate": 768, "experts": 128, "top_k": 8, "shared_intermediate": 0, "supported": true}
]}
JSON
STUB
cat >"$build/caracal-bench" <<'STUB'
#!/usr/bin/env bash
args=" $* "
echo "$*" >>"$(dirname "$0")/bench-args"
has() { [ -n "${1:-}" ] && [[ "$args" == *"$1"* ]]; }
has "${STUB_HANG:-}" && exec sleep 30
if has "${STUB_FAIL:-}"; then echo "caracal bench: error: stub failure"; exit 1; fi
for path in fused v1; do  # the progress lines a phase of scripts/clock-trace.py starts at
  echo "caracal bench: T=1 ($path forward): forward+backward" >&2
  sleep 0.1
done
while [ $# -gt 0 ]; do
  case "$1" in --json) out=$2 ;; --experts) experts=$2 ;; --tokens) tokens=$2 ;; esac
  shift
done
fused=3.0 v1='{"forward": {"ms": 1.0}, "backward": {"ms": 2.1}, "fwd_bwd": {"ms": 3.1}}' bwd=1.04
has "${STUB_SLOW:-}" && fused=3.41
has "${STUB_BWD:-}" && bwd=1.5
has "${STUB_NO_V1:-}" && v1='{"skipped": "does not fit: stub"}'
cat >"$out" <<JSON
{"tool": "caracal bench", "layer": {"hidden": 2048, "intermediate": 768, "top_k": 8, "shared_intermediate": 0, "local_experts": $experts},
 "runs": [{"tokens_per_rank": $tokens, "forward": {"ms": 1.0}, "backward": {"ms": 2.0}, "fwd_bwd": {"ms": $fused}, "v1": $v1,
   "baselines": {"nccl_exchange_plus_gemms": {"available": true, "forward_over_gemms_alone": 1.03, "backward_over_gemms_alone": $bwd},
                 "cublas_dense": {"available": true, "fwd_bwd_ms": 1.8}}}]}
JSON
echo "stub table"
STUB
chmod +x "$build/caracal" "$build/caracal-bench"

run_sweep() {  # run_sweep ENV...: the sweep's output in $out_text, exit status in $rc, files in $work/out
  rm -rf "$work/out" "$build/bench-args"
  out_text=$(env "$@" OUT="$work/out" bash "$root/scripts/preset-sweep.sh" "$build" 2>&1)
  rc=$?
}
check() {  # check NAME WANT_RC LAST_LINE [PATTERN...] -- ENV...
  local name=$1 want_rc=$2 last=$3
  shift 3
  local patterns=()
  while [ "$1" != -- ]; do
    patterns+=("$1")
    shift
  done
  shift
  run_sweep "$@"
  [ "$rc" -eq "$want_rc" ] || fail "$name: exit $rc, want $want_rc"$'\n'"$out_text"
  [ "$(tail -n 1 <<<"$out_text")" = "$last" ] || fail "$name: last line is not '$last' in"$'\n'"$out_text"
  local p
  for p in "${patterns[@]}"; do
    grep -qE -- "$p" <<<"$out_text" || fail "$name: no '$p' in"$'\n'"$out_text"
  done
}

check "a passing sweep" 0 "all passed" \
  '^\| alpha E8 T4096 \| 2048 / 768 / 8 / 0 \| 1\.030 \| 1\.040 \| 3\.000 \| 3\.100 \| 0\.968 \| 1\.000, 0\.952 \| 1\.000, 1\.000 \| 0\.60 \| 0\.58 \| PASS \|$' \
  '^\| beta \| - \|.*\| refused: its experts have biases and a clamped SwiGLU \|$' \
  '^qwen3-30b-a3b E128 T8192 +PASS \([0-9]+ s\)$' '^beta +refused: its experts have biases' -- QUICK=0
# The rows, in order, with the sweep's arguments.
want_args="--model qwen3-30b-a3b --experts 128 --tokens 8192 --ep 1 --graph --bf16-weight-grads --rounds 3 --reps 20 --warmup 5 --json $work/out/bench_qwen3-30b-a3b_E128_T8192.json
--model qwen3-30b-a3b --experts 16 --tokens 8192 --ep 1 --graph --bf16-weight-grads --rounds 3 --reps 20 --warmup 5 --json $work/out/bench_qwen3-30b-a3b_E16_T8192.json
--model alpha --experts 8 --tokens 4096 --ep 1 --graph --bf16-weight-grads --rounds 3 --reps 20 --warmup 5 --json $work/out/bench_alpha_E8_T4096.json
--model qwen3-30b-a3b --experts 16 --tokens 4096 --ep 1 --graph --bf16-weight-grads --rounds 3 --reps 20 --warmup 5 --json $work/out/bench_qwen3-30b-a3b_E16_T4096.json"
[ "$(cat "$build/bench-args" 2>/dev/null)" = "$want_args" ] ||
  fail "the benches' arguments:"$'\n'"$(cat "$build/bench-args" 2>/dev/null)"$'\n'"want:"$'\n'"$want_args"
# What comes back from a device call (at most 8 files): the table, the JSON, the log and the rest packed.
[ "$(cd "$work/out" && find . -type f | sort | tr '\n' ' ')" = "./details.tgz ./preset-sweep.json ./preset-sweep.log ./preset-sweep.md " ] ||
  fail "the output folder: $(cd "$work/out" && find . -type f | sort | tr '\n' ' ')"
tar -tzf "$work/out/details.tgz" | grep -x bench_alpha_E8_T4096.json >/dev/null || fail "details.tgz lacks bench_alpha_E8_T4096.json"
# The combined JSON: every row, its verdict and its bench's JSON; the table beside it.
python3 - "$work/out/preset-sweep.json" <<'PY' || fail "the combined JSON: $(head -c 2000 "$work/out/preset-sweep.json" 2>&1)"
import json, sys
j = json.load(open(sys.argv[1]))
rows = [(r["name"], r["verdict"]) for r in j["rows"]]
want = [("qwen3-30b-a3b E128 T8192", "PASS"), ("qwen3-30b-a3b E16 T8192", "PASS"), ("alpha E8 T4096", "PASS"),
        ("beta", "REFUSED"), ("qwen3-30b-a3b E16 T4096", "PASS")]
assert rows == want, rows
assert j["commit"] == "stub-commit" and j["rounds"] == 3 and j["reps"] == 20 and not j["quick"], j
assert j["targets"] == {"max_fused_over_v1": 1.0, "max_forward_over_gemms_alone": 1.06,
                        "max_backward_over_gemms_alone": 1.06}, j["targets"]
alpha = j["rows"][2]
assert alpha["bench"]["layer"]["local_experts"] == 8 and alpha["json"] == "bench_alpha_E8_T4096.json", alpha
assert abs(alpha["fused_over_v1"] - 3.0 / 3.1) < 1e-9
assert (alpha["fused_backward_ms"], alpha["v1_backward_ms"]) == (2.0, 2.1), alpha
assert abs(alpha["backward_fused_over_v1"] - 2.0 / 2.1) < 1e-9 and alpha["forward_fused_over_v1"] == 1.0, alpha
assert alpha["fused_step_over_passes"] == 1.0 and abs(alpha["v1_step_over_passes"] - 1.0) < 1e-9, alpha
PY
grep -q '^| qwen3-30b-a3b E16 T8192 |' "$work/out/preset-sweep.md" 2>/dev/null || fail "no table in preset-sweep.md"

check "fused slower than v1" 1 "FAILED: qwen3-30b-a3b E128 T8192" \
  '^\| qwen3-30b-a3b E128 T8192 \|.*\| 1\.100 \|.*\| MISS: fused/v1 1\.100 > 1\.00 \|$' \
  '^qwen3-30b-a3b E128 T8192 +MISS: fused/v1 1\.100 > 1\.00 \([0-9]+ s\)$' -- STUB_SLOW="--experts 128 --tokens 8192"
check "a bench that fails" 1 "FAILED: alpha E8 T4096" \
  '^alpha E8 T4096 +FAILED, exit 1: caracal bench: error: stub failure$' '^\| alpha E8 T4096 \| - \|' -- \
  STUB_FAIL="--model alpha"
check "a bench that hangs" 1 "FAILED: qwen3-30b-a3b E16 T8192" \
  '^qwen3-30b-a3b E16 T8192 +TIMED OUT after 1 s$' -- STUB_HANG="--experts 16 --tokens 8192" STEP_TIMEOUT=1
check "the backward over its GEMMs alone" 1 "FAILED: alpha E8 T4096" '^alpha E8 T4096 +MISS: bwd/GEMMs 1\.500 > 1\.06' -- \
  STUB_BWD="--model alpha"
check "v1 not run" 1 "FAILED: qwen3-30b-a3b E16 T4096" \
  '^qwen3-30b-a3b E16 T4096 +MISS: v1 not run: does not fit: stub' -- STUB_NO_V1="--experts 16 --tokens 4096"
check "the targets set looser" 0 "all passed" '^alpha E8 T4096 +PASS' -- STUB_SLOW="--model alpha" MAX_FUSED_OVER_V1=1.2
check "no preset list" 1 "FAILED: caracal models" '^caracal models +FAILED' '^qwen3-30b-a3b E128 T8192 +PASS' -- \
  STUB_MODELS_RC=3
check "the budget spent" 1 \
  "FAILED: qwen3-30b-a3b E128 T8192, qwen3-30b-a3b E16 T8192, alpha E8 T4096, qwen3-30b-a3b E16 T4096" \
  "^alpha E8 T4096 +not run: the sweep's budget of 0 s was spent$" -- SWEEP_BUDGET_S=0
[ ! -s "$build/bench-args" ] || fail "the budget spent: a bench ran: $(cat "$build/bench-args")"
check "QUICK=1" 0 "all passed" "^preset-sweep: rounds 1, reps 5," -- QUICK=1
grep -q -- "--rounds 1 --reps 5 --warmup 5" "$build/bench-args" || fail "QUICK=1: $(cat "$build/bench-args")"
# CLOCK_TRACE=1, with a stub NVML: each bench under scripts/clock-trace.py, a table of each path's
# clocks during its fwd+bwd replays, the row's figures in the JSON.
stub_nvml "$work/nvml"
check "CLOCK_TRACE=1" 0 "all passed" \
  '^\| alpha E8 T4096 \| 1755 / 1755 \| 690 / 690 \| sw power cap 100% / sw power cap 100% \|$' -- \
  CLOCK_TRACE=1 PYTHONPATH="$work/nvml"
python3 - "$work/out/preset-sweep.json" <<'PY' || fail "CLOCK_TRACE=1: the JSON's clocks"
import json, sys
rows = {r["name"]: r for r in json.load(open(sys.argv[1]))["rows"]}
alpha = rows["alpha E8 T4096"]
assert alpha["fused_fwd_bwd_sm_mhz"] == 1755 and alpha["v1_fwd_bwd_watts"] == 690, alpha
assert alpha["v1_fwd_bwd_reasons"] == {"sw power cap": 1.0}, alpha
assert "fused_fwd_bwd_sm_mhz" not in rows["beta"], rows["beta"]
PY
check "a bad CLOCK_TRACE" 2 "preset-sweep: CLOCK_TRACE: expected 0 or 1, got 'yes'" -- CLOCK_TRACE=yes
check "a bad QUICK" 2 "preset-sweep: QUICK: expected 0 or 1, got 'yes'" -- QUICK=yes
check "a bad ROUNDS" 2 "preset-sweep: rounds: expected a whole number, got 'x'" -- ROUNDS=x
finish test_preset_sweep
