#!/usr/bin/env bash
# scripts/kernel-times.sh's own logic, with a stub ncu (no GPU): one build's kernels in launch order
# with their microseconds (from any unit ncu prints) and the total; two builds side by side, kernels
# whose names differ marked; a failing ncu run makes the exit status 1; ncu flushes the caches
# before each kernel unless CACHE_CONTROL=none, and another value is refused by name.
source "$(dirname "$0")/script_test_lib.sh"

mkdir -p "$work/bin" "$work/new" "$work/old"
for b in new old; do echo 2.28.9 >"$work/$b/NCCL_VERSION"; echo "$b-commit" >"$work/$b/COMMIT"; done
# The stub writes ncu's CSV to --log-file; the old build's fused kernel is slower and its last
# kernel has another name. STUB_FAIL=1 fails, STUB_FAIL_OLD=1 fails on the old build only.
cat >"$work/bin/ncu" <<'STUB'
#!/usr/bin/env bash
[ "${STUB_FAIL:-0}" = 1 ] && exit 3
while [ $# -gt 0 ]; do
  [ "$1" = --log-file ] && log=$2
  [ "$1" = --cache-control ] && echo "$2" >>"$STUB_CACHE_LOG"
  case "$1" in */caracal-bench) bench=$1 ;; esac
  shift
done
case "$bench" in */old/*) [ "${STUB_FAIL_OLD:-0}" = 1 ] && exit 2 ;; esac
slow=4.63; last=combine_kernel
case "$bench" in */old/*) slow=4.70; last=copy_kernel ;; esac
{
  echo '==PROF== Connected to process 1'
  echo '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
  echo '"0","1","caracal-bench","h","transfer::<unnamed>::build_schedule_kernel(comm::DeviceWorld, transfer::ExchangeArgs)","1","7","(512, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","28,500"'
  echo "\"1\",\"1\",\"caracal-bench\",\"h\",\"void fused::<unnamed>::fused_forward_kernel(comm::DeviceWorld, fused::ForwardKernelParams)\",\"1\",\"7\",\"(384, 1, 1)\",\"(132, 1, 1)\",\"0\",\"9.0\",\"Command line profiler metrics\",\"gpu__time_duration.sum\",\"msecond\",\"$slow\""
  echo "\"2\",\"1\",\"caracal-bench\",\"h\",\"transfer::<unnamed>::$last(comm::DeviceWorld, transfer::ExchangeArgs)\",\"1\",\"7\",\"(768, 1, 1)\",\"(116, 1, 1)\",\"0\",\"9.0\",\"Command line profiler metrics\",\"gpu__time_duration.sum\",\"usecond\",\"294.0\""
} >"$log"
STUB
chmod +x "$work/bin/ncu"
export PATH="$work/bin:$PATH" STUB_CACHE_LOG="$work/cache-control"

expect_status 0 "one build" env OUT="$work/out1" bash "$root/scripts/kernel-times.sh" "$work/new"
grep -qE '^ +1 +4630\.0  fused::fused_forward_kernel$' <<<"$out" || fail "one build: the fused kernel in us"
grep -qE '^ +4952\.5  total of 3 kernels$' <<<"$out" || fail "one build: the total"

expect_status 0 "two builds" env OUT="$work/out2" bash "$root/scripts/kernel-times.sh" "$work/new" "$work/old"
grep -q 'old old-commit vs new new-commit' <<<"$out" || fail "two builds: the commits"
grep -qE '^ +1 +4700\.0 +4630\.0  fused::fused_forward_kernel$' <<<"$out" || fail "two builds: side by side"
grep -q 'transfer::copy_kernel  <>  transfer::combine_kernel' <<<"$out" || fail "two builds: differing names marked"

[ "$(cat "$work/cache-control")" = "$(printf 'all\nall\nall')" ] || fail "ncu's caches not flushed by default: $(cat "$work/cache-control")"
rm -f "$work/cache-control"
expect_status 0 "caches kept" env CACHE_CONTROL=none OUT="$work/out5" bash "$root/scripts/kernel-times.sh" "$work/new"
[ "$(cat "$work/cache-control")" = none ] || fail "CACHE_CONTROL=none: ncu got $(cat "$work/cache-control")"
expect_status 1 "bad CACHE_CONTROL" env CACHE_CONTROL=some OUT="$work/out6" bash "$root/scripts/kernel-times.sh" "$work/new"
grep -q "kernel-times: CACHE_CONTROL must be all or none, got 'some'" <<<"$out" || fail "bad CACHE_CONTROL: not named"
STUB_FAIL=1 OUT="$work/out3" bash "$root/scripts/kernel-times.sh" "$work/new" >/dev/null 2>&1 && fail "a failing ncu: exit status 0"
# An OLD build that cannot run (before --profile-step): NEW's table still, and exit status 1.
expect_status 1 "a failing OLD" env STUB_FAIL_OLD=1 OUT="$work/out4" bash "$root/scripts/kernel-times.sh" "$work/new" "$work/old"
grep -q 'FAILED: ncu on .*/old' <<<"$out" || fail "a failing OLD: named"
grep -qE '^ +1 +4630\.0  fused::fused_forward_kernel$' <<<"$out" || fail "a failing OLD: NEW's table alone"
finish test_kernel_times
