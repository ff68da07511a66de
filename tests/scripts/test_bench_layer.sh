#!/usr/bin/env bash
# scripts/bench-layer.sh's exit status and verdict, with a stub build, nvidia-smi and bench/ scripts
# (no GPU): failing runs make it exit 1 with the failed steps named in the table and on the last
# line; a passing run exits 0 and says "all passed" after the speedups (OUT set, then unset).
source "$(dirname "$0")/script_test_lib.sh"
stub_device_tools

# `caracal bench` writes its JSON and exits STUB_BENCH_RC (0).
mkdir -p "$work/build"
cat >"$work/build/caracal" <<'STUB'
#!/usr/bin/env bash
while [ $# -gt 0 ]; do [ "$1" = --json ] && out=$2; shift; done
p='{"ms": 2.0, "tflops": 500.0}'
echo "{\"runs\": [{\"forward\": $p, \"backward\": $p, \"fwd_bwd\": $p, \"baselines\": {\"nccl_exchange_plus_gemms\": {\"available\": false}, \"cublas_dense\": {\"available\": false}}}]}" >"$out"
[ "${STUB_BENCH_RC:-0}" = 0 ] || echo "caracal bench: error: stub failure"
exit "${STUB_BENCH_RC:-0}"
STUB
chmod +x "$work/build/caracal"
# bench-layer.sh runs bench/*.py from the current folder: stubs there.
mkdir -p "$work/cwd/bench/python"
cat >"$work/cwd/bench/python/torch_moe_layer.py" <<'STUB'
import json, sys
p = {"ms": 3.0, "tflops": 333.3}
json.dump({"forward": p, "backward_derived": p, "fwd_bwd": p}, open(sys.argv[sys.argv.index("--json") + 1], "w"))
STUB
echo 'print("plot")' >"$work/cwd/bench/python/plot_sweep.py"

check() {  # check NAME WANT_RC LAST_LINE [PATTERN] -- ENV...: runs bench-layer with ENV
  local name=$1 want_rc=$2 last=$3 pattern=$4
  shift 5
  local out rc
  run_and_expect "$name" "$want_rc" "$last" "$pattern" env -C "$work/cwd" "$@" bash "$root/scripts/bench-layer.sh" "$work/build"
}

check "all passing" 0 "all passed" "^speedup over plain PyTorch \(W=1\): forward 1.50x" -- OUT="$work/out1"
check "all passing, OUT unset" 0 "all passed" "^plot sweep +ok$" -- -u OUT
check "failing runs" 1 "FAILED: caracal bench W=1, caracal bench W=8, caracal bench sweep" \
  "^caracal bench W=1 +FAILED, exit 3: caracal bench: error: stub failure$" -- OUT="$work/out2" STUB_BENCH_RC=3
finish test_bench_layer
