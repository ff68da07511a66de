#!/usr/bin/env bash
# bench/python/combine_overlap_bound.py (arithmetic, no GPU): its readiness model and verdicts on
# small cases: with one expert every token is ready when its row block's down tile ends; a combine
# that runs at the full rate beside the tiles leaves a shorter tail than one at a quarter, and one
# that keeps a quarter of the rate after the tiles a longer one; down tiles in two passes over the
# experts finish the first pass's tokens at the middle of the down phase; today's
# line is (schedule + GEMMs + combine) / GEMMs; bad arguments are refused.
source "$(dirname "$0")/script_test_lib.sh"
script="$root/bench/python/combine_overlap_bound.py"

python3 - "$script" <<'PY' || fail "the readiness model"
import importlib.util, sys
spec = importlib.util.spec_from_file_location("bound", sys.argv[1])
bound = importlib.util.module_from_spec(spec); spec.loader.exec_module(bound)
# One expert, 256 tokens (two row blocks), down share 0.5: blocks end at 0.75 and 1.0 of the launch.
ready = bound.ready_fractions(1, 1, 256, 0.5, seed=1)
assert ready == [0.75] * 128 + [1.0] * 128, ready[:3] + ready[-3:]
# Two experts, top-2 (every token in both), two blocks each: in two down passes the tokens of
# both experts' first blocks (the first 128) are ready when the first pass ends, at 0.5 + 0.5 / 2.
ready = bound.ready_fractions(2, 2, 256, 0.5, seed=1, down_passes=2)
assert ready == [0.75] * 128 + [1.0] * 128, ready[:3] + ready[-3:]
# In one pass (expert by expert) every token waits for expert 1's blocks.
assert min(bound.ready_fractions(2, 2, 256, 0.5, seed=1)) == 0.875
# Two experts, top-2: every token waits for expert 1; "experts" order ends expert 0 at half the launch.
assert set(bound.ready_fractions(2, 2, 128, 0.5, seed=1, order="experts")) == {1.0}
# Nothing ready before the launch ends: the whole combine is the tail, whatever the share.
assert abs(bound.tail_after_launch([1.0] * 10, 1.0, 0.1, 0.5) - 0.1) < 1e-12
# Everything ready at the start, combined at half rate beside a launch long enough: no tail.
assert bound.tail_after_launch([0.0] * 10, 1.0, 0.1, 0.5) == 0.0
# Nothing ready before the end, the tail at a quarter of the rate: four times the combine.
assert abs(bound.tail_after_launch([1.0] * 10, 1.0, 0.1, 0.5, 0.25) - 0.4) < 1e-12
PY

out=$(python3 "$script" --experts 16 --tokens 1024 --shares 0.25,1 2>&1) || fail "a small case: exit $?"$'\n'"$out"
grep -q "combine after the launch (today): forward / GEMMs alone >= 1.108" <<<"$out" || fail "today's line"$'\n'"$out"
quarter=$(sed -n 's/.*at  25% of its rate, 100% after them: tail *\([0-9.]*\) us.*/\1/p' <<<"$out")
full=$(sed -n 's/.*at 100% of its rate, 100% after them: tail *\([0-9.]*\) us.*/\1/p' <<<"$out")
python3 -c "import sys; sys.exit(not (0 <= float('$full') < float('$quarter')))" 2>/dev/null ||
  fail "a faster combine leaves a shorter tail: quarter '$quarter', full '$full'"$'\n'"$out"
out=$(python3 "$script" --experts 16 --tokens 1024 --down-passes 4 2>&1) || fail "four down passes: exit $?"$'\n'"$out"
grep -q "the down weights read 4 times: 151 MB more from HBM" <<<"$out" || fail "the extra weight bytes"$'\n'"$out"
error="combine_overlap_bound.py: error: need 0 < --top-k <= --experts, --tokens >= 1, --gemms-ms > 0, --combine-ms >= 0, --down-share, --tail-share and every share in (0, 1], --down-passes >= 1 (above 1 with --order phases)"
run_and_expect "bad share" 2 "$error" "" python3 "$script" --shares 0,1
run_and_expect "bad tail share" 2 "$error" "" python3 "$script" --tail-share 0
run_and_expect "passes without phases" 2 "$error" "" python3 "$script" --down-passes 2 --order experts
finish test_combine_overlap_bound
