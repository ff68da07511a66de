# Sourced by the scripts that profile one step of caracal-bench (--profile-step) under ncu
# (kernel-times.sh, kernel-profile.sh) once $build is set: $out, $OUT or else
# /tmp/caracal-<script name>, made; $args, BENCH_ARGS or else the default case (DeepSeek-V3 with 32
# experts, W = 1, T = 4096); the NCCL library picked (nccl-env.sh).
out="${OUT:-/tmp/caracal-$(basename "$0" .sh)}"
mkdir -p "$out"
args=${BENCH_ARGS:---model deepseek-v3 --experts 32 --ep 1 --tokens 4096}
source "$(dirname "${BASH_SOURCE[0]}")/nccl-env.sh"
