#!/usr/bin/env bash
# scripts/rows-ab.sh's own logic, with a stub build (no GPU): both transfer designs are run and the
# table pairs them (per-route and per-token times, their ratio, the bytes' ratio) for dispatch,
# combine and reverse combine, not reverse dispatch (a row per route either way); a failing run
# makes the exit status 1.
source "$(dirname "$0")/script_test_lib.sh"

make_build() {  # make_build DIR EXIT_STATUS: stub caracal_transfer_bench and caracal-bench
  local dir=$1
  mkdir -p "$dir"
  echo 2.28.9 >"$dir/NCCL_VERSION"
  cat >"$dir/caracal_transfer_bench" <<STUB
#!/usr/bin/env bash
per_route=0
while [ \$# -gt 0 ]; do
  [ "\$1" = --json ] && out=\$2
  [ "\$1" = --rows-per-route ] && per_route=1
  shift
done
if [ \$per_route = 1 ]; then ms=2.0; bytes=3.0; else ms=1.0; bytes=2.0; fi
echo "{\"cases\": [{\"model\": \"deepseek-v3\", \"world\": 8, \"passes\": [{\"pass\": \"dispatch\", \"ms\": \$ms, \"bytes_moved\": \$bytes}, {\"pass\": \"combine\", \"ms\": \$ms, \"bytes_moved\": \$bytes}, {\"pass\": \"reverse_dispatch\", \"ms\": 9.0, \"bytes_moved\": 9.0}]}]}" >"\$out"
exit $2
STUB
  cat >"$dir/caracal-bench" <<'STUB'
#!/usr/bin/env bash
per_route=0
while [ $# -gt 0 ]; do
  [ "$1" = --json ] && out=$2
  [ "$1" = --rows-per-route ] && per_route=1
  shift
done
if [ $per_route = 1 ]; then f=6.0; b=12.0; else f=5.0; b=10.0; fi
echo "{\"runs\": [{\"forward\": {\"ms\": $f}, \"backward\": {\"ms\": $b}}]}" >"$out"
STUB
  chmod +x "$dir"/caracal*
}
make_build "$work/ok" 0
make_build "$work/broken" 1

out=$(OUT="$work/out-ok" bash "$root/scripts/rows-ab.sh" "$work/ok" 2>&1)
rc=$?
[ "$rc" -eq 0 ] || fail "passing runs: exit $rc"$'\n'"$out"
grep -Eq "deepseek-v3 W8 dispatch +2\.000 +1\.000 +2\.00 +1\.50" <<<"$out" || fail "no dispatch line in"$'\n'"$out"
grep -Eq "deepseek-v3 W8 combine +2\.000 +1\.000 +2\.00 +1\.50" <<<"$out" || fail "no combine line in"$'\n'"$out"
grep -q "reverse_dispatch" <<<"$out" && fail "reverse dispatch (a row per route either way) in"$'\n'"$out"
grep -Eq "fused forward, all rows pulled, W1 +6\.000 +5\.000 +1\.20" <<<"$out" || fail "no W1 forward line in"$'\n'"$out"
grep -Eq "fused backward, all rows pulled, W2 +12\.000 +10\.000 +1\.20" <<<"$out" || fail "no W2 backward line in"$'\n'"$out"

out=$(OUT="$work/out-broken" bash "$root/scripts/rows-ab.sh" "$work/broken" 2>&1)
rc=$?
[ "$rc" -eq 1 ] || fail "a failing run: exit $rc, want 1"$'\n'"$out"
grep -q "FAILED" <<<"$out" || fail "a failing run is not reported in"$'\n'"$out"

finish test_rows_ab
