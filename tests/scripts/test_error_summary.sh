#!/usr/bin/env bash
# scripts/lib/error_summary.py's own logic on a made-up log (no GPU): per output the worst figures
# over ranks and tests; d_topk_scores by its per-element measure (|error| / B_t), not by a relative
# Frobenius error, which means nothing where its reference cancels.
source "$(dirname "$0")/script_test_lib.sh"

cat >"$work/test_gpu_layer.log" <<'LOG'
  error rank 0 y: frobenius 1.2e-03, worst row 3.6e-03 [Suite.A]
  error rank 1 y: frobenius 1.1e-03, worst row 4.0e-03 [Suite.A]
  error d_topk_scores: frobenius 7.7e+08, worst |error| / B_t 2.2e-04 [Suite.A]
  error d_topk_scores: frobenius 1.0e-04, worst |error| / B_t 1.0e-04 [Suite.B]
  dgrad of expert 3: relative Frobenius error 2.5e-04
LOG
out=$(python3 "$root/scripts/lib/error_summary.py" "$work/test_gpu_layer.log")
echo "$out"
grep -qE '^test_gpu_layer: y +frobenius 1\.200e-03  worst row 4\.000e-03$' <<<"$out" || fail "y: the worst of both ranks"
grep -qE '^test_gpu_layer: d_topk_scores +worst \|error\| / B_t 2\.200e-04 \(per element; no Frobenius bound\)$' \
  <<<"$out" || fail "d_topk_scores: its per-element measure"
grep -q '7.7' <<<"$out" && fail "d_topk_scores: no relative Frobenius figure"
grep -qE '^test_gpu_layer: dgrad +frobenius 2\.500e-04' <<<"$out" || fail "dgrad: the GEMM suites' lines"
finish test_error_summary
