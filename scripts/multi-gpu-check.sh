#!/usr/bin/env bash
# The multi-GPU check (issue 7), one call on a machine with several GPUs over NVLink, over a build
# made elsewhere: scripts/multi-gpu-check.sh [build-dir] [libcaracal_torch.so]
#   1. the layer's NCCL tests, one thread per GPU at W = 2, 4, 8 (as many as there are GPUs);
#   2. caracal.MoE under torchrun, one process per GPU, against the plain-PyTorch layer;
#   3. transfer bandwidth per GPU over NVLink (only bytes that cross it), DeepSeek-V3 and Kimi K2;
#   4. `caracal bench` over NCCL at W = all GPUs (DeepSeek-V3, 32 experts per rank, T = 4096), and
#      the backward's dx home per (token, rank) (the default) against a row per route
#      (--dx-rows-per-route), 2 rounds alternated: the trade measured only in loopback so far;
#   5. bench/python/torch_ep_bench.py: caracal.MoE against NCCL + PyTorch (all_to_all_single + grouped_mm);
#   6. reliability at W = 2 (issue 11): NcclWorld.ThreadPerGpuExchange 50 times, a rank stalled on the
#      host past the timeout and recovered (examples/stall_recovery.py), 20 steps beside a 256 MiB
#      all_reduce on a side stream (examples/concurrent_allreduce.py), the 1,000-step soak twice;
# then a summary, and last "FAILED: <steps>" or "all passed" (exit status 1 when a step failed).
# Logs go to $OUT if set (at most 8 files come back: they are tarred).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="${1:-build}"
torch_lib="${2:-$build/libcaracal_torch.so}"
logs=$(mktemp -d)
source "$root/scripts/lib/nccl-env.sh"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CARACAL_REQUIRE_GPU=1
export CARACAL_TORCH_LIBRARY="$(cd "$(dirname "$torch_lib")" && pwd)/$(basename "$torch_lib")"
export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}"
gpus=$(nvidia-smi -L | wc -l)
export CARACAL_REQUIRE_GPUS=$gpus  # a test this machine can run must not skip
worlds=()
for w in 2 4 8; do [ "$w" -le "$gpus" ] && worlds+=("$w"); done
summary_width=40
source "$root/scripts/lib/summary.sh"
run() {  # run NAME LIMIT CMD...: logs to NAME.log, records ok/FAILED
  local name=$1 limit=$2 rc
  shift 2
  timeout "$limit" "$@" >"$logs/$name.log" 2>&1
  rc=$?
  if [ "$rc" -eq 0 ]; then record "$name" "ok"; else
    tail -n 20 "$logs/$name.log"
    record_failed "$name" "FAILED (rc $rc, see $name.log)"
  fi
}
nvidia-smi topo -m >"$logs/topology.txt" 2>&1
record "GPUs" "$gpus ($nccl_found)"

run layer_nccl_threads 600 "$build/tests/test_gpu_moe_layer" --gtest_filter='W/GpuMoELayerNcclThreads.*:GpuMoELayerNccl.*'
run comm_nccl_threads 300 "$build/tests/test_gpu_comm_nccl"
for w in "${worlds[@]}"; do
  run "torchrun_check_W$w" 300 torchrun --nproc_per_node="$w" "$root/examples/distributed_check.py"
done
if [ "${#worlds[@]}" -gt 0 ]; then
  list=$(IFS=,; echo "${worlds[*]}")
  run transfer_bench_nccl 600 "$build/caracal_transfer_bench" --backend nccl --world "$list" \
    --model deepseek-v3,kimi-k2 --routing uniform,zipf:1.2 --tokens 4096 --json "$logs/transfers.json"
  run caracal_bench_nccl 600 "$build/caracal" bench --backend nccl --ep "$gpus" --model deepseek-v3 \
    --experts $((32 * gpus)) --tokens 4096 --json "$logs/caracal_bench.json"
  for round in 1 2; do
    for dx in per_token_rank per_route; do
      flag=""; [ "$dx" = per_route ] && flag="--dx-rows-per-route"
      # shellcheck disable=SC2086  # an empty flag adds no argument
      run "dx_${dx}_round$round" 300 "$build/caracal-bench" --backend nccl --ep "$gpus" --model deepseek-v3 \
        --experts $((32 * gpus)) --tokens 4096 --graph --no-validate $flag --json "$logs/dx_${dx}_$round.json"
      record "  backward ms, dx $dx, round $round" "$(grep -E '^ +4096 +backward ' "$logs/dx_${dx}_round$round.log" | awk '{print $3}')"
    done
  done
  run torch_ep_bench 900 torchrun --nproc_per_node="$gpus" "$root/bench/python/torch_ep_bench.py" \
    --models deepseek-v3,kimi-k2 --json "$logs/torch_ep_bench.json"
fi

if [ "$gpus" -ge 2 ]; then
  crashes=0
  for i in $(seq 1 50); do
    timeout 120 "$build/tests/test_gpu_comm_nccl" --gtest_filter=NcclWorld.ThreadPerGpuExchange >"$logs/thread_per_gpu.$i.log" 2>&1 || crashes=$((crashes + 1))
  done
  if [ "$crashes" -eq 0 ]; then
    record "ThreadPerGpuExchange x50" "0 failures"
  else
    record_failed "ThreadPerGpuExchange x50" "$crashes failures (see thread_per_gpu.*.log)"
  fi
  run stall_recovery_W2 300 torchrun --nproc_per_node=2 "$root/examples/stall_recovery.py"
  run concurrent_allreduce_W2 600 torchrun --nproc_per_node=2 "$root/examples/concurrent_allreduce.py"
  for i in 1 2; do
    run "soak_nccl_W2_run$i" 600 "$build/caracal-soak" --backend nccl --ep 2 --steps 1000 --seed 2026 \
      --checksums "$logs/soak_nccl_W2.$i.txt"
  done
  if [ -s "$logs/soak_nccl_W2.1.txt" ] && cmp -s "$logs/soak_nccl_W2.1.txt" "$logs/soak_nccl_W2.2.txt"; then
    record "soak_nccl_W2: two runs" "bitwise identical"
  else
    record_failed "soak_nccl_W2: two runs" "DIFFER"
  fi
  # Everything groups by rank, not by GPU: a loopback world of 2 computes the NCCL world's bits.
  run soak_loopback_W2 600 "$build/caracal-soak" --backend loopback --ep 2 --steps 1000 --seed 2026 \
    --checksums "$logs/soak_loopback_W2.txt"
  if [ -s "$logs/soak_loopback_W2.txt" ] && cmp -s <(sort "$logs/soak_nccl_W2.1.txt") <(sort "$logs/soak_loopback_W2.txt"); then
    record "soak W2: NCCL vs loopback" "bitwise identical"
  else
    record_failed "soak W2: NCCL vs loopback" "DIFFER"
  fi
fi

for f in caracal_bench_nccl torch_ep_bench; do [ -f "$logs/$f.log" ] && tail -n 8 "$logs/$f.log"; done
if [ -n "${OUT:-}" ]; then
  { mkdir -p "$OUT" && tar czf "$OUT/multi-gpu-logs.tgz" -C "$logs" .; } || record_failed "logs" "not written to $OUT"
fi
echo
echo "==== Caracal multi-GPU check: $(date -u +%F) commit $(cat "$build/COMMIT" 2>/dev/null || git -C "$root" rev-parse --short HEAD)"
print_summary
verdict
