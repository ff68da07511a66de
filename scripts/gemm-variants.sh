#!/usr/bin/env bash
# Grouped-GEMM speed of several builds side by side, in one call on the device machine:
#   scripts/gemm-variants.sh DIR...      each DIR holds a caracal_gemm_bench (the first is the reference)
# Runs every build's caracal_gemm_bench in turn, ROUNDS times (2) over GEMM_CASES (DeepSeek-V3 and
# Kimi K2 uniform, DeepSeek-V3 Zipf), so that clocks and power drift fall on all builds alike; then
# prints per case and kernel the median over the rounds of each build's figure (itself the median of
# --reps 20 runs) and its ratio to the first build's. For variants of one kernel change built with
# different constants. VARIANT_ARGS: more caracal_gemm_bench arguments (e.g. --no-fp8). The rounds' JSON, merged: $OUT/gemm-variants.json.
# Every run is bounded by VARIANT_TIMEOUT s (300); exit status 1 when one failed.
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: scripts/gemm-variants.sh DIR DIR..." >&2; exit 2; }
rounds="${ROUNDS:-2}"
cases=""
for c in ${GEMM_CASES:-deepseek-v3/uniform kimi-k2/uniform deepseek-v3/zipf}; do cases+=" --case $c"; done
logs=$(mktemp -d)
failed=0
for round in $(seq 1 "$rounds"); do
  for i in $(seq 1 $#); do
    dir=${!i}
    # shellcheck disable=SC2086  # the cases split into arguments
    if ! timeout "${VARIANT_TIMEOUT:-300}" "$dir/caracal_gemm_bench" --reps 20 $cases ${VARIANT_ARGS:-} \
        --json "$logs/v${i}_r$round.json" >"$logs/v${i}_r$round.log" 2>&1; then
      echo "FAILED: $dir round $round"; tail -n 5 "$logs/v${i}_r$round.log"; failed=1
    fi
  done
done
python3 - "$logs" "${OUT:-}" "$@" <<'PY'
import glob, json, os, statistics, sys
logs, out, dirs = sys.argv[1], sys.argv[2], sys.argv[3:]
ms, merged = {}, {}
for i, d in enumerate(dirs, 1):
    for path in sorted(glob.glob(os.path.join(logs, f"v{i}_r*.json"))):
        run = json.load(open(path))
        merged.setdefault(d, []).append(run)
        for case in run["cases"]:
            for kernel, t in case["results"].items():
                ms.setdefault((case["name"], kernel), {}).setdefault(i, []).append(t["ms"])
names = [os.path.basename(os.path.normpath(d)) for d in dirs]
print("ms, median over rounds; (x) = the first build's time over this one's (above 1: faster)")
print(f"{'case':22s} {'kernel':40s} " + " ".join(f"{n:>16s}" for n in names))
for (case, kernel), by in sorted(ms.items()):
    if kernel.startswith("cublas"):
        continue
    ref = statistics.median(by[1]) if 1 in by else float("nan")
    cells = []
    for i in range(1, len(dirs) + 1):
        m = statistics.median(by[i]) if i in by else float("nan")
        cells.append(f"{m:8.3f} ({ref / m:.3f})" if i > 1 else f"{m:16.3f}")
    print(f"{case:22s} {kernel:40s} " + " ".join(f"{c:>16s}" for c in cells))
if out:
    json.dump({"builds": names, "runs": merged}, open(os.path.join(out, "gemm-variants.json"), "w"))
PY
exit "$failed"
