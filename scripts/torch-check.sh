#!/usr/bin/env bash
# The PyTorch check, run on a GPU machine (issue 6): pytest of tests/python, the training example
# (per-block compiled, two runs, bitwise-identical losses, a PNG of the loss), the Hugging Face
# training example (examples/train_hf_model.py, when transformers is installed) and the benchmark
# against the plain PyTorch layer; a short summary last, then "FAILED: <steps>" or "all passed" (exit status 1 when a
# step failed). Uses the installed package, or a built extension given as
#   scripts/torch-check.sh [path/to/libcaracal_torch.so]      (logs and plots go to $OUT if set)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
logs="${OUT:-/tmp/caracal-torch-check}"
mkdir -p "$logs"
python="${PYTHON:-python3}"
if [ $# -ge 1 ]; then
  export CARACAL_TORCH_LIBRARY="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
  export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 CARACAL_REQUIRE_GPU=1  # a GPU-test skip here is a failure
summary_width=26
source "$root/scripts/lib/summary.sh"

"$python" -m pytest "$root/tests/python" -q -rs ${PYTEST_ARGS:-} 2>&1 | tee "$logs/pytest.log"
rc=$?  # pytest's (pipefail)
if [ "$rc" -eq 0 ]; then
  record "pytest" "$(tail -n 1 "$logs/pytest.log")"
else
  record_failed "pytest" "FAILED, exit $rc: $(tail -n 1 "$logs/pytest.log")"
fi

if "$python" "$root/examples/train_moe.py" --compile --plot "$logs/train_moe_loss.png" --json "$logs/train_moe.json" \
    2>&1 | tee "$logs/train_moe.log"; then
  record "train_moe.py" "$(grep -E '^loss:' "$logs/train_moe.log") | $(grep -E 'bitwise' "$logs/train_moe.log")"
else
  record_failed "train_moe.py" "FAILED (see train_moe.log)"
fi

# Issue 48: a small Hugging Face model trained with Caracal's experts and with transformers' own
# (needs the optional transformers).
if ! "$python" -c 'import transformers' >/dev/null 2>&1; then
  record "train_hf_model.py" "skipped: transformers not installed"
elif "$python" "$root/examples/train_hf_model.py" --plot "$logs/train_hf_model_loss.png" \
    --json "$logs/train_hf_model.json" 2>&1 | tee "$logs/train_hf_model.log"; then
  record "train_hf_model.py" "$(grep -E "^caracal's final loss" "$logs/train_hf_model.log") | $(grep -E 'bitwise' "$logs/train_hf_model.log")"
else
  record_failed "train_hf_model.py" "FAILED (see train_hf_model.log)"
fi

if "$python" "$root/bench/python/torch_layer_bench.py" --json "$logs/torch_layer_bench.json" 2>&1 \
    | tee "$logs/torch_layer_bench.log"; then
  record "torch_layer_bench.py" "ok"
else
  record_failed "torch_layer_bench.py" "FAILED (see torch_layer_bench.log)"
fi

sed -n '/^NVIDIA\|^model\|^  *| *caracal/,$p' "$logs/torch_layer_bench.log" | tail -n 7
echo
echo "==== caracal torch check: $("$python" -c 'import torch; print(torch.__version__)') on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
print_summary
verdict
