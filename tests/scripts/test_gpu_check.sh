#!/usr/bin/env bash
# scripts/gpu-check.sh's exit status and verdict, with stub builds and device tools (no GPU): a failing
# or hanging test binary, sanitizer errors, a SASS without HGMMA or a build without test binaries
# make it exit 1 with the failed steps named in the table and on the last line; a passing run
# exits 0 and says "all passed", with OUT unset or set; CARACAL_TEST_BINARIES runs the named binaries
# only; the sanitizers run a test a process in parallel with CARACAL_SANITIZER_JOBS, and a sanitizer
# run past its bound fails as cut.
source "$(dirname "$0")/script_test_lib.sh"
stub_device_tools

make_build() {  # make_build DIR TEST:RC[:SECONDS]...: a build holding these test binaries
  local dir=$1 spec
  shift
  mkdir -p "$dir/tests"
  echo "stub-$(basename "$dir")" >"$dir/COMMIT"
  echo 2.28.9 >"$dir/NCCL_VERSION"
  : >"$dir/libcaracal_gemm.a"
  for spec in "$@"; do
    IFS=: read -r name code seconds <<<"$spec"
    stub_gtest "$dir/tests/$name" "$code" "${seconds:-0}"
  done
}
make_build "$work/ok" test_gpu_a:0 test_unit:0
make_build "$work/bad" test_gpu_a:0 test_gpu_b:1
make_build "$work/hang" test_gpu_c:0:30
make_build "$work/empty"
make_build "$work/killed"
cat >"$work/killed/tests/test_gpu_k" <<'STUB'
#!/usr/bin/env bash
# Listed like a test binary; its first run is killed (exit 9, as the OOM killer leaves it), the next pass.
for a in "$@"; do [ "$a" = --gtest_list_tests ] && { printf 'Stub.\n  Test\n'; exit 0; }; done
mkdir "$(dirname "$0")/killed-once" 2>/dev/null && exit 9
echo "[==========] 1 test from 1 test suite ran. (1 ms total)"
echo "[  PASSED  ] 1 test."
STUB
chmod +x "$work/killed/tests/test_gpu_k"

script_under_test=gpu-check.sh
script_env=(-C "$work" -u OUT)

check_on_build "all passing, OUT unset" "$work/ok" 0 "all passed" "^test_gpu_a +ok: 1 run, 0 skipped$" --
check_on_build "all passing, OUT set" "$work/ok" 0 "all passed" "" -- OUT="$work/out"
[ -f "$work/out/gpu-check-logs.tgz" ] && [ -f "$work/out/errors.txt" ] || fail "OUT set: no logs in $work/out"
check_on_build "a failing test binary" "$work/bad" 1 "FAILED: test_gpu_b, test_gpu_b memcheck, test_gpu_b racecheck" \
  "^test_gpu_b +FAILED \(see test_gpu_b.log\)$" --
check_on_build "a hanging test binary" "$work/hang" 1 "FAILED: test_gpu_c" "^test_gpu_c +TIMED OUT after 1 s" -- \
  CARACAL_TEST_TIMEOUT=1 CARACAL_SANITIZE=0
check_on_build "sanitizers only: the tests not run" "$work/bad" 1 "FAILED: test_gpu_b memcheck, test_gpu_b racecheck" \
  "^test_gpu_b memcheck +ERRORS" -- CARACAL_TESTS=0
check_on_build "sanitizers on named binaries only" "$work/bad" 0 "all passed" "" -- CARACAL_TESTS=0 \
  CARACAL_SANITIZE_BINARIES="test_gpu_a"
check_on_build "named test binaries only" "$work/bad" 0 "all passed" "^test_gpu_a +ok: 1 run, 0 skipped$" -- \
  CARACAL_SANITIZE=0 CARACAL_TEST_BINARIES="test_gpu_a"
check_on_build "named test binaries, one failing" "$work/bad" 1 "FAILED: test_gpu_b" "" -- CARACAL_SANITIZE=0 \
  CARACAL_TEST_BINARIES="test_gpu_a test_gpu_b"
check_on_build "named test binaries none of which is built" "$work/bad" 1 "FAILED: test binaries" \
  "^test binaries +none in .* of CARACAL_TEST_BINARIES \(test_gpu_z\)$" -- \
  CARACAL_SANITIZE=0 CARACAL_TEST_BINARIES="test_gpu_z"
check_on_build "sanitizers a test a process, in parallel" "$work/ok" 0 "all passed" \
  "^test_gpu_a memcheck +clean: ours 0, nccl 0 \(1 process\(es\), longest [0-9]+ s\)$" -- CARACAL_TESTS=0 CARACAL_SANITIZER_JOBS=4
check_on_build "sanitizers in parallel, a failing test" "$work/bad" 1 "FAILED: test_gpu_b memcheck, test_gpu_b racecheck" \
  "^test_gpu_a racecheck +clean" -- CARACAL_TESTS=0 CARACAL_SANITIZER_JOBS=4
check_on_build "a sanitizer process killed beside others runs again alone" "$work/killed" 0 "all passed" \
  "^sanitizer processes rerun alone +1 \(killed beside others\)$" -- CARACAL_TESTS=0 CARACAL_SANITIZER_JOBS=2
check_on_build "a sanitizer run past its bound" "$work/hang" 1 "FAILED: test_gpu_c memcheck, test_gpu_c racecheck" \
  "^test_gpu_c memcheck +CUT: 1 of 1 process\(es\) past 1 s" -- CARACAL_TESTS=0 CARACAL_SANITIZER_TIMEOUT=1
check_on_build "sanitizer errors" "$work/ok" 1 "FAILED: test_gpu_a memcheck, test_gpu_a racecheck" \
  "^test_gpu_a memcheck +ERRORS: ours 1, nccl 0" -- STUB_SANITIZER_ERRORS=1
check_on_build "no HGMMA in the SASS" "$work/ok" 1 "FAILED: SASS HGMMA instructions" "" -- STUB_HGMMA=0
check_on_build "no test binaries" "$work/empty" 1 "FAILED: test binaries" "^test binaries +none in " --
finish test_gpu_check
