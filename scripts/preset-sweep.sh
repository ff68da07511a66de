#!/usr/bin/env bash
# Issue 49's sweep, on one GPU in one device call: caracal-bench at W = 1 (--ep 1 --graph
# --bf16-weight-grads --rounds N) on
#   - issue 49's fine-grained shapes, D 2048 / I 768 (qwen3-30b-a3b): 128 and 16 local experts at
#     T = 8192 (16 at T = 4096 is the preset's row);
#   - every preset `caracal models --json` lists, its experts cut to what one GPU holds as
#     docs/PERF.md's runs do (an EP8 slice: E/8 local experts; DeepSeek-V3 32, Kimi K2 48, ...),
#     T = 4096; a preset plan and bench refuse (its experts are not the layer's: gpt-oss-120b) is
#     listed with the reason and not timed;
# then one table (scripts/lib/preset_sweep.py; markdown, for docs/PERF.md): per shape its forward
# and backward over their GEMMs alone, fused and v1 fwd+bwd ms and fused / v1 (and each pass's, timed
# apart), cuBLAS dense over both, and each row PASS or MISS against issue 49's targets on the
# medians of rounds: fused fwd+bwd <= v1's x MAX_FUSED_OVER_V1 (1.00: never slower), forward and
# backward <= MAX_OVER_GEMMS (1.06) x their GEMMs alone; a row whose v1 or GEMMs alone did not run
# is a MISS too.
# Usage: [QUICK=1] scripts/preset-sweep.sh [build-dir]     (build-dir holds caracal, caracal-bench
#        and COMMIT, as scripts/stage-gpu-build.sh stages them; default build)
#   QUICK=1: --rounds 1 --reps 5 (one round, noisier; checks the pipeline and gross regressions).
#   ROUNDS (3; QUICK 1), REPS (20; QUICK 5), WARMUP (5): caracal-bench's --rounds, --reps, --warmup.
#   CLOCK_TRACE=1: each bench under scripts/clock-trace.py (NVML: the SM clock, power and
#   clock-event reasons per phase), and a second table of each path's during its fwd+bwd replays.
#   STEP_TIMEOUT (150 s; QUICK 90): the bound on each bench; SWEEP_BUDGET_S (540): no bench starts
#   once the sweep has run this long, and none runs past it (those rows fail: "not run").
# Runtime (estimated, nine timed rows): per round and rep a bench runs ~20 forwards' worth of work
# (fused and v1: forward, backward after its forward, fwd+bwd, 7F each; cuBLAS and the GEMMs alone
# 3F each), after 11 warm-ups of >= 200 ms (~0.3 s each) and ~2 s of layers, graphs and NCCL set-up;
# each bench takes ~10 s more to start and validate. The forwards F at ~600 TFLOP/s: DeepSeek-V3
# 5.4 ms, Kimi K2 5.4, GLM-5 4.6, Qwen3.5 1.9, Qwen3-235B 2.1, V4-Pro 6.3, D 2048 / I 768 0.5, 1.0,
# 1.0 (sum ~28). A round of all rows: 20 reps x 20 x 28 ms = ~11 s timed + ~30 s of warm-ups +
# ~18 s of set-up; x 3 rounds + ~90 s of starts = ~4.5 minutes; QUICK=1 ~2.5 minutes. Each row's
# seconds are in the summary and the JSON, to check this against.
# Files go to $OUT if set, else /tmp/caracal-preset-sweep: preset-sweep.md (the table),
# preset-sweep.json (every row: its figures, verdict and bench JSON; for docs/results/),
# preset-sweep.log (every command's output) and details.tgz (bench_<row>.json, clock_<row>.json,
# models.json and the report's inputs, packed at exit: the device tool brings back at most 8
# files). The last line is
# "all passed" (exit 0) or "FAILED: <rows and steps>" (exit 1): a bench that fails or times out, a
# row not run, and a row that MISSes a target are each named there. A bad setting exits 2 with one
# line naming it.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="${1:-build}"
out="${OUT:-/tmp/caracal-preset-sweep}"
usage_error() {
  echo "preset-sweep: $1" >&2
  exit 2
}
quick="${QUICK:-0}"
case "$quick" in
  0) rounds=${ROUNDS:-3} reps=${REPS:-20} step_limit=${STEP_TIMEOUT:-150} ;;
  1) rounds=${ROUNDS:-1} reps=${REPS:-5} step_limit=${STEP_TIMEOUT:-90} ;;
  *) usage_error "QUICK: expected 0 or 1, got '$quick'" ;;
esac
warmup=${WARMUP:-5}
clock_trace=${CLOCK_TRACE:-0}
case "$clock_trace" in 0 | 1) ;; *) usage_error "CLOCK_TRACE: expected 0 or 1, got '$clock_trace'" ;; esac
budget=${SWEEP_BUDGET_S:-540}
for v in rounds reps warmup step_limit budget; do
  [[ "${!v}" =~ ^[0-9]+$ ]] || usage_error "$v: expected a whole number, got '${!v}'"
