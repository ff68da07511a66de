#!/usr/bin/env bash
# Where one of the layer's kernels waits, instruction by instruction: ncu's PC sampling
# (SourceCounters) of the first launch matching REGEX in one step of the layer (caracal-bench
# --profile-step under ncu --profile-from-start off), free clocks, exported as the SASS page's CSV
# and digested (scripts/lib/sass_stalls.py: the instructions with the most samples, the stall
# reasons over the whole kernel); gemm-stalls.sh does the same for caracal_gemm_bench's kernels.
# Run on the device machine:
#   scripts/layer-stalls.sh BUILD REGEX     e.g.  BENCH_ARGS="--model qwen3-30b-a3b --experts 128 --ep 1
#     --tokens 8192 --precision fp8 --fused-fp8-forward" scripts/layer-stalls.sh build-gpu fused_forward_kernel
# BENCH_ARGS sets the case (default: DeepSeek-V3 with 32 experts, W = 1, T = 4096), PROFILE_PATH
# the layer (fused, the default, or v1: caracal-bench --profile-path), TOP (40) the instructions
# listed. The SASS CSV and the digest go to $OUT (else /tmp/caracal-layer-stalls), named after the
# kernel; ncu's report, details page and log to $WORK (else /tmp/caracal-layer-stalls-work). Exit
# status 1 when ncu failed or matched no launch.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/lib/sass-digest.sh"
build="${1:?usage: scripts/layer-stalls.sh BUILD REGEX}"
regex="${2:?usage: scripts/layer-stalls.sh BUILD REGEX}"
source "$root/scripts/lib/profile-step.sh"
work="${WORK:-/tmp/caracal-layer-stalls-work}"
mkdir -p "$work"
name="stalls-${regex//[^A-Za-z0-9]/_}"
stem="$work/$name"
echo "==== SASS stalls of '$regex', one step of the ${PROFILE_PATH:-fused} layer ($args)," \
  "build $(cat "$build/COMMIT" 2>/dev/null)"
rm -f "$stem.ncu-rep"
# shellcheck disable=SC2086  # BENCH_ARGS splits into arguments
if ! ncu --profile-from-start off --clock-control none -k "regex:$regex" --launch-count 1 \
    --section SourceCounters --section WarpStateStats --section SpeedOfLight --section MemoryWorkloadAnalysis \
    -f -o "$stem" "$build/caracal-bench" $args --no-validate --profile-step --profile-path "${PROFILE_PATH:-fused}" \
    --quiet >"$stem.log" 2>&1; then
  echo "FAILED: ncu (see $stem.log)"
  tail -5 "$stem.log"
  exit 1
fi
if [ ! -f "$stem.ncu-rep" ]; then
  echo "FAILED: no launch matched '$regex' (see $stem.log)"
  exit 1
fi
sass_digest "$stem" "$out" "$name" "${TOP:-40}"
