#!/usr/bin/env bash
# scripts/torch-kernel-times.sh's own logic, with a stub ncu (no GPU): both variants' steps profiled,
# their no-profiler medians printed, the fused step's kernels beside v1's in launch order; a failing
# ncu run makes the exit status 1 and leaves the other variant's table.
source "$(dirname "$0")/script_test_lib.sh"

mkdir -p "$work/bin"
# The stub writes ncu's CSV to --log-file and the step's median to stdout; v1's step launches a
# dispatch kernel where the fused one launches its fused forward. STUB_FAIL_V1=1 fails v1's run.
cat >"$work/bin/ncu" <<'STUB'
#!/usr/bin/env bash
v1=0
while [ $# -gt 0 ]; do
  [ "$1" = --log-file ] && log=$2
  [ "$1" = --v1 ] && v1=1
  shift
done
[ "$v1" = 1 ] && [ "${STUB_FAIL_V1:-0}" = 1 ] && exit 2
kernel=fused_forward_kernel; us=4630; ms=17.09; name=fused
[ "$v1" = 1 ] && { kernel=dispatch_kernel; us=180; ms=16.59; name=v1; }
echo "deepseek-v3 ($name): step $ms ms (median of 20, no profiler)"
{
  echo '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
  echo '"0","1","python3","h","transfer::<unnamed>::build_schedule_kernel(comm::DeviceWorld, transfer::ExchangeArgs)","1","7","(512, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","28,500"'
  echo "\"1\",\"1\",\"python3\",\"h\",\"fused::<unnamed>::$kernel(comm::DeviceWorld, fused::ForwardKernelParams)\",\"1\",\"7\",\"(384, 1, 1)\",\"(132, 1, 1)\",\"0\",\"9.0\",\"Command line profiler metrics\",\"gpu__time_duration.sum\",\"usecond\",\"$us\""
} >"$log"
STUB
chmod +x "$work/bin/ncu"
export PATH="$work/bin:$PATH"

expect_status 0 "both variants" env OUT="$work/out1" bash "$root/scripts/torch-kernel-times.sh"
grep -q 'deepseek-v3 (fused): step 17.09 ms' <<<"$out" || fail "the fused step's median"
grep -q 'deepseek-v3 (v1): step 16.59 ms' <<<"$out" || fail "v1's step's median"
grep -qE '^ +1 +180\.0 +4630\.0  fused::dispatch_kernel  <>  fused::fused_forward_kernel$' <<<"$out" \
  || fail "the kernels side by side, v1 as old"

expect_status 1 "a failing v1 run" env STUB_FAIL_V1=1 OUT="$work/out2" bash "$root/scripts/torch-kernel-times.sh"
grep -q 'FAILED: ncu on the v1 step' <<<"$out" || fail "a failing v1 run: named"
grep -qE '^ +1 +4630\.0  fused::fused_forward_kernel$' <<<"$out" || fail "a failing v1 run: the fused table alone"
finish test_torch_kernel_times
