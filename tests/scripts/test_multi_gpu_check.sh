#!/usr/bin/env bash
# scripts/multi-gpu-check.sh's exit status and verdict, with stub builds and device tools (no GPU): a
# failing test binary or torchrun job makes it exit 1 with the failed steps named in the table and
# on the last line; a passing run exits 0 and says "all passed", with OUT unset or set.
source "$(dirname "$0")/script_test_lib.sh"
stub_device_tools

make_build() {  # make_build DIR COMM_NCCL_RC: stub tests, benches, soak and extension
  local dir=$1
  mkdir -p "$dir/tests"
  echo "stub-$(basename "$dir")" >"$dir/COMMIT"
  echo 2.28.9 >"$dir/NCCL_VERSION"
  : >"$dir/libcaracal_torch.so"
  stub_gtest "$dir/tests/test_gpu_moe_layer" 0
  stub_gtest "$dir/tests/test_gpu_comm_nccl" "$2"
  cat >"$dir/caracal-soak" <<'STUB'
#!/usr/bin/env bash
while [ $# -gt 0 ]; do [ "$1" = --checksums ] && out=$2; shift; done
echo "step 1 5eed" >"$out"
STUB
  printf '#!/usr/bin/env bash\necho "  4096 backward 2.500 ms"\n' >"$dir/caracal-bench"
  printf '#!/usr/bin/env bash\necho ok\n' >"$dir/caracal"
  printf '#!/usr/bin/env bash\necho ok\n' >"$dir/caracal_transfer_bench"
  chmod +x "$dir"/caracal*
}
make_build "$work/ok" 0
make_build "$work/bad" 1

script_under_test=multi-gpu-check.sh
script_env=(-u OUT STUB_GPUS=2)

check_on_build "all passing, OUT unset" "$work/ok" 0 "all passed" "^soak W2: NCCL vs loopback +bitwise identical$" --
check_on_build "all passing, one GPU, OUT set" "$work/ok" 0 "all passed" "^comm_nccl_threads +ok$" -- STUB_GPUS=1 OUT="$work/out"
[ -f "$work/out/multi-gpu-logs.tgz" ] || fail "OUT set: no $work/out/multi-gpu-logs.tgz"
check_on_build "a failing test binary" "$work/bad" 1 "FAILED: comm_nccl_threads, ThreadPerGpuExchange x50" \
  "^ThreadPerGpuExchange x50 +50 failures" --
check_on_build "failing torchrun jobs" "$work/ok" 1 \
  "FAILED: torchrun_check_W2, torch_ep_bench, stall_recovery_W2, concurrent_allreduce_W2" \
  "^torchrun_check_W2 +FAILED \(rc 1, see torchrun_check_W2.log\)$" -- STUB_TORCHRUN_RC=1
finish test_multi_gpu_check