done
max_v1=${MAX_FUSED_OVER_V1:-1.00}
max_gemms=${MAX_OVER_GEMMS:-1.06}
for v in max_v1 max_gemms; do
  [[ "${!v}" =~ ^[0-9]+(\.[0-9]+)?$ ]] || usage_error "${v}: expected a number such as 1.06, got '${!v}'"
done
mkdir -p "$out"
source "$root/scripts/lib/pack-details.sh"
trap 'pack_details "$out" preset-sweep.md preset-sweep.json preset-sweep.log' EXIT
source "$root/scripts/lib/nccl-env.sh"
log="$out/preset-sweep.log"
manifest="$out/manifest.tsv"
: >"$log"
: >"$manifest"
summary_width=28
source "$root/scripts/lib/summary.sh"
lib="$root/scripts/lib/preset_sweep.py"
common=(--ep 1 --graph --bf16-weight-grads --rounds "$rounds" --reps "$reps" --warmup "$warmup")
start=$SECONDS

# row NAME ARGS...: one caracal-bench run, bounded by STEP_TIMEOUT and what is left of the budget;
# its outcome goes to the manifest (the report's input).
row() {
  local name=$1
  shift
  local json="$out/bench_${name// /_}.json" left=$((budget - (SECONDS - start)))
  if [ "$left" -lt 10 ]; then
    printf '%s\t%s\t0\t\t%s\n' "$name" "not run: the sweep's budget of $budget s was spent" "$*" >>"$manifest"
    echo "[$((SECONDS - start)) s] $name: not run (budget spent)"
    return
  fi
  local limit=$((left < step_limit ? left : step_limit))
  echo "==== $name: caracal-bench $* ${common[*]} --json $json" >>"$log"
  local first t0=$SECONDS status what
  first=$(($(wc -l <"$log") + 1))
  local trace_json="$out/clock_${name// /_}.json" trace=()
  rm -f "$json" "$trace_json"
  [ "$clock_trace" = 1 ] && trace=(python3 "$root/scripts/clock-trace.py" --interval-ms 20 --json "$trace_json" --)
  timeout -k 10 "$limit" "${trace[@]}" "$build/caracal-bench" "$@" "${common[@]}" --json "$json" >>"$log" 2>&1
  status=$?
  case $status in
    0) what=ok ;;
    124 | 137) what="TIMED OUT after $limit s" ;;
    *) what="FAILED, exit $status: $(tail -n "+$first" "$log" | grep -m1 -E 'error|Error' | cut -c1-160)" ;;
  esac
  echo >>"$log"
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$what" "$((SECONDS - t0))" "$json" "$*" >>"$manifest"
  echo "[$((SECONDS - start)) s] $name: $what ($((SECONDS - t0)) s)"
}

gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1 | head -n 1)
echo "preset-sweep: rounds $rounds, reps $reps, warm-up $warmup, step bound $step_limit s, budget $budget s"
# Issue 49's fine-grained shapes first: what the budget leaves unrun, if anything, is a preset.
a3b="--model qwen3-30b-a3b"
# shellcheck disable=SC2086
row "qwen3-30b-a3b E128 T8192" $a3b --experts 128 --tokens 8192
# shellcheck disable=SC2086
row "qwen3-30b-a3b E16 T8192" $a3b --experts 16 --tokens 8192
if "$build/caracal" models --json >"$out/models.json" 2>>"$log" &&
  python3 "$lib" rows "$out/models.json" >"$out/rows.tsv" 2>>"$log"; then
  while IFS=$'\t' read -r name kind rest; do
    if [ "$kind" = refused ]; then
      printf '%s\t%s\t0\t\t\n' "$name" "refused: $rest" >>"$manifest"
    else
      # shellcheck disable=SC2086  # the row's arguments split into words
      row "$name" $rest
    fi
  done <"$out/rows.tsv"
else
  record_failed "caracal models" "FAILED: no preset list (see preset-sweep.log)"
fi

echo
echo "==== Caracal preset sweep (issue 49): $(date -u +%F) commit $(cat "$build/COMMIT" 2>/dev/null || echo unknown)," \
  "$((SECONDS - start)) s"
printf '%-28s %s\n' "GPU" "$gpu" "libnccl.so.2" "$nccl_found"
quick_flag=()
[ "$quick" = 1 ] && quick_flag=(--quick)
if python3 "$lib" report "$manifest" "$out" --commit "$(cat "$build/COMMIT" 2>/dev/null || echo unknown)" \
  --gpu "$gpu" --rounds "$rounds" --reps "$reps" --warmup "$warmup" "${quick_flag[@]}" \
  --max-fused-over-v1 "$max_v1" --max-over-gemms "$max_gemms"; then
  echo
  while IFS=$'\t' read -r name verdict text; do
    case $verdict in
      PASS | REFUSED) record "$name" "$text" ;;
      *) record_failed "$name" "$text" ;;
    esac
  done <"$out/verdicts.tsv"
else
  record_failed "report" "FAILED: scripts/lib/preset_sweep.py report (no row checked)"
fi
print_summary
verdict
