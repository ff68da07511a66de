#!/usr/bin/env bash
# scripts/kernel-profile.sh's own logic, with a stub ncu (no GPU): ncu is asked for the matching
# kernels with the sections and the stall metrics; the digest names each launch in order with its
# figures and its stall reasons largest first; a failing ncu run, or one that matched no launch,
# makes the exit status 1.
source "$(dirname "$0")/script_test_lib.sh"

mkdir -p "$work/bin" "$work/build"
echo 2.28.9 >"$work/build/NCCL_VERSION"
echo build-commit >"$work/build/COMMIT"
# The stub records its arguments and writes ncu's CSV to --log-file (STUB_EMPTY=1: no launch).
cat >"$work/bin/ncu" <<'STUB'
#!/usr/bin/env bash
[ "${STUB_FAIL:-0}" = 1 ] && exit 3
echo "$*" >"$STUB_ARGS"
while [ $# -gt 0 ]; do
  [ "$1" = --log-file ] && log=$2
  shift
done
row() {  # row ID KERNEL METRIC UNIT VALUE
  echo "\"$1\",\"1\",\"caracal-bench\",\"h\",\"$2\",\"1\",\"7\",\"(768, 1, 1)\",\"(116, 1, 1)\",\"0\",\"9.0\",\"S\",\"$3\",\"$4\",\"$5\""
}
{
  echo '==PROF== Connected to process 1'
  echo '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
  if [ "${STUB_EMPTY:-0}" != 1 ]; then
    k='transfer::<unnamed>::combine_kernel(comm::DeviceWorld, transfer::ExchangeArgs)'
    row 0 "$k" Duration ns "294,112"
    row 0 "$k" "DRAM Throughput" % 45.5
    row 0 "$k" dram__bytes_read.sum byte "590,000,000"
    row 0 "$k" sm__cycles_active.max cycle "400,000"
    row 0 "$k" smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio inst/warp "366,720.05"
    row 0 "$k" smsp__average_warp_latency_issue_stalled_lg_throttle.ratio inst/warp "27,658.28"
    row 0 "$k" smsp__average_warp_latency_issue_stalled_wait.ratio inst/warp "380,594.10"
    row 0 "$k" smsp__average_warp_latency_issue_stalled_membar.ratio inst/warp 0
    k='void transfer::<unnamed>::reverse_dispatch_kernel<0>(comm::DeviceWorld, transfer::ExchangeArgs)'
    row 1 "$k" Duration ns "163,200"
    row 1 "$k" "L2 Hit Rate" % 12.5
  fi
} >"$log"
STUB
chmod +x "$work/bin/ncu"
export PATH="$work/bin:$PATH" STUB_ARGS="$work/args"

expect_status 0 "" env OUT="$work/out1" bash "$root/scripts/kernel-profile.sh" "$work/build" 'combine_kernel|dispatch_kernel'
grep -q -- "-k regex:combine_kernel|dispatch_kernel" "$work/args" || fail "ncu asked for the matching kernels"
grep -q -- "--section MemoryWorkloadAnalysis" "$work/args" || fail "ncu asked for the memory workload"
grep -q "smsp__average_warp_latency_issue_stalled_lg_throttle.ratio" "$work/args" || fail "ncu asked for the stalls"
grep -q -- "--profile-step" "$work/args" || fail "the bench profiles one step"
grep -q "build-commit, kernels matching 'combine_kernel|dispatch_kernel'" <<<"$out" || fail "the header"
grep -qE '^\[0\] transfer::combine_kernel  grid \(116, 1, 1\) x block \(768, 1, 1\)$' <<<"$out" || fail "launch 0 named"
grep -qE '^    duration +294,112 ns$' <<<"$out" || fail "launch 0's duration"
grep -qE '^    DRAM bytes read +590,000,000 byte$' <<<"$out" || fail "launch 0's DRAM bytes"
grep -qE '^    SM active cycles, most +400,000 cycle$' <<<"$out" || fail "launch 0's busiest SM"
grep -q "sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max" "$work/args" || fail "ncu asked for SM activity"
grep -qE '^    top stalls +wait 380,594, long_scoreboard 366,720, lg_throttle 27,658, membar 0$' <<<"$out" ||
  fail "launch 0's stalls, largest first"
grep -qE '^\[1\] transfer::reverse_dispatch_kernel<0>  ' <<<"$out" || fail "launch 1 named, in order"
grep -qE '^    L2 hit rate +12.5 %$' <<<"$out" || fail "launch 1's L2 hit rate"

STUB_FAIL=1 OUT="$work/out2" bash "$root/scripts/kernel-profile.sh" "$work/build" combine >/dev/null 2>&1 &&
  fail "a failing ncu: exit status 0"
out=$(STUB_EMPTY=1 OUT="$work/out3" bash "$root/scripts/kernel-profile.sh" "$work/build" nothing 2>&1)
status=$?
[ "$status" -eq 1 ] || fail "no launch matched: exit status $status"
grep -q "no launch matched" <<<"$out" || fail "no launch matched: said"
finish test_kernel_profile
