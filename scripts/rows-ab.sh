#!/usr/bin/env bash
# The two transfer designs side by side (DESIGN §2: a row per (token, rank) against one per route,
# ExchangeOptions::rows_per_route: the pulls read a token once per rank, combine pushes one sum per
# (token, rank)), run on the device machine over a build made elsewhere:
#   1. caracal_transfer_bench in the loopback world: dispatch, combine and reverse combine, both
#      designs, DeepSeek-V3 and Kimi K2 (uniform), W = 8, 2 and 1, T = 4096; bytes are the design's
#      own (bench/transfer/transfer_bytes.hpp);
#   2. caracal bench's fused forward with every row pulled (--fused-pull-all-rows, so that one GPU
#      runs the pull role), both designs, DeepSeek-V3 with 32 local experts, W = 1 and loopback W = 2;
# then a table: per case the per-route and per-token times and the ratio.
# Usage: scripts/rows-ab.sh [build-dir]   Files (5) go to $OUT if set, else /tmp/caracal-rows-ab.
set -uo pipefail
build="${1:-build}"
out="${OUT:-/tmp/caracal-rows-ab}"
mkdir -p "$out"
source "$(dirname "$0")/lib/nccl-env.sh"
log="$out/rows-ab.log"
: >"$log"
failed=0
run() {
  echo "==== $*" >>"$log"
  timeout 300 "$@" >>"$log" 2>&1 || { echo "FAILED ($?): $*" | tee -a "$log"; failed=1; }
}

for design in per_token per_route; do
  flag=()
  [ "$design" = per_route ] && flag=(--rows-per-route)
  run "$build/caracal_transfer_bench" --model deepseek-v3 kimi-k2 --routing uniform --world 8 2 1 --tokens 4096 \
    --reps 30 --no-baseline --seed 2026 "${flag[@]}" --json "$out/transfers_$design.json"
  for ep in 1 2; do
    run "$build/caracal-bench" --model deepseek-v3 --experts $((32 * ep)) --ep $ep --tokens 4096 --reps 20 --seed 2026 \
      --fused-pull-all-rows --no-validate "${flag[@]}" --json "$out/layer_ep${ep}_$design.json"
  done
done

python3 - "$out" <<'EOF' | tee -a "$log"
import json, os, sys
out = sys.argv[1]
def load(name):
    path = os.path.join(out, name)
    return json.load(open(path)) if os.path.exists(path) else None
print(f"{'case':44s} {'per route ms':>12s} {'per token ms':>12s} {'ratio':>6s} {'bytes ratio':>11s}")
tok, rte = load("transfers_per_token.json"), load("transfers_per_route.json")
if tok and rte:
    for a, b in zip(tok["cases"], rte["cases"]):
        for la, lb in zip(a["passes"], b["passes"]):
            if la["pass"] not in ("dispatch", "combine", "reverse_combine"):
                continue
            name = f"{a['model']} W{a['world']} {la['pass']}"
            print(f"{name:44s} {lb['ms']:12.3f} {la['ms']:12.3f} {lb['ms'] / la['ms']:6.2f} "
                  f"{lb['bytes_moved'] / la['bytes_moved']:11.2f}")
for ep in (1, 2):
    a, b = load(f"layer_ep{ep}_per_token.json"), load(f"layer_ep{ep}_per_route.json")
    if a and b:
        for key in ("forward", "backward"):
            fa, fb = a["runs"][0][key]["ms"], b["runs"][0][key]["ms"]
            print(f"{'fused ' + key + ', all rows pulled, W' + str(ep):44s} {fb:12.3f} {fa:12.3f} {fb / fa:6.2f}")
EOF
exit $failed
