#!/usr/bin/env bash
# A/B of two builds on the device machine in one call: scripts/ab-check.sh OLD NEW
# OLD and NEW each hold caracal-bench, caracal-soak, caracal_gemm_bench and COMMIT (NEW: a staged
# build, scripts/stage-gpu-build.sh; OLD: the same binaries copied from an earlier staging).
#   0. AB_TESTS (optional): NEW's GPU test binaries of these names (NEW/tests/NAME), each bounded by
#      AB_TEST_TIMEOUT s (90): for a build whose kernels may hang or be wrong, a failure stops the
#      check here, before the benchmarks spend the call's time;
#   1. bitwise: caracal-soak of both with one seed (loopback W = 4, changing routings, shared
#      expert, fp32 and bf16 weight gradients): every output of every step must have the same
#      checksum, i.e. the two builds compute the same bits;
#   2. the layer: caracal-bench of both, alternated old/new ROUNDS times (DeepSeek-V3, 32 experts,
#      T = 4096, forward + backward; AB_LAYER_ARGS: more of its arguments, e.g. "--graph
#      --bf16-weight-grads");
#   3. the grouped GEMMs: caracal_gemm_bench of both, alternated the same way (GEMM_CASES=none:
#      not run, for builds staged without it; GEMM_ARGS: more of its arguments, e.g. --no-fp8);
# then a table of medians over the rounds (each run's own figure is a median of --reps runs; the
# layer's v1 rows too where the bench timed v1).
# Every soak and benchmark run is bounded by AB_TIMEOUT s (300). The last line is "FAILED: <steps>"
# (exit status 1: a run failed or the checksums differ) or "all passed"
# (tests/scripts/test_ab_check.sh checks this logic with stub builds).
# Logs and JSON: $OUT/ab-logs.tgz when OUT is set.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
old="${1:?usage: scripts/ab-check.sh OLD NEW}"
new="${2:?usage: scripts/ab-check.sh OLD NEW}"
rounds="${ROUNDS:-3}"
gemm_cases=""
for c in ${GEMM_CASES:-deepseek-v3/uniform kimi-k2/uniform qwen3.5-397b/uniform}; do gemm_cases+=" --case $c"; done
logs=$(mktemp -d)
build="$new"
source "$root/scripts/lib/nccl-env.sh"
summary_width=40
source "$root/scripts/lib/summary.sh"
run() {  # run NAME LIMIT CMD...: logs to NAME.log
  local name=$1 limit=$2 rc
  shift 2
  timeout "$limit" "$@" >"$logs/$name.log" 2>&1
  rc=$?
  [ "$rc" -eq 0 ] || { tail -n 20 "$logs/$name.log"; record_failed "$name" "FAILED (rc $rc)"; }
  return "$rc"
}

summarize() {  # the table and the verdict last; its status is the verdict's
  if [ -n "${OUT:-}" ]; then
    { mkdir -p "$OUT" && tar czf "$OUT/ab-logs.tgz" -C "$logs" .; } || record_failed "logs" "not written to $OUT"
  fi
  echo
  echo "==== A/B: old $(cat "$old/COMMIT" 2>/dev/null) vs new $(cat "$new/COMMIT" 2>/dev/null), $(date -u +%F) ===="
  print_summary
  verdict
}
limit="${AB_TIMEOUT:-300}"

# ---- 0. the new build's tests first ---------------------------------------------------------------
tests_failed=0
for t in ${AB_TESTS:-}; do
  if CARACAL_REQUIRE_GPU=1 run "$t" "${AB_TEST_TIMEOUT:-90}" "$new/tests/$t" --gtest_brief=1; then
    record "$t" "passed"
  else
    tests_failed=1
  fi
done
if [ "$tests_failed" -ne 0 ]; then
  record "benchmarks" "not run: a test of the new build failed"
  summarize
  exit 1
fi

# ---- 1. the same bits ---------------------------------------------------------------------------
for side in old new; do
  dir=${!side}
  run "soak_$side" "$limit" "$dir/caracal-soak" --backend loopback --ep 4 --steps "${SOAK_STEPS:-1000}" --seed 2026 \
    --checksums "$logs/soak_$side.txt"
done
if [ -s "$logs/soak_old.txt" ] && cmp -s "$logs/soak_old.txt" "$logs/soak_new.txt"; then
  record "soak checksums old vs new" "bitwise identical ($(wc -l <"$logs/soak_new.txt") lines)"
else
  record_failed "soak checksums old vs new" "DIFFER"
fi

# ---- 2, 3. speed, alternated ---------------------------------------------------------------------
for round in $(seq 1 "$rounds"); do
  for side in old new; do
    dir=${!side}
    # shellcheck disable=SC2086  # AB_LAYER_ARGS splits into arguments
    run "layer_${side}_$round" "$limit" "$dir/caracal-bench" --model deepseek-v3 --experts 32 --ep 1 --tokens 4096 \
      --reps 20 --quiet --no-validate ${AB_LAYER_ARGS:-} --json "$logs/layer_${side}_$round.json"
    [ "${GEMM_CASES:-}" = none ] && continue
    # shellcheck disable=SC2086  # GEMM_ARGS splits into arguments
    run "gemm_${side}_$round" "$limit" "$dir/caracal_gemm_bench" --reps 20 $gemm_cases ${GEMM_ARGS:-} \
      --json "$logs/gemm_${side}_$round.json"
  done
done

python3 - "$logs" "$rounds" "${AB_LAYER_ARGS:-}" <<'PY'
import glob, json, os, statistics, sys
logs, rounds, layer_args = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def load(pattern):
    return [json.load(open(p)) for p in sorted(glob.glob(os.path.join(logs, pattern)))]
def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")
print(f"layer, DeepSeek-V3 32 experts T=4096 W=1{' ' + layer_args if layer_args else ''} (ms, median of {rounds} alternated runs): old | new | new/old")
for p in ("forward", "backward", "fwd_bwd"):
    o = median([r["runs"][0][p]["ms"] for r in load("layer_old_*.json")])
    n = median([r["runs"][0][p]["ms"] for r in load("layer_new_*.json")])
    print(f"  {p:10s} {o:8.3f} | {n:8.3f} | {n / o:.3f}")
def v1_ms(side, p):  # v1's launches in the same runs, where the bench timed them
    return median([r["runs"][0].get("v1", {}).get(p, {}).get("ms") for r in load(f"layer_{side}_*.json")])
for p in ("forward", "backward", "fwd_bwd"):
    o, n = v1_ms("old", p), v1_ms("new", p)
    if o == o and n == n:  # not NaN
        print(f"  v1 {p:7s} {o:8.3f} | {n:8.3f} | {n / o:.3f}")
print("grouped GEMMs (ms): old | new | new/old")
rows = {}
for side in ("old", "new"):
    for run in load(f"gemm_{side}_*.json"):
        for case in run["cases"]:
            for k, t in case["results"].items():
                rows.setdefault((case["name"], k), {}).setdefault(side, []).append(t["ms"])
for (case, k), v in sorted(rows.items()):
    if k.startswith("cublas"):
        continue
    o, n = median(v.get("old", [])), median(v.get("new", []))
    print(f"  {case:22s} {k:16s} {o:8.3f} | {n:8.3f} | {n / o:.3f}")
PY

summarize
