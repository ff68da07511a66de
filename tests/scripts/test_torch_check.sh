#!/usr/bin/env bash
# scripts/torch-check.sh's exit status and verdict, with a stub Python and nvidia-smi (no GPU): a
# failing pytest, training example or benchmark makes it exit 1 with the failed steps named in the
# table and on the last line; a passing run exits 0 and says "all passed" (OUT unset).
source "$(dirname "$0")/script_test_lib.sh"
stub_device_tools

# The stub Python: pytest, the examples and the benchmark exit STUB_PYTEST_RC, STUB_TRAIN_RC,
# STUB_HF_RC and STUB_BENCH_RC (0).
cat >"$work/python" <<'STUB'
#!/usr/bin/env bash
if [ "$1" = -m ] && [ "$2" = pytest ]; then
  if [ "${STUB_PYTEST_RC:-0}" = 0 ]; then echo "3 passed in 0.10s"; else echo "1 failed, 2 passed in 0.10s"; fi
  exit "${STUB_PYTEST_RC:-0}"
fi
[ "$1" = -c ] && { echo 2.11.0+stub; exit 0; }
case "$1" in
  */train_moe.py) echo "loss: 10.4 -> 4.1"; echo "2 runs bitwise identical: yes"; exit "${STUB_TRAIN_RC:-0}" ;;
  */train_hf_model.py) echo "caracal's final loss against grouped_mm's: +0.10% (tolerance 2%)"; echo "two caracal runs bitwise equal: yes"; exit "${STUB_HF_RC:-0}" ;;
  */torch_layer_bench.py) echo "model deepseek-v3"; echo "  | caracal | 1.00 |"; exit "${STUB_BENCH_RC:-0}" ;;
esac
echo "stub python: unexpected $*" >&2
exit 99
STUB
chmod +x "$work/python"

check() {  # check NAME WANT_RC LAST_LINE [PATTERN] -- ENV...: runs torch-check with ENV
  local name=$1 want_rc=$2 last=$3 pattern=$4
  shift 5
  local out rc
  run_and_expect "$name" "$want_rc" "$last" "$pattern" env -u OUT PYTHON="$work/python" "$@" bash "$root/scripts/torch-check.sh"
}

check "all passing, OUT unset" 0 "all passed" "^train_moe.py +loss: 10.4 -> 4.1 \| 2 runs bitwise identical: yes$" --
check "a failing pytest" 1 "FAILED: pytest" "^pytest +FAILED, exit 1: 1 failed, 2 passed" -- STUB_PYTEST_RC=1
check "a failing example and benchmark" 1 "FAILED: train_moe.py, torch_layer_bench.py" \
  "^torch_layer_bench.py +FAILED \(see torch_layer_bench.log\)$" -- STUB_TRAIN_RC=1 STUB_BENCH_RC=2
check "the HF example" 0 "all passed" "^train_hf_model.py +caracal's final loss against grouped_mm's: \+0.10%" --
check "a failing HF example" 1 "FAILED: train_hf_model.py" "^train_hf_model.py +FAILED" -- STUB_HF_RC=1
finish test_torch_check
