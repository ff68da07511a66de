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

# run_and_expect NAME WANT_RC LAST_LINE PATTERN COMMAND...: runs COMMAND, its output (stdout and
# stderr) into $out and its exit status into $rc, and fails NAME unless it exited WANT_RC, its last
# line is LAST_LINE and, where PATTERN is not empty, a line matches the extended regex PATTERN.
run_and_expect() {
  local name=$1 want_rc=$2 last=$3 pattern=$4
  shift 4
  out=$("$@" 2>&1)
  rc=$?
  [ "$rc" -eq "$want_rc" ] || fail "$name: exit $rc, want $want_rc"$'\n'"$out"
  [ "$(tail -n 1 <<<"$out")" = "$last" ] || fail "$name: last line is not '$last' in"$'\n'"$out"
  if [ -n "$pattern" ] && ! grep -qE -- "$pattern" <<<"$out"; then fail "$name: no '$pattern' in"$'\n'"$out"; fi
}

# expect_status WANT_STATUS WHAT COMMAND...: runs COMMAND, its output (stdout and stderr) into $out,
# echoed, its exit status into $status, and fails "WHAT: exit status S" unless it exited WANT_STATUS.
expect_status() {
  local want=$1 what=$2
  shift 2
  out=$("$@" 2>&1)
  status=$?
  echo "$out"
  [ "$status" -eq "$want" ] || fail "${what:+$what: }exit status $status"
}

# check_on_build NAME BUILD WANT_RC LAST_LINE PATTERN -- ENV...: run_and_expect of
# `env "${script_env[@]}" ENV... bash scripts/$script_under_test BUILD` (set both first).
check_on_build() {
  local name=$1 build=$2 want_rc=$3 last=$4 pattern=$5
  shift 6
  local out rc
  run_and_expect "$name" "$want_rc" "$last" "$pattern" env "${script_env[@]}" "$@" \
    bash "$root/scripts/$script_under_test" "$build"
}

