#!/usr/bin/env bash
# The Python tests (tests/python, pytest) with $PYTHON (default python3). Where that Python has no
# PyTorch or pytest they are skipped with one visible line; GPU tests skip themselves without a
# Hopper GPU or the built extension (see tests/python/conftest.py). CTest runs this as python_tests.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python="${PYTHON:-python3}"
if ! "$python" -c "import torch, pytest" >/dev/null 2>&1; then
  echo "python tests: CARACAL_SKIPPED: PyTorch not installed (or pytest missing) for $python"
  exit 0
fi
exec "$python" -m pytest "$root/tests/python" -q -rs -p no:cacheprovider "$@"
