"""bench/python/torch_fp8_moe_layer.py, the plain PyTorch FP8 layer (issue 47's baseline), on a small
shape: --check against the bf16 layer passes (y and every gradient within 15%), both layers are
timed and the JSON names them. Needs a GPU (torch._scaled_grouped_mm is CUDA only)."""
import json
import os
import subprocess
import sys

import pytest

from gpu_requirements import SKIP_MARKER

pytest.importorskip("torch", reason=SKIP_MARKER + "PyTorch not installed")

pytestmark = pytest.mark.gpu

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "python", "torch_fp8_moe_layer.py")


def test_small_shape_checks_and_times(tmp_path):
    out = tmp_path / "fp8.json"
    cmd = [sys.executable, SCRIPT, "--model", "qwen3-30b-a3b", "--experts", "8", "--tokens", "256", "--check",
           "--warmup", "1", "--reps", "2", "--json", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    result = json.loads(out.read_text())
    errors = result["fp8_over_bf16_error"]
    print(errors)
    assert set(errors) >= {"y", "x", "w_gate_up", "w_down"}
    assert all(0 < v <= 0.15 for v in errors.values()), errors
    for label in ("fp8", "bf16"):
        assert result[label]["fwd_bwd"]["ms"] > 0
