# What the tests of the device scripts share (sourced): the repository root, a scratch folder
# removed on exit, a failure count, and finish NAME for the last line and the exit status.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
finish() {
  [ "$failures" -eq 0 ] && echo "$1: all passed"
  exit $((failures > 0))
}
