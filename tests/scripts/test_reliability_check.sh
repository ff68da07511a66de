#!/usr/bin/env bash
# scripts/reliability-check.sh's exit status and verdict, with a stub build and device tools (no GPU):
# a failing run or soak checksums that differ make it exit 1 with the failed steps named in the
# table and on the last line; a passing run exits 0 and says "all passed", with OUT unset or set.
source "$(dirname "$0")/script_test_lib.sh"
stub_device_tools

# The stub build: caracal-soak writes checksums (different each run when STUB_SOAK_DIFFER=1) and
# appends its arguments to soak-args.log, the transfer bench and the layer's bench their JSON; they
# exit STUB_SOAK_RC, STUB_TRANSFER_RC and STUB_LAYER_RC (0).
build="$work/build"
mkdir -p "$build"
echo stub-build >"$build/COMMIT"
echo 2.28.9 >"$build/NCCL_VERSION"
cat >"$build/caracal-soak" <<'STUB'
#!/usr/bin/env bash
echo "$*" >>"$(dirname "$0")/soak-args.log"
while [ $# -gt 0 ]; do [ "$1" = --checksums ] && out=$2; shift; done
if [ "${STUB_SOAK_DIFFER:-0}" = 1 ]; then echo "step 1 $RANDOM$RANDOM" >"$out"; else echo "step 1 5eed" >"$out"; fi
echo "memory flat: 0 bytes over 1000 steps"
echo "1000 steps, 50.0 steps/s"
exit "${STUB_SOAK_RC:-0}"
STUB
cat >"$build/caracal_transfer_bench" <<'STUB'
#!/usr/bin/env bash
while [ $# -gt 0 ]; do [ "$1" = --json ] && out=$2; shift; done
echo '{"cases": [{"world": 8, "schedule_us": 10.0, "passes": [{"pass": "dispatch", "ms": 1.0}]}]}' >"$out"
echo "every spot check passed"
exit "${STUB_TRANSFER_RC:-0}"
STUB
cat >"$build/caracal" <<'STUB'
#!/usr/bin/env bash
echo "  4096 forward 5.0 ms"
exit "${STUB_LAYER_RC:-0}"
STUB
chmod +x "$build"/caracal*

check() {  # check NAME WANT_RC LAST_LINE [PATTERN] -- ENV...: runs reliability-check with ENV
  local name=$1 want_rc=$2 last=$3 pattern=$4
  shift 5
  local out rc
  run_and_expect "$name" "$want_rc" "$last" "$pattern" env -u OUT "$@" bash "$root/scripts/reliability-check.sh" "$build"
}

check "all passing, OUT unset" 0 "all passed" "^soak_loopback_W4: two runs +bitwise identical \(1 checksum lines\)$" --
# The checks' pair: v1 and fused compared and the reference in both runs, the second as graph
# replays with a stall mid-soak.
check "the checks' pair" 0 "all passed" \
  "^soak_loopback_W4_checks: two runs +bitwise identical \(1 checksum lines; the second with --graph --stall-at 501\)$" --
args=$(grep -- "--path both" "$build/soak-args.log" | tail -n 2)
[ "$(grep -c -- "--reference-every 50" <<<"$args")" -eq 2 ] || fail "the checks' pair: not both with --reference-every 50"$'\n'"$args"
grep -q -- "--graph --stall-at 501$" <<<"$(tail -n 1 <<<"$args")" || fail "the checks' second run: no --graph --stall-at 501"$'\n'"$args"
grep -q -- "--graph" <<<"$(head -n 1 <<<"$args")" && fail "the checks' first run: --graph (it must run eagerly)"$'\n'"$args"
check "all passing, two GPUs, OUT set" 0 "all passed" "^soak_nccl_W2: two runs +bitwise identical" -- \
  STUB_GPUS=2 OUT="$work/out"
[ -f "$work/out/reliability-logs.tgz" ] || fail "OUT set: no $work/out/reliability-logs.tgz"
check "soak checksums that differ" 1 "FAILED: soak_loopback_W4: two runs, soak_loopback_W4_checks: two runs" \
  "^soak_loopback_W4: two runs +DIFFER$" -- STUB_SOAK_DIFFER=1
check "a soak check that failed" 1 \
  "FAILED: soak_loopback_W4_run1, soak_loopback_W4_run2, soak_loopback_W4_checks_run1, soak_loopback_W4_checks_run2" \
  "^soak_loopback_W4_checks_run2 +FAILED \(rc 2, see soak_loopback_W4_checks_run2.log\)$" -- STUB_SOAK_RC=2
check "a failing transfer bench" 1 \
  "FAILED: transfers_default, transfers_all_sms, transfers_default_again" \
  "^transfers_default +FAILED \(rc 3, see transfers_default.log\)$" -- STUB_TRANSFER_RC=3
finish test_reliability_check