# stub_device_tools: nvidia-smi, compute-sanitizer, cuobjdump and torchrun stubs first on PATH (no
# GPU). nvidia-smi lists STUB_GPUS GPUs (1); compute-sanitizer runs the command after its options,
# printing an error in a kernel of ours when STUB_SANITIZER_ERRORS=1; cuobjdump prints STUB_HGMMA
# HGMMA instructions (4), STUB_LDL local-memory loads (0) and the registers of one kernel; torchrun
# exits STUB_TORCHRUN_RC (0).
stub_device_tools() {
  mkdir -p "$work/bin"
  cat >"$work/bin/nvidia-smi" <<'STUB'
#!/usr/bin/env bash
for i in $(seq 0 $((${STUB_GPUS:-1} - 1))); do
  if [ "${1:-}" = -L ]; then echo "GPU $i: NVIDIA H200 (UUID: GPU-stub-$i)"; else echo "NVIDIA H200, 570.00, 143771 MiB, 1980 MHz, 1980 MHz"; fi
done
STUB
  cat >"$work/bin/compute-sanitizer" <<'STUB'
#!/usr/bin/env bash
while [ $# -gt 0 ] && [ "${1#--}" != "$1" ]; do shift 2; done
"$@"
rc=$?
if [ "${STUB_SANITIZER_ERRORS:-0}" = 1 ]; then
  echo "========= Invalid __global__ read of size 4 bytes"
  echo "=========     at caracal::stub_kernel()+0x10"
  echo "========= "
  echo "========= ERROR SUMMARY: 1 error"
  exit 1
fi
echo "========= ERROR SUMMARY: 0 errors"
exit "$rc"
STUB
  cat >"$work/bin/cuobjdump" <<'STUB'
#!/usr/bin/env bash
if [ "$1" = --dump-sass ]; then
  for _ in $(seq 1 "${STUB_HGMMA:-4}"); do echo "        /*0100*/  HGMMA.64x128x16.F32.BF16 gdesc[UR4], RZ, !UPT ;"; done
  for _ in $(seq 1 "${STUB_LDL:-0}"); do echo "        /*0200*/  LDL.64 R2, [R1+0x8] ;"; done
else
  echo "Function stub_kernel:"
  echo "REG:90 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:528 TEXTURE:0 SURFACE:0 SAMPLER:0"
fi
STUB
  printf '#!/usr/bin/env bash\nexit "${STUB_TORCHRUN_RC:-0}"\n' >"$work/bin/torchrun"
  chmod +x "$work/bin"/*
  export PATH="$work/bin:$PATH"
}

# stub_gtest PATH RC [SECONDS]: a test binary that lists one test, sleeps SECONDS (0), prints
# GoogleTest's last lines and exits RC.
stub_gtest() {
  mkdir -p "$(dirname "$1")"
  cat >"$1" <<STUB
#!/usr/bin/env bash
for a in "\$@"; do [ "\$a" = --gtest_list_tests ] && { printf 'Stub.\n  Test\n'; exit 0; }; done
sleep ${3:-0}
echo "[==========] 1 test from 1 test suite ran. (1 ms total)"
if [ $2 -eq 0 ]; then echo "[  PASSED  ] 1 test."; else echo "[  FAILED  ] 1 test, listed below:"; fi
exit $2
STUB
  chmod +x "$1"
}

# stub_nvml DIR: a pynvml module in DIR (put DIR on PYTHONPATH) for scripts/clock-trace.py: one
# H200 at a 700 W limit whose every sample reads an SM clock of 1755 MHz, memory 3201 MHz, 690 W
# (no instant reading: the average), 55 C and the sw power cap; nvmlInit fails with
# STUB_NVML_FAIL set.
stub_nvml() {
  mkdir -p "$1"
  cat >"$1/pynvml.py" <<'STUB'
import os
class NVMLError(Exception):
    pass
NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0
def nvmlInit():
    if os.environ.get("STUB_NVML_FAIL"):
        raise NVMLError("Driver Not Loaded")
def nvmlDeviceGetHandleByIndex(index): return index
def nvmlDeviceGetName(handle): return b"NVIDIA H200"
def nvmlDeviceGetEnforcedPowerLimit(handle): return 700000
def nvmlDeviceGetFieldValues(handle, ids): raise NVMLError("Not Supported")
def nvmlDeviceGetPowerUsage(handle): return 690000
def nvmlDeviceGetClockInfo(handle, kind): return 1755 if kind == NVML_CLOCK_SM else 3201
def nvmlDeviceGetTemperature(handle, sensor): return 55
def nvmlDeviceGetCurrentClocksEventReasons(handle): return 0x4
STUB
}

# stub_ncu_sampling KERNEL: an ncu stub first on PATH for the PC-sampling scripts (gemm-stalls.sh,
# layer-stalls.sh; scripts/lib/sass-digest.sh): each call's arguments appended to $STUB_ARGS (set
# it); a profiling run (-o STEM) writes STEM.ncu-rep, none with STUB_NO_LAUNCH=1; the details page
# reads a duration of 1.03 ms; the SASS page, of kernel KERNEL, holds 100 samples over three
# instructions: an HGMMA 30 (not issued 10), WARPGROUP.DEPBAR 50 (barrier) and a branch 20
# (long_sb). STUB_FAIL=1: every call exits 3.
stub_ncu_sampling() {
  mkdir -p "$work/bin"
  cat >"$work/bin/ncu" <<STUB
#!/usr/bin/env bash
[ "\${STUB_FAIL:-0}" = 1 ] && exit 3
echo "\$*" >>"\$STUB_ARGS"
case " \$* " in
  *" -o "*) [ "\${STUB_NO_LAUNCH:-0}" = 1 ] ||
    while [ \$# -gt 0 ]; do [ "\$1" = -o ] && touch "\$2.ncu-rep"; shift; done ;;
  *"--page details"*) echo "    Duration                         ms         1.03" ;;
  *"--page source"*)
    echo '"Kernel Name","void $1(P)",'
    echo '"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","stall_barrier","stall_barrier (Not Issued)","stall_long_sb","stall_long_sb (Not Issued)"'
    echo '"0x10","HGMMA.64x256x16.F32.BF16 R24, gdesc[UR16], R24","30","10","0","0","0","0"'
    echo '"0x20","WARPGROUP.DEPBAR.LE gsb0, 0x1","50","50","50","50","0","0"'
    echo '"0x30","@!P0  BRA 0x7f00","20","20","0","0","20","20"' ;;
esac
STUB
  chmod +x "$work/bin/ncu"
  export PATH="$work/bin:$PATH"
}
