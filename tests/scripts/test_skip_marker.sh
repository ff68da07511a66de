#!/usr/bin/env bash
# The skip marker (CARACAL_SKIP_MARKER, "CARACAL_SKIPPED: "): CTest counts a test whose output holds
# it as skipped whatever its exit status, so every skip path uses it and nothing else prints it. One
# value everywhere; no source, tool, benchmark, example or script prints it but the skip paths
# (tests/gpu, tests/python, scripts/python-tests.sh); every GTEST_SKIP of the GPU tests and every
# importorskip of the Python tests starts with it.
source "$(dirname "$0")/script_test_lib.sh"
marker="CARACAL_SKIPPED: "
cd "$root" || exit 1

grep -qF "#define CARACAL_SKIP_MARKER \"$marker\"" tests/gpu/gpu_requirements.hpp || fail "gpu_requirements.hpp: another marker"
grep -qF "SKIP_MARKER = \"$marker\"" tests/python/gpu_requirements.py || fail "gpu_requirements.py: another marker"
grep -qF "set(CARACAL_SKIP_MARKER \"$marker\")" tests/CMakeLists.txt || fail "tests/CMakeLists.txt: another marker"
grep -qF "echo \"python tests: $marker" scripts/python-tests.sh || fail "python-tests.sh: another marker"

found=$(grep -rnF "CARACAL_SKIPPED" src include tools bench python examples scripts setup.py pyproject.toml |
  grep -v '^scripts/python-tests\.sh:')
[ -z "$found" ] || fail "the skip marker outside the skip paths:"$'\n'"$found"

skips=$(grep -rn "GTEST_SKIP()" tests/gpu | grep -v "CARACAL_SKIP_MARKER")
[ -z "$skips" ] || fail "GPU test skips without the marker:"$'\n'"$skips"
skips=$(grep -rn "importorskip(" tests/python | grep -v "reason=SKIP_MARKER + ")
[ -z "$skips" ] || fail "Python test skips without the marker:"$'\n'"$skips"
skips=$(grep -rn "skipped: " tests/gpu tests/python scripts/python-tests.sh | grep -v "$marker")
[ -z "$skips" ] || fail "the old marker \"skipped: \" in a skip path:"$'\n'"$skips"
finish test_skip_marker
