#!/usr/bin/env bash
# What the kernels matching a name wait on, in one forward and backward of the fused layer
# (caracal-bench --profile-step under ncu --profile-from-start off): ncu's speed-of-light,
# memory-workload, warp-state and occupancy sections of every matching launch, the DRAM bytes and
# the warp stall reasons, at ncu's locked base clock (the figures compare kernels with one another,
# not with the sustained benchmark). Run on the device machine:
#   scripts/kernel-profile.sh BUILD REGEX      e.g.  scripts/kernel-profile.sh build-gpu 'combine_kernel|dispatch_kernel'
# BENCH_ARGS sets the case (default: DeepSeek-V3 with 32 experts, W = 1, T = 4096). ncu's CSV and
# log go to $OUT if set, else /tmp/caracal-kernel-profile; a digest per launch is printed (its
# duration, DRAM throughput and bytes, L2 hit rate, occupancy, cycles per issue, the SMs' active
# cycles least/mean/most (how evenly the work spread), top stalls).
# Exit status 1 when ncu failed or matched no launch.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="${1:?usage: scripts/kernel-profile.sh BUILD REGEX}"
regex="${2:?usage: scripts/kernel-profile.sh BUILD REGEX}"
source "$root/scripts/lib/profile-step.sh"
stalls=barrier,dispatch_stall,lg_throttle,long_scoreboard,math_pipe_throttle,membar,mio_throttle,short_scoreboard
stalls+=,sleeping,wait
metrics=dram__bytes_read.sum,dram__bytes_write.sum,sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max
for s in ${stalls//,/ }; do metrics+=",smsp__average_warp_latency_issue_stalled_$s.ratio"; done
echo "==== kernel profile, one step of the fused layer ($args): $(cat "$build/COMMIT" 2>/dev/null), kernels matching '$regex'"
# shellcheck disable=SC2086  # BENCH_ARGS splits into arguments
if ! ncu --profile-from-start off -k "regex:$regex" --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section Occupancy --metrics "$metrics" --csv --print-units base \
    --log-file "$out/kernel-profile.csv" "$build/caracal-bench" $args --no-validate --profile-step --quiet \
    >"$out/bench.log" 2>&1; then
  echo "FAILED: ncu on $build (see $out/bench.log and $out/kernel-profile.csv)"
  exit 1
fi
python3 "$root/scripts/lib/profile_digest.py" "$out/kernel-profile.csv"
