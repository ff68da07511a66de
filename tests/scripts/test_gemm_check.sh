#!/usr/bin/env bash
# scripts/gemm-check.sh's exit status and verdict, with a stub build, device tools and
# bench/python/torch_grouped_mm.py (no GPU): a failing test binary, local memory in the SASS, a failed spot
# check of the bench or a failing torch_grouped_mm.py make it exit 1 with the failed steps named in
# the table and on the last line; a passing run exits 0 and says "all passed" (OUT unset).
source "$(dirname "$0")/script_test_lib.sh"
stub_device_tools

make_build() {  # make_build DIR GROUPED_GEMM_RC: stub tests and caracal_gemm_bench (exits STUB_GEMM_RC)
  local dir=$1
  mkdir -p "$dir/tests"
  echo "stub-$(basename "$dir")" >"$dir/COMMIT"
  : >"$dir/libcaracal_gemm.a"
  stub_gtest "$dir/tests/test_gpu_grouped_gemm" "$2"
  stub_gtest "$dir/tests/test_gpu_grouped_gemm_backward" 0
  cat >"$dir/caracal_gemm_bench" <<'STUB'
#!/usr/bin/env bash
while [ $# -gt 0 ]; do [ "$1" = --json ] && out=$2; shift; done
echo '{"cases": []}' >"$out"
exit "${STUB_GEMM_RC:-0}"
STUB
  chmod +x "$dir/caracal_gemm_bench"
}
make_build "$work/ok" 0
make_build "$work/bad" 1
# gemm-check runs bench/python/torch_grouped_mm.py from the current folder: a stub there (exits STUB_TORCH_RC).
mkdir -p "$work/cwd/bench/python"
cat >"$work/cwd/bench/python/torch_grouped_mm.py" <<'STUB'
import json, os, sys
json.dump({"cases": []}, open(sys.argv[sys.argv.index("--json") + 1], "w"))
sys.exit(int(os.environ.get("STUB_TORCH_RC", "0")))
STUB

script_under_test=gemm-check.sh
script_env=(-C "$work/cwd" -u OUT)

check_on_build "all passing, OUT unset" "$work/ok" 0 "all passed" "^torch_grouped_mm.py +ok$" --
check_on_build "a failing test binary" "$work/bad" 1 \
  "FAILED: test_gpu_grouped_gemm, sanitizer memcheck (test_gpu_grouped_gemm), sanitizer racecheck (test_gpu_grouped_gemm)" \
  "^test_gpu_grouped_gemm +FAILED, exit 1 \(see test.log\)$" --
check_on_build "local memory in the SASS" "$work/ok" 1 "FAILED: SASS LDL/STL (local memory)" \
  "^SASS LDL/STL \(local memory\) +2 \(see sass.txt\)$" -- STUB_LDL=2
check_on_build "a failed spot check" "$work/ok" 1 "FAILED: caracal_gemm_bench" "^caracal_gemm_bench +SPOT CHECK FAILED" -- STUB_GEMM_RC=2
check_on_build "a failing torch_grouped_mm.py" "$work/ok" 1 "FAILED: torch_grouped_mm.py" "" -- STUB_TORCH_RC=1
finish test_gemm_check
