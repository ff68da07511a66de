#!/usr/bin/env bash
# The reliability figures (issue 11), one call on the device machine over a staged build
# (scripts/stage-gpu-build.sh): scripts/reliability-check.sh [build-dir]
#   1. the soak: caracal-soak twice with one seed (1,000 steps, changing routing, a step in every 50
#      against the fp64 reference; loopback W = 4, and NCCL W = 2 where two GPUs exist): no error,
#      no failed check, memory flat, identical checksums; then loopback W = 4 with v1 and the fused
#      path compared every step (--path both), eagerly and again as CUDA-graph replays with a stall
#      and reset() mid-soak (--graph --stall-at): both runs pass and write the same checksums;
#   2. what the exchange's SM cap costs: caracal_transfer_bench with the default cap (all but 16
#      SMs) and with every SM;
#   3. the same for the whole layer: caracal bench, DeepSeek-V3 with 32 experts, T = 4096, both caps;
# then a summary, and last "FAILED: <steps>" or "all passed" (exit status 1 when a run failed, the
# soak's two runs differ, or the logs could not be written). Logs and JSON:
# $OUT/reliability-logs.tgz when OUT is set. SOAK=0 leaves the soak out; SOAK_STEPS (>= 3) sets its
# steps.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="${1:-build}"
logs=$(mktemp -d)
source "$root/scripts/lib/nccl-env.sh"
gpus=$(nvidia-smi -L | wc -l)
summary_width=44
source "$root/scripts/lib/summary.sh"
run() {  # run NAME LIMIT CMD...: logs to NAME.log, records the last line or FAILED
  local name=$1 limit=$2 rc
  shift 2
  timeout "$limit" "$@" >"$logs/$name.log" 2>&1
  rc=$?
  if [ "$rc" -eq 0 ]; then record "$name" "ok: $(tail -n 1 "$logs/$name.log")"; else
    tail -n 20 "$logs/$name.log"
    record_failed "$name" "FAILED (rc $rc, see $name.log)"
  fi
}

# ---- 1. soak ------------------------------------------------------------------------------------
soak() {  # soak NAME ARGS... [-- MORE...]: two runs, same seed, the second with MORE too; checksums must match
  local name=$1 args=() more=()
  shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do args+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  more=("$@")
  run "${name}_run1" 600 "$build/caracal-soak" --seed 2026 --checksums "$logs/$name.1.txt" --json "$logs/$name.1.json" "${args[@]}"
  run "${name}_run2" 600 "$build/caracal-soak" --seed 2026 --checksums "$logs/$name.2.txt" --json "$logs/$name.2.json" "${args[@]}" ${more[@]+"${more[@]}"}
  local second=""
  [ "${#more[@]}" -gt 0 ] && second="; the second with ${more[*]}"
  if cmp -s "$logs/$name.1.txt" "$logs/$name.2.txt" && [ -s "$logs/$name.1.txt" ]; then
    record "$name: two runs" "bitwise identical ($(wc -l <"$logs/$name.1.txt") checksum lines$second)"
  else
    record_failed "$name: two runs" "DIFFER$second"
  fi
  grep -E "memory|steps/s|non-finite|reference|v1 against|graphs|stall|FAILED" "$logs/${name}_run2.log" | sed 's/^/    /'
}
if [ "${SOAK:-1}" = 1 ]; then
  steps=${SOAK_STEPS:-1000}
  soak soak_loopback_W4 --backend loopback --ep 4 --steps "$steps"
  soak soak_loopback_W4_checks --backend loopback --ep 4 --steps "$steps" --reference-every 50 --path both \
    -- --graph --stall-at $((steps / 2 + 1))
  [ "$gpus" -ge 2 ] && soak soak_nccl_W2 --backend nccl --ep 2 --steps "$steps"
fi

# ---- 2. the exchange alone ----------------------------------------------------------------------
sms=$(python3 -c 'import torch; print(torch.cuda.get_device_properties(0).multi_processor_count)' 2>/dev/null)
[[ "$sms" =~ ^[0-9]+$ ]] || sms=132
# default twice, first and last: the spread between them is the noise of the comparison.
for variant in "default:" "all_sms:--exchange-sms $sms" "default_again:"; do
  name=${variant%%:*}
  run "transfers_$name" 400 "$build/caracal_transfer_bench" --model deepseek-v3 --routing uniform --world 8,1 \
    --tokens 4096 --no-baseline --seed 7 --json "$logs/transfers_$name.json" ${variant#*:}
done
python3 - "$logs" <<'PY'
import json, sys, os
logs = sys.argv[1]
rows = {}
names = ("default", "all_sms", "default_again")
for name in names:
    path = os.path.join(logs, f"transfers_{name}.json")
    if not os.path.exists(path):
        continue
    for case in json.load(open(path)).get("cases", []):
        rows.setdefault((case["world"], "schedule (us)"), {})[name] = case.get("schedule_us")
        for line in case.get("passes", []):
            rows.setdefault((case["world"], line.get("pass")), {})[name] = line.get("ms")
print("exchange passes, DeepSeek-V3 uniform T=4096 (ms): " + " | ".join(names))
for (world, p), v in sorted(rows.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1]))):
    print(f"  W={world} {p:22s} " + " | ".join(f"{v.get(n, float('nan')):.3f}" for n in names))
PY

# ---- 3. the whole layer -----------------------------------------------------------------------------
for variant in "default:" "all_sms:--exchange-sms $sms" "default_again:"; do
  name=${variant%%:*}
  run "layer_$name" 400 "$build/caracal" bench --model deepseek-v3 --experts 32 --ep 1 --tokens 4096 --reps 20 \
    --quiet --no-validate --json "$logs/layer_$name.json" ${variant#*:}
  grep -E "forward|backward|fwd" "$logs/layer_$name.log" | head -4 | sed "s/^/    $name /"
done

if [ -n "${OUT:-}" ]; then
  { mkdir -p "$OUT" && tar czf "$OUT/reliability-logs.tgz" -C "$logs" .; } || record_failed "logs" "not written to $OUT"
fi
echo
echo "==== Caracal reliability check: $(date -u +%F) commit $(cat "$build/COMMIT" 2>/dev/null || echo unknown) ===="
print_summary
verdict
