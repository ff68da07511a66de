#!/usr/bin/env bash
# scripts/fused-fp8-ab.sh's own logic, with stub builds (no GPU): the new build's tests run first and
# a failure or a hang stops the check before the benchmarks; the separate launches run on the new
# build and the fused forward with --fused-fp8-forward on each; the table holds each layer's medians
# and the fused forwards over the separate launches'; the exit status and last line say whether all
# of it passed.
source "$(dirname "$0")/script_test_lib.sh"

make_build() {  # make_build DIR FUSED_MS TEST_RC: stub caracal-bench (FP8 forward 1.0 ms and backward 2.0 ms
               # separate, FUSED_MS with --fused-fp8-forward, 2 x FUSED_MS with --fused-fp8-backward) and tests
  local dir=$1
  mkdir -p "$dir/tests"
  echo "stub-$(basename "$dir")" >"$dir/COMMIT"
  cat >"$dir/caracal-bench" <<STUB
#!/usr/bin/env bash
echo "\$*" >>"\$(dirname "\$0")/bench-args"
ms=1.0 bwd=2.0
while [ \$# -gt 0 ]; do
  case "\$1" in --json) out=\$2 ;; --fused-fp8-forward) ms=$2 ;; --fused-fp8-backward) bwd=\$(python3 -c "print(2 * $2)") ;; esac
  shift
done
echo "{\"runs\": [{\"forward\": {\"ms\": \$ms}, \"backward\": {\"ms\": \$bwd}, \"fwd_bwd\": {\"ms\": 3.0}}]}" >"\$out"
STUB
  printf '#!/usr/bin/env bash\n%s\n' "$3" >"$dir/tests/test_gpu_moe_layer_fp8"
  chmod +x "$dir/caracal-bench" "$dir/tests/test_gpu_moe_layer_fp8"
}
make_build "$work/old" 1.2 "exit 0"
make_build "$work/new" 0.9 "exit 0"
make_build "$work/broken" 0.9 "echo deliberate failure; exit 1"
make_build "$work/hang" 0.9 "sleep 30"
# compute-sanitizer: runs its command (the stub tests), as the real one does when it finds nothing.
mkdir -p "$work/bin"
printf '#!/usr/bin/env bash\nwhile [ "${1#--}" != "$1" ]; do case "$1" in --tool|--error-exitcode) shift ;; esac; shift; done\nexec "$@"\n' \
  >"$work/bin/compute-sanitizer"
chmod +x "$work/bin/compute-sanitizer"

ab() {  # ab NAME WANT_RC LAST_LINE PATTERN NEW ENV...
  local name=$1 want_rc=$2 last=$3 pattern=$4 new=$5
  shift 5
  run_and_expect "$name" "$want_rc" "$last" "$pattern" \
    env -u OUT PATH="$work/bin:$PATH" OUT="$work/out-$name" "$@" bash "$root/scripts/fused-fp8-ab.sh" "$work/old" "$new"
}

ab passes 0 "all passed" '^\| qwen3-30b-a3b:128:8192 \| 1\.000 \| 1\.200 \(1\.200\) \| 0\.900 \(0\.900\) \|' "$work/new"
grep -q '^| deepseek-v3:32:4096 |' "$work/out-passes/fused-fp8-ab.md" || fail "passes: no DeepSeek-V3 row"
[ "$(grep -c -- '--fused-fp8-forward' "$work/new/bench-args")" -eq 4 ] || fail "new: 4 fused runs expected"
[ "$(grep -vc -- '--fused-fp8-forward' "$work/new/bench-args")" -eq 4 ] || fail "new: 4 separate runs expected"
grep -- '--precision fp8' "$work/old/bench-args" | grep -q -- '--fused-fp8-forward' || fail "old: fused FP8 runs expected"
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["layers"]["deepseek-v3:32:4096"]["new"]["forward_median_ms"] == 0.9' \
  "$work/out-passes/fused-fp8-ab.json" || fail "passes: the JSON's medians"
# At most 8 files come back from a device call: the table, the JSON and every run's files packed.
[ "$(cd "$work/out-passes" && find . -type f | sort | tr '\n' ' ')" = "./details.tgz ./fused-fp8-ab.json ./fused-fp8-ab.md " ] ||
  fail "passes: the output folder: $(cd "$work/out-passes" && find . -type f | sort | tr '\n' ' ')"
ab "a failing test stops the check" 1 "FAILED: test_gpu_moe_layer_fp8, benchmarks" "not run: a test of the new build failed" \
  "$work/broken"
[ ! -e "$work/broken/bench-args" ] || fail "a failing test: the benchmarks ran"
ab "a hanging test is bounded" 1 "FAILED: test_gpu_moe_layer_fp8, benchmarks" "FAILED \(rc 124\)" "$work/hang" TEST_TIMEOUT=1
ab "one layer, one round" 0 "all passed" '^\| glm-5:32:4096 \|' "$work/new" LAYERS=glm-5:32:4096 ROUNDS=1
# The backward, NEW alone (OLD "-"): its separate and fused backward, the backward bits test.
rm -f "$work/new/bench-args"
printf '#!/usr/bin/env bash\necho "$*" >>"$(dirname "$0")/../test-args"\n' >"$work/new/tests/test_gpu_moe_layer_fp8"
run_and_expect "the backward, new alone" 0 "all passed" \
  '^\| qwen3-30b-a3b:128:8192 \| 2\.000 \| - \(-\) \| 1\.800 \(0\.900\) \|' \
  env -u OUT PATH="$work/bin:$PATH" OUT="$work/out-backward" PASS=backward bash "$root/scripts/fused-fp8-ab.sh" - "$work/new"
[ "$(grep -c -- '--fused-fp8-backward' "$work/new/bench-args")" -eq 4 ] || fail "backward: 4 fused runs expected"
grep -q -- '--gtest_filter=\*FusedBackwardGivesTheSeparateLaunchesBits\*' "$work/new/test-args" || fail "backward: its bits test under memcheck"
ab "a bad pass" 2 "fused-fp8-ab: PASS: expected forward or backward, got 'sideways'" "" "$work/new" PASS=sideways
ab "a bad layer" 2 "fused-fp8-ab: LAYERS: expected model:experts:tokens, got 'glm-5'" "" "$work/new" LAYERS=glm-5
finish test_fused_fp8_ab
