#!/usr/bin/env bash
# scripts/fused-check.sh's exit status and verdict, with stub builds and device tools (no GPU): a
# failing or missing test binary or a soak digest other than v1's makes it exit 1 with the failed
# steps named in the table and on the last line; a passing run exits 0 and says "all passed".
source "$(dirname "$0")/script_test_lib.sh"
stub_device_tools

make_build() {  # make_build DIR FUSED_FORWARD_RC: stub tests, soak (digest STUB_DIGEST) and bench
  local dir=$1 t
  mkdir -p "$dir/tests"
  echo "stub-$(basename "$dir")" >"$dir/COMMIT"
  echo 2.28.9 >"$dir/NCCL_VERSION"
  for t in test_gpu_gathered_rows test_gpu_moe_layer test_gpu_moe_layer_faults; do stub_gtest "$dir/tests/$t" 0; done
  stub_gtest "$dir/tests/test_gpu_fused_forward" "$2"
  printf '#!/usr/bin/env bash\necho "digest of every output checksum: ${STUB_DIGEST:-ba2e7906cd1d588b}"\n' >"$dir/caracal-soak"
  cat >"$dir/caracal-bench" <<'STUB'
#!/usr/bin/env bash
while [ $# -gt 0 ]; do [ "$1" = --json ] && out=$2; shift; done
echo '{"runs": [{"forward": {"ms": 5.0}, "fwd_bwd": {"ms": 15.0}, "v1": {"forward": {"ms": 5.5}, "fwd_bwd": {"ms": 16.0}}}]}' >"$out"
STUB
  chmod +x "$dir"/caracal*
}
make_build "$work/ok" 0
make_build "$work/bad" 1
make_build "$work/missing" 0
rm "$work/missing/tests/test_gpu_moe_layer_faults"

script_under_test=fused-check.sh
script_env=(-u OUT)

check_on_build "all passing, OUT unset" "$work/ok" 0 "all passed" "fused_bench_w1.json: forward fused 5.000 ms, v1 5.500 ms" --
check_on_build "a failing test binary" "$work/bad" 1 \
  "FAILED: test_gpu_fused_forward, test_gpu_fused_forward racecheck, test_gpu_fused_forward memcheck" \
  "^test_gpu_fused_forward +FAILED \(exit 1\)$" --
check_on_build "a missing test binary" "$work/missing" 1 "FAILED: test_gpu_moe_layer_faults" "^test_gpu_moe_layer_faults +missing$" --
check_on_build "another soak digest" "$work/ok" 1 "FAILED: soak digest (v1: ba2e7906cd1d588b)" \
  "^soak digest \(v1: ba2e7906cd1d588b\) +0123456789abcdef DIFFERS$" -- STUB_DIGEST=0123456789abcdef
finish test_fused_check
