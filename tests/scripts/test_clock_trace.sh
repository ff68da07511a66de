#!/usr/bin/env bash
# scripts/clock-trace.py with a stub pynvml (no GPU): the command's output passed through and its
# exit status returned; a phase per progress line (and "(start)" before the first), each with the
# clocks, power and clock-event reasons of its busy samples, in the table and the JSON; NVML that
# cannot start, a missing command and a bad --phase each exit 2 naming why; stopped by `timeout`,
# it stops the command.
source "$(dirname "$0")/script_test_lib.sh"
stub_nvml "$work/stub"
export PYTHONPATH="$work/stub${PYTHONPATH:+:$PYTHONPATH}"
trace="$root/scripts/clock-trace.py"
bench='echo "caracal bench: T=8 (fused forward): forward"; sleep 0.3; echo "caracal bench: T=8 (v1 forward): forward+backward"; sleep 0.3; echo done; exit 3'

out=$(python3 "$trace" --interval-ms 5 --json "$work/trace.json" -- bash -c "$bench" 2>&1)
rc=$?
[ "$rc" -eq 3 ] || fail "the command's exit status: $rc, want 3"$'\n'"$out"
grep -qx "done" <<<"$out" || fail "the command's output not passed through"$'\n'"$out"
grep -q "==== clock trace, NVIDIA H200 (GPU 0), a sample every 5 ms" <<<"$out" || fail "no heading"$'\n'"$out"
grep -qE '^T=8 \(fused forward\): forward +0\.[0-9]+ +[0-9]+ +1755 +1755 +3201 +690\.0 +690\.0 +55  sw power cap 100%$' <<<"$out" ||
  fail "the fused phase's row"$'\n'"$out"
grep -qE '^T=8 \(v1 forward\): forward\+backward ' <<<"$out" || fail "the v1 phase's row"$'\n'"$out"
grep -q "(power limit enforced: 700 W)" <<<"$out" || fail "the power limit"$'\n'"$out"
python3 - "$work/trace.json" <<'PY' || fail "the JSON: $(cat "$work/trace.json" 2>&1)"
import json, sys
j = json.load(open(sys.argv[1]))
names = [p["phase"] for p in j["phases"]]
assert names[-2:] == ["T=8 (fused forward): forward", "T=8 (v1 forward): forward+backward"], names
assert set(names[:-2]) <= {"(start)"}, names
fused = j["phases"][-2]
assert fused["busy_samples"] >= 10 and fused["sm_mhz_median"] == 1755 and fused["reasons"] == {"sw power cap": 1.0}, fused
assert j["exit_status"] == 3 and j["power_limit_w"] == 700 and j["gpu"] == "NVIDIA H200", j
PY

# `timeout` stops clock-trace: the command it runs stops too (none left running).
timeout 2 python3 "$trace" -- bash -c "echo \$\$ >'$work/child.pid'; exec sleep 30" >/dev/null 2>&1
rc=$?
[ "$rc" -eq 124 ] || fail "under timeout: exit $rc, want 124"
sleep 0.5
child=$(cat "$work/child.pid" 2>/dev/null)
[ -n "$child" ] && ! kill -0 "$child" 2>/dev/null || fail "the command outlived clock-trace (pid ${child:-?})"

run_and_expect "NVML that cannot start" 2 "clock-trace: NVML could not open GPU 0: Driver Not Loaded" "" \
  env STUB_NVML_FAIL=1 python3 "$trace" -- true
run_and_expect "no command" 2 "clock-trace: no command given (usage: clock-trace.py [options] -- COMMAND [ARG...])" "" \
  python3 "$trace" --
run_and_expect "bad --phase" 2 "clock-trace: --phase is not a regular expression: missing ), unterminated subpattern at position 0" "" \
  python3 "$trace" --phase "(" -- true
finish test_clock_trace
