#!/usr/bin/env bash
# The main job. Installs the dependencies, builds, then:
#   * with a Hopper GPU (sm_90): runs `caracal bench` -- by default DeepSeek-V3 shapes with 32 local
#     experts, W = 1, T = 4096 tokens (issue 5's target case): validation against the fp64
#     reference, then forward / backward / forward+backward against the NCCL-exchange and cuBLAS
#     baselines;
#   * otherwise: runs the planner (`caracal plan`), by default DeepSeek-V3 at EP8 with 4096 tokens
#     per rank.
# Arguments go to the command run. CARACAL_RUN=plan or CARACAL_RUN=bench picks it explicitly.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="${CARACAL_BUILD_DIR:-$root/build}"
"$root/scripts/install-deps.sh" >&2
"$root/scripts/build.sh" >&2
mode="${CARACAL_RUN:-}"
if [ -z "$mode" ]; then
  mode=plan
  if command -v nvidia-smi >/dev/null 2>&1 &&
     nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | grep -q '^9\.0'; then
    mode=bench
  fi
fi
if [ "$mode" = bench ]; then
  # The libnccl.so.2 matching the headers the build used; NVLink multicast off.
  set +eu
  source "$root/scripts/lib/nccl-env.sh"
  set -eu
  if [ $# -eq 0 ]; then
    set -- --model deepseek-v3 --experts 32 --ep 1 --tokens 4096
  fi
  exec "$build/caracal" bench "$@"
fi
if [ $# -eq 0 ]; then
  set -- --model deepseek-v3 --ep 8 --tokens 4096
fi
exec "$build/caracal" plan "$@"
