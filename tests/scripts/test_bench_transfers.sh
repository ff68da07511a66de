#!/usr/bin/env bash
# scripts/bench-transfers.sh's exit status and verdict, with a stub build and nvidia-smi (no GPU): a
# failing test or a failed spot check makes it exit 1 with the failed steps named in the table and
# on the last line; a passing run exits 0 and says "all passed" after the benchmark's table.
source "$(dirname "$0")/script_test_lib.sh"
stub_device_tools

make_build() {  # make_build DIR TEST_RC: the baseline's test and caracal_transfer_bench (exits STUB_BENCH_RC)
  mkdir -p "$1/tests"
  stub_gtest "$1/tests/test_gpu_nccl_baseline" "$2"
  cat >"$1/caracal_transfer_bench" <<'STUB'
#!/usr/bin/env bash
echo "==== caracal_transfer_bench summary"
echo "dispatch 1.0 ms"
exit "${STUB_BENCH_RC:-0}"
STUB
  chmod +x "$1/caracal_transfer_bench"
}
make_build "$work/ok" 0
make_build "$work/bad" 1

script_under_test=bench-transfers.sh
script_env=(OUT="$work/out")

check_on_build "all passing" "$work/ok" 0 "all passed" "^dispatch 1.0 ms$" --
check_on_build "a failing test and spot check" "$work/bad" 1 "FAILED: test_gpu_nccl_baseline, caracal_transfer_bench" \
  "^caracal_transfer_bench +SPOT CHECK FAILED" -- STUB_BENCH_RC=2
finish test_bench_transfers
