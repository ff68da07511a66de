"""bench/python/hf_train_bench.py (issue 48's speed figures) without a GPU: the tiny model on the
CPU runs every implementation, "caracal" through the model's own experts (it says why), the table
and the JSON name each; a bad --model is refused by name. On the GPU the script is the figure."""
import json
import os
import subprocess
import sys

import pytest

from gpu_requirements import SKIP_MARKER

pytest.importorskip("torch", reason=SKIP_MARKER + "PyTorch not installed")
pytest.importorskip("transformers", reason=SKIP_MARKER + "transformers not installed (an optional dependency)")

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "python", "hf_train_bench.py")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=300)


def test_tiny_model_on_the_cpu(tmp_path):
    out = tmp_path / "hf.json"
    r = run("--model", "tiny", "--layers", "2", "--batch", "2", "--seq", "16", "--warmup", "0", "--reps", "2",
            "--device", "cpu", "--impls", "caracal,eager", "--json", str(out))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "all ran"
    rows = {row["impl"]: row for row in json.loads(out.read_text())["rows"]}
    assert rows.keys() == {"caracal", "eager"}
    assert rows["caracal"]["fell_back"] and "not all on one CUDA device" in rows["caracal"]["fell_back"][0]
    for row in rows.values():
        assert row["experts_layers"] == 2 and row["step_ms"] > 0 and row["experts_ms"] > 0
        assert len(row["steps_ms"]) == 2


def test_bad_model_is_refused_by_name():
    r = run("--model", "gpt-5", "--device", "cpu")
    assert r.returncode != 0
    assert "--model must be deepseek-v3, qwen3-30b-a3b or tiny, got 'gpt-5'" in r.stderr
