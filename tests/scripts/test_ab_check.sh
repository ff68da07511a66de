#!/usr/bin/env bash
# scripts/ab-check.sh's own logic, with stub builds (no GPU): the new build's tests run first and a
# failure or a hang stops the check before the benchmarks; the soak checksums of the two builds are
# compared; the layer's runs take AB_LAYER_ARGS; the exit status says whether all of it passed and
# the last line names the failed steps ("FAILED: a, b") or says "all passed".
source "$(dirname "$0")/script_test_lib.sh"

make_build() {  # make_build DIR CHECKSUM: stub caracal-soak, caracal-bench and tests
  local dir=$1
  mkdir -p "$dir/tests"
  echo "$2" >"$dir/checksum"
  echo "stub-$(basename "$dir")" >"$dir/COMMIT"
  cat >"$dir/caracal-soak" <<'STUB'
#!/usr/bin/env bash
while [ $# -gt 0 ]; do [ "$1" = --checksums ] && out=$2; shift; done
cat "$(dirname "$0")/checksum" >"$out"
STUB
  cat >"$dir/caracal-bench" <<'STUB'
#!/usr/bin/env bash
echo "$*" >>"$(dirname "$0")/bench-args"
while [ $# -gt 0 ]; do [ "$1" = --json ] && out=$2; shift; done
echo '{"runs": [{"forward": {"ms": 1.0}, "backward": {"ms": 2.0}, "fwd_bwd": {"ms": 3.0}}]}' >"$out"
STUB
  printf '#!/usr/bin/env bash\nexit 0\n' >"$dir/tests/test_pass"
  printf '#!/usr/bin/env bash\necho deliberate failure\nexit 1\n' >"$dir/tests/test_fail"
  printf '#!/usr/bin/env bash\nsleep 30\n' >"$dir/tests/test_hang"
  chmod +x "$dir"/caracal-* "$dir"/tests/*
}
make_build "$work/old" same
make_build "$work/new" same
make_build "$work/other" different

check() {  # check NAME WANT_RC LAST_LINE PATTERN [!PATTERN] -- ENV...: runs ab-check with ENV
  local name=$1 want_rc=$2 last=$3 pattern=$4 absent=$5
  shift 6
  local out rc
  run_and_expect "$name" "$want_rc" "$last" "" \
    env -u OUT "$@" ROUNDS=1 GEMM_CASES=none bash "$root/scripts/ab-check.sh" "$work/old" "${NEW:-$work/new}"
  grep -q -- "$pattern" <<<"$out" || fail "$name: no '$pattern' in"$'\n'"$out"
  if [ -n "$absent" ] && grep -q -- "$absent" <<<"$out"; then fail "$name: '$absent' in"$'\n'"$out"; fi
}

check "a failing test stops the check" 1 "FAILED: test_fail" "not run: a test of the new build failed" "soak checksums" -- \
  AB_TESTS="test_pass test_fail"
check "a hanging test is bounded and stops it" 1 "FAILED: test_hang" "test_hang .*FAILED (rc 124)" "soak checksums" -- \
  AB_TESTS=test_hang AB_TEST_TIMEOUT=1
check "passing tests, the same bits" 0 "all passed" "bitwise identical" "FAILED" -- AB_TESTS=test_pass
NEW="$work/other" check "other bits" 1 "FAILED: soak checksums old vs new" "DIFFER" "" --
check "the layer's extra arguments" 0 "all passed" "T=4096 W=1 --graph --bf16-weight-grads" "FAILED" -- \
  AB_LAYER_ARGS="--graph --bf16-weight-grads"
grep -q -- "--no-validate --graph --bf16-weight-grads --json" "$work/new/bench-args" ||
  fail "AB_LAYER_ARGS not passed to caracal-bench: $(cat "$work/new/bench-args")"
finish test_ab_check
