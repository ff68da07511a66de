"""examples/recover_training.py: the training loop of README's "When a rank stalls" (fused AdamW
gated on MoE.fault_flag(), reset() and retry on the abort) through a stall past the timeout: the
stalled step's update is skipped on the GPU, the weights stay finite and equal bit for bit those of
a clean run on the batches whose updates were applied."""
import json
import os
import subprocess
import sys

import pytest

from gpu_requirements import SKIP_MARKER

pytest.importorskip("torch", reason=SKIP_MARKER + "PyTorch not installed")

pytestmark = pytest.mark.gpu

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "recover_training.py")


def test_stalled_step_is_skipped_and_the_rest_is_exact(tmp_path):
    out = tmp_path / "recover.json"
    run = subprocess.run([sys.executable, EXAMPLE, "--steps", "10", "--stall-at", "4", "--json", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["finite"] and result["same"]
    assert result["retried"] >= 1
    assert result["skipped"] in ([], [4]), result  # the stalled step, or none when it raised before its update
    assert all(result["applied"][:4]) and all(result["applied"][5:])
