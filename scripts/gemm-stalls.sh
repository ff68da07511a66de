#!/usr/bin/env bash
# Where a grouped-GEMM kernel's warps wait, instruction by instruction: ncu's PC sampling
# (SourceCounters) of one launch of the kernel matching REGEX in caracal_gemm_bench, free clocks,
# exported as the SASS page's CSV and digested (scripts/lib/sass_stalls.py: the instructions with the
# most samples, the stall reasons over the whole kernel). Run on the device machine:
#   scripts/gemm-stalls.sh BUILD REGEX CASE     e.g.  scripts/gemm-stalls.sh build-gpu UpGateSwiglu deepseek-v3/zipf
# The SASS CSV and the digest go to $OUT (else /tmp/caracal-gemm-stalls), named after the kernel and
# the case; ncu's report and log to $WORK (else /tmp/caracal-gemm-stalls-work). Exit status 1 when ncu
# failed or matched no launch.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/lib/sass-digest.sh"
build="${1:?usage: scripts/gemm-stalls.sh BUILD REGEX CASE}"
regex="${2:?usage: scripts/gemm-stalls.sh BUILD REGEX CASE}"
case_name="${3:?usage: scripts/gemm-stalls.sh BUILD REGEX CASE}"
out="${OUT:-/tmp/caracal-gemm-stalls}"
work="${WORK:-/tmp/caracal-gemm-stalls-work}"
mkdir -p "$out" "$work"
name="stalls-${regex//[^A-Za-z0-9]/_}-${case_name//\//-}"
stem="$work/$name"
echo "==== SASS stalls of '$regex', $case_name, build $(cat "$build/COMMIT" 2>/dev/null)"
# The bench's first launches warm up; the third launch of the kernel is the one sampled.
if ! ncu --clock-control none --kernel-name-base demangled -k "regex:$regex" --launch-skip 2 --launch-count 1 \
    --section SourceCounters --section WarpStateStats --section SpeedOfLight -f -o "$stem" \
    "$build/caracal_gemm_bench" --case "$case_name" --reps 2 --warmup 1 >"$stem.log" 2>&1; then
  echo "FAILED: ncu (see $stem.log)"
  tail -5 "$stem.log"
  exit 1
fi
sass_digest "$stem" "$out" "$name"
