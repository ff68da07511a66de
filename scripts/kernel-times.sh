#!/usr/bin/env bash
# Per-kernel GPU time of one forward and backward of the fused layer (caracal-bench --profile-step
# under ncu --profile-from-start off), for one build or two side by side, kernel by kernel in launch
# order, then the totals. ncu runs each kernel alone at its own clocks: the figures compare kernels
# and builds, they are not the layer's sustained time (caracal bench's). Run on the device machine:
#   scripts/kernel-times.sh NEW [OLD]      (build folders holding caracal-bench with --profile-step)
# BENCH_ARGS sets the case (default: DeepSeek-V3 with 32 experts, W = 1, T = 4096), PROFILE_PATH
# the layer (fused, the default, or v1: caracal-bench --profile-path). CACHE_CONTROL=none keeps
# the caches between kernels as a step leaves them (ncu's default, all, flushes them before each
# kernel: each starts cold). The CSVs and ncu's logs go to $OUT if set, else
# /tmp/caracal-kernel-times. Exit status 1 when a run failed or CACHE_CONTROL is not all or none.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
new="${1:?usage: scripts/kernel-times.sh NEW [OLD]}"
cache_control="${CACHE_CONTROL:-all}"
case "$cache_control" in all|none) ;; *) echo "kernel-times: CACHE_CONTROL must be all or none, got '$cache_control'" >&2; exit 1 ;; esac
old="${2:-}"
build="$new"
source "$root/scripts/lib/profile-step.sh"
failed=0
profile() {  # profile SIDE BUILD: 0 when its CSV is there
  # shellcheck disable=SC2086  # BENCH_ARGS splits into arguments
  ncu --profile-from-start off --clock-control none --cache-control "$cache_control" --metrics gpu__time_duration.sum --csv --print-units base \
    --log-file "$out/kernels_$1.csv" "$2/caracal-bench" $args --no-validate --profile-step \
    --profile-path "${PROFILE_PATH:-fused}" --quiet \
    >"$out/bench_$1.log" 2>&1 && return 0
  echo "FAILED: ncu on $2 (see $out/bench_$1.log; an OLD build from before --profile-step cannot run)"
  failed=1
  return 1
}
profile new "$new" && new_csv="$out/kernels_new.csv" || new_csv=""
old_csv=""
[ -n "$old" ] && profile old "$old" && old_csv="$out/kernels_old.csv"
echo "==== kernel times, one step of the ${PROFILE_PATH:-fused} layer ($args): ${old_csv:+old $(cat "$old/COMMIT" 2>/dev/null) vs }new $(cat "$new/COMMIT" 2>/dev/null)"
if [ -n "$new_csv" ]; then  # NEW's table, beside OLD's where that ran
  python3 "$root/scripts/lib/kernel_table.py" "$new_csv" ${old_csv:+"$old_csv"} || failed=1
fi
exit "$failed"
