#!/usr/bin/env bash
# scripts/gemm-variants.sh's own logic, with stub builds (no GPU): every build runs in every round,
# the table gives each kernel's median per build and its ratio to the first build, the merged JSON
# goes to $OUT, and a build whose bench fails makes the exit status 1.
source "$(dirname "$0")/script_test_lib.sh"

make_build() {  # make_build DIR MS: a stub caracal_gemm_bench whose every kernel takes MS (rc 0)
  mkdir -p "$1"
  cat >"$1/caracal_gemm_bench" <<STUB
#!/usr/bin/env bash
[ "$2" = fail ] && { echo "deliberate failure"; exit 4; }
echo "\$*" >>"$1/calls"
while [ \$# -gt 0 ]; do [ "\$1" = --json ] && out=\$2; shift; done
echo '{"cases": [{"name": "case/a", "results": {"up_gate_swiglu": {"ms": $2}, "cublas_up": {"ms": 0.5}}}]}' >"\$out"
STUB
  chmod +x "$1/caracal_gemm_bench"
}
make_build "$work/base" 2.0
make_build "$work/fast" 1.0
make_build "$work/broken" fail

mkdir -p "$work/out"
out=$(OUT="$work/out" ROUNDS=3 GEMM_CASES="case/a case/b" bash "$root/scripts/gemm-variants.sh" "$work/base" "$work/fast" 2>&1)
status=$?
echo "$out"
[ "$status" -eq 0 ] || fail "exit status $status with two good builds"
[ "$(wc -l <"$work/fast/calls")" -eq 3 ] || fail "each build runs once a round"
grep -q -- "--case case/a --case case/b" "$work/base/calls" || fail "the cases are passed on"
grep -Eq "case/a +up_gate_swiglu +2.000 +1.000 \(2.000\)" <<<"$out" || fail "the medians and the ratio to the first build"
grep -q cublas <<<"$out" && fail "cuBLAS rows are left out"
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['builds']==['base','fast'] and len(d['runs']['$work/fast'])==3" \
  "$work/out/gemm-variants.json" || fail "the merged JSON"

out=$(ROUNDS=1 bash "$root/scripts/gemm-variants.sh" "$work/base" "$work/broken" 2>&1)
status=$?
[ "$status" -eq 1 ] || fail "exit status $status with a failing build, want 1"
grep -q "FAILED: $work/broken round 1" <<<"$out" || fail "the failing build is named"$'\n'"$out"

out=$(bash "$root/scripts/gemm-variants.sh" "$work/base" 2>&1)
[ $? -eq 2 ] || fail "one build only: usage error"
finish test_gemm_variants
