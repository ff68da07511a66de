#!/usr/bin/env bash
# The main job. Installs the dependencies, builds, and runs the planner (`caracal plan`); with no
# arguments it plans DeepSeek-V3 at EP8 with 4096 tokens per rank. Arguments go to `caracal plan`.
# (On a GPU machine this will run `caracal bench` once the layer exists.)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="${CARACAL_BUILD_DIR:-$root/build}"
"$root/scripts/install-deps.sh" >&2
"$root/scripts/build.sh" >&2
if [ $# -eq 0 ]; then
  set -- --model deepseek-v3 --ep 8 --tokens 4096
fi
exec "$build/caracal" plan "$@"
