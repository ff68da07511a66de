#!/usr/bin/env bash
# scripts/python-tests.sh's verdict, with a stub Python through $PYTHON (whatever this machine has
# installed): no PyTorch, no test run or every GPU test skipped is a skip ("python tests:
# CARACAL_SKIPPED: ...", exit status 0) unless CARACAL_REQUIRE_GPU=1 makes it a failure; a failed
# test, a pytest error or missing counts fail, and their output never matches python_tests' skip
# pattern (tests/CMakeLists.txt), which CTest would take over the exit status.
source "$(dirname "$0")/script_test_lib.sh"
pattern="python tests: CARACAL_SKIPPED: "
grep -qF 'python_tests PROPERTIES SKIP_REGULAR_EXPRESSION "python tests: ${CARACAL_SKIP_MARKER}"' \
  "$root/tests/CMakeLists.txt" || fail "python_tests' skip pattern is not '$pattern' in tests/CMakeLists.txt"

# The stub: no PyTorch when STUB_NO_TORCH=1; pytest prints a run (some skip lines, then conftest's
# counts: STUB_COUNTS "GPU_RAN GPU_SKIPPED OTHER_RAN OTHER_SKIPPED", none when empty) and exits STUB_RC.
cat >"$work/python" <<'STUB'
#!/usr/bin/env bash
if [ "$1" = -c ]; then [ "${STUB_NO_TORCH:-0}" = 1 ] && exit 1; exit 0; fi
[ "$1 $2" = "-m pytest" ] || { echo "stub python: unexpected $*" >&2; exit 99; }
echo "ssssss.."
echo "SKIPPED [6] tests/python/test_moe_layer.py:151: CARACAL_SKIPPED: no GPU"
if [ -n "${STUB_COUNTS-0 6 2 0}" ]; then
  read -r a b c d <<<"${STUB_COUNTS-0 6 2 0}"
  echo "caracal python tests: gpu tests $a ran, $b skipped; other tests $c ran, $d skipped"
fi
exit "${STUB_RC:-0}"
STUB
chmod +x "$work/python"

check() {  # check NAME WANT_RC LAST_LINE -- ENV...: runs python-tests.sh with ENV
  local name=$1 want_rc=$2 last=$3
  shift 4
  local out rc
  run_and_expect "$name" "$want_rc" "$last" "" \
    env -u CARACAL_REQUIRE_GPU PYTHON="$work/python" "$@" bash "$root/scripts/python-tests.sh"
  if [ "$rc" -ne 0 ] && grep -qF -- "$pattern" <<<"$out"; then fail "$name: a failure that CTest would take for a skip:"$'\n'"$out"; fi
}

check "no PyTorch" 0 "python tests: CARACAL_SKIPPED: PyTorch not installed (or pytest missing) for $work/python" -- \
  STUB_NO_TORCH=1
check "no PyTorch, a GPU required" 1 \
  "python tests: FAILED: CARACAL_REQUIRE_GPU=1 but PyTorch not installed (or pytest missing) for $work/python" -- \
  STUB_NO_TORCH=1 CARACAL_REQUIRE_GPU=1
check "every GPU test skipped" 0 "python tests: CARACAL_SKIPPED: every GPU test skipped (6; 2 other tests passed)" --
check "every GPU test skipped, a GPU required" 1 \
  "python tests: FAILED: CARACAL_REQUIRE_GPU=1 but every GPU test skipped (6; 2 other tests passed)" -- CARACAL_REQUIRE_GPU=1
check "some GPU tests skipped, a GPU required" 1 "python tests: FAILED: CARACAL_REQUIRE_GPU=1 but 6 GPU tests skipped" -- \
  STUB_COUNTS="3 6 2 0" CARACAL_REQUIRE_GPU=1
check "no test ran" 0 "python tests: CARACAL_SKIPPED: no test ran (8 skipped)" -- STUB_COUNTS="0 6 0 2"
check "every test ran" 0 "python tests: passed (6 GPU tests, 2 others; 0 skipped)" -- STUB_COUNTS="6 0 2 0"
check "every test ran, a GPU required" 0 "python tests: passed (6 GPU tests, 2 others; 0 skipped)" -- \
  STUB_COUNTS="6 0 2 0" CARACAL_REQUIRE_GPU=1
check "a failed test beside skipped GPU tests" 1 "python tests: FAILED (pytest exit status 1)" -- STUB_RC=1
check "a pytest usage error" 4 "python tests: FAILED (pytest exit status 4)" -- STUB_RC=4 CARACAL_REQUIRE_GPUS=all
check "no counts from conftest.py" 1 "python tests: FAILED: no counts from tests/python/conftest.py in pytest's output" -- \
  STUB_COUNTS=
check "a refused CARACAL_REQUIRE_GPU" 2 \
  'python tests: FAILED: CARACAL_REQUIRE_GPU="yes" is not accepted: it must be unset, empty, "0" or "1"' -- \
  STUB_NO_TORCH=1 CARACAL_REQUIRE_GPU=yes
finish test_python_tests
