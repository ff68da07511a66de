#!/usr/bin/env bash
# scripts/gemm-pipes.sh's own logic, with a stub ncu (no GPU): each regex's third launch in
# caracal_gemm_bench is measured with the metrics this ncu knows (the others named and left out),
# one line per kernel is printed, the CSV lands in $OUT, and a failing ncu makes the exit status 1
# while the other kernels still run.
source "$(dirname "$0")/script_test_lib.sh"

mkdir -p "$work/bin" "$work/build" "$work/out"
echo build-commit >"$work/build/COMMIT"
cat >"$work/bin/ncu" <<'STUB'
#!/usr/bin/env bash
if [ "$1" = --query-metrics ]; then
  printf '%s\n' "Device GH100" "gpu__time_duration  Duration" "lts__t_sectors  L2 sectors" "sm__pipe_tensor_cycles_active  MMA" "dram__throughput  DRAM"
  exit 0
fi
echo "$*" >>"$STUB_ARGS"
case " $* " in *" regex:Broken "*) exit 3 ;; esac
while [ $# -gt 0 ]; do [ "$1" = --log-file ] && log="$2"; shift; done
cat >"$log" <<'CSV'
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","1","b","h","void caracal::gemm::grouped_gemm_kernel<X>(P)","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","s","gpu__time_duration.sum","ns","1,860,000"
"0","1","b","h","void caracal::gemm::grouped_gemm_kernel<X>(P)","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","s","lts__t_sectors.avg.pct_of_peak_sustained_elapsed","%","86.5"
"0","1","b","h","void caracal::gemm::grouped_gemm_kernel<X>(P)","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","s","sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active","%","71.3"
CSV
STUB
chmod +x "$work/bin/ncu"
export PATH="$work/bin:$PATH" STUB_ARGS="$work/args"

expect_status 0 "" env OUT="$work/out" bash "$root/scripts/gemm-pipes.sh" "$work/build" deepseek-v3/uniform Fp8UpGate
grep -q -- "-k regex:Fp8UpGate --launch-skip 2 --launch-count 1" "$work/args" || fail "ncu measures the third matching launch"
grep -q -- "--case deepseek-v3/uniform" "$work/args" || fail "the case is passed to the bench"
grep -q -- "--metrics gpu__time_duration.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,lts__t_sectors.avg.pct_of_peak_sustained_elapsed,dram__throughput" "$work/args" ||
  fail "only the metrics ncu knows are asked for"
grep -q "not known to this ncu: sm__pipe_tensor_op_gmma_cycles_active.* (its tensor-pipe metrics: sm__pipe_tensor_cycles_active" <<<"$out" ||
  fail "an unknown metric is named, with the tensor-pipe metrics this ncu has"
grep -q "not known to this ncu: l1tex__data_bank_reads.avg.pct_of_peak_sustained_elapsed$" <<<"$out" || fail "another unknown metric is named once"
grep -Eq "^Fp8UpGate +ms +1\.860 .*tensor% +71\.3 .*L2%  86\.5 .*grouped_gemm_kernel<X>" <<<"$out" || fail "the kernel's line"
[ -f "$work/out/pipes-Fp8UpGate-deepseek-v3-uniform.csv" ] || fail "the CSV in OUT"

expect_status 1 "" env OUT="$work/out" bash "$root/scripts/gemm-pipes.sh" "$work/build" c Broken Fp8UpGate
grep -q "FAILED: ncu on 'Broken'" <<<"$out" || fail "a failing ncu is reported"
grep -q "^Fp8UpGate " <<<"$out" || fail "the next kernel still runs after a failure"
finish test_gemm_pipes
