#!/usr/bin/env bash
# The Python tests (tests/python, pytest) with $PYTHON (default python3); CTest runs this as
# python_tests. GPU tests skip themselves without a Hopper GPU or the built extension
# (tests/python/conftest.py, which prints the counts read here). The last line is the verdict:
#   "python tests: CARACAL_SKIPPED: <why>" (CTest: skipped; exit status 0) where that Python has no
#     PyTorch or pytest, no test ran, or every GPU test skipped;
#   "python tests: FAILED<: why>" (exit status non-zero) where a test failed, pytest could not run
#     (a refused CARACAL_REQUIRE_GPU(S) value is a usage error) or, under CARACAL_REQUIRE_GPU=1, a
#     GPU test skipped or would have;
#   "python tests: passed (<counts>)" otherwise.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python="${PYTHON:-python3}"
case "${CARACAL_REQUIRE_GPU:-}" in
  "" | 0 | 1) ;;
  *)
    echo "python tests: FAILED: CARACAL_REQUIRE_GPU=\"$CARACAL_REQUIRE_GPU\" is not accepted: it must be unset, empty, \"0\" or \"1\""
    exit 2
    ;;
esac
skipped() {  # skipped WHY: the skip verdict; a failure under CARACAL_REQUIRE_GPU=1
  if [ "${CARACAL_REQUIRE_GPU:-}" = 1 ]; then
    echo "python tests: FAILED: CARACAL_REQUIRE_GPU=1 but $1"
    exit 1
  fi
  echo "python tests: CARACAL_SKIPPED: $1"
  exit 0
}

if ! "$python" -c "import torch, pytest" >/dev/null 2>&1; then
  skipped "PyTorch not installed (or pytest missing) for $python"
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$python" -m pytest "$root/tests/python" -q -rs -p no:cacheprovider "$@" 2>&1 | tee "$log"
rc=$?  # pytest's (pipefail)
if [ "$rc" -ne 0 ]; then
  echo "python tests: FAILED (pytest exit status $rc)"
  exit "$rc"
fi
counts=$(sed -n 's/^caracal python tests: gpu tests \([0-9]*\) ran, \([0-9]*\) skipped; other tests \([0-9]*\) ran, \([0-9]*\) skipped$/\1 \2 \3 \4/p' "$log" | tail -n 1)
if [ -z "$counts" ]; then
  echo "python tests: FAILED: no counts from tests/python/conftest.py in pytest's output"
  exit 1
fi
read -r gpu_ran gpu_skipped other_ran other_skipped <<<"$counts"
[ $((gpu_ran + other_ran)) -gt 0 ] || skipped "no test ran ($((gpu_skipped + other_skipped)) skipped)"
[ "$gpu_ran" -gt 0 ] || [ "$gpu_skipped" -eq 0 ] || skipped "every GPU test skipped ($gpu_skipped; $other_ran other tests passed)"
[ "$gpu_skipped" -eq 0 ] || [ "${CARACAL_REQUIRE_GPU:-}" != 1 ] || {
  echo "python tests: FAILED: CARACAL_REQUIRE_GPU=1 but $gpu_skipped GPU tests skipped"
  exit 1
}
echo "python tests: passed ($gpu_ran GPU tests, $other_ran others; $((gpu_skipped + other_skipped)) skipped)"
