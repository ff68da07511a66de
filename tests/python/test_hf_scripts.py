"""Issue 48's two scripts without a GPU (on the GPU they are the figures): bench/python/hf_train_bench.py
(the tiny model on the CPU runs every implementation, "caracal" through the model's own experts,
saying why; the table and the JSON name each; a bad --model refused by name) and
examples/train_hf_model.py (a few steps on the CPU: caracal's two runs bitwise equal, its loss
within the tolerance of grouped_mm's; a bad --arch refused by name)."""
import json
import os
import subprocess
import sys

import pytest

from gpu_requirements import SKIP_MARKER

pytest.importorskip("torch", reason=SKIP_MARKER + "PyTorch not installed")
pytest.importorskip("transformers", reason=SKIP_MARKER + "transformers not installed (an optional dependency)")

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SCRIPT = os.path.join(ROOT, "bench", "python", "hf_train_bench.py")
EXAMPLE = os.path.join(ROOT, "examples", "train_hf_model.py")


def run(*args, script=SCRIPT):
    return subprocess.run([sys.executable, script, *args], capture_output=True, text=True, timeout=300)


def test_tiny_model_on_the_cpu(tmp_path):
    out = tmp_path / "hf.json"
    r = run("--model", "tiny", "--layers", "2", "--batch", "2", "--seq", "16", "--warmup", "0", "--reps", "2",
            "--device", "cpu", "--impls", "caracal,eager", "--json", str(out), "--profile")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "all ran"
    assert "caracal      no GPU timeline on cpu" in r.stdout
    rows = {row["impl"]: row for row in json.loads(out.read_text())["rows"]}
    assert rows.keys() == {"caracal", "eager"}
    assert rows["caracal"]["fell_back"] and "not all on one CUDA device" in rows["caracal"]["fell_back"][0]
    for row in rows.values():
        assert row["experts_layers"] == 2 and row["step_ms"] > 0 and row["experts_ms"] > 0
        assert len(row["steps_ms"]) == 2


def test_gpu_busy_time_is_the_union_of_the_intervals():
    import importlib.util
    spec = importlib.util.spec_from_file_location("hf_train_bench", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.busy_and_span([]) == (0.0, 0.0)
    # [0, 4) and [2, 6) overlap into [0, 6); [7, 8) apart; [8, 9) touching it; [1, 3) inside.
    assert bench.busy_and_span([(7, 8), (0, 4), (2, 6), (8, 9), (1, 3)]) == (8, 9)


def test_bad_model_is_refused_by_name():
    r = run("--model", "gpt-5", "--device", "cpu")
    assert r.returncode != 0
    assert "--model must be deepseek-v3, qwen3-30b-a3b or tiny, got 'gpt-5'" in r.stderr


def test_train_example_on_the_cpu(tmp_path):
    out = tmp_path / "loss.json"
    r = run("--device", "cpu", "--arch", "qwen3-moe", "--steps", "10", "--seq-len", "16", "--batch", "2",
            "--impls", "caracal,grouped_mm", "--json", str(out), script=EXAMPLE)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "two caracal runs bitwise equal: yes" in r.stdout
    assert r.stdout.strip().splitlines()[-1] == "all passed"
    result = json.loads(out.read_text())
    assert set(result["losses"]) == {"caracal, run 1", "caracal, run 2", "grouped_mm"}
    assert all(len(v) == 10 for v in result["losses"].values())


def test_train_example_refuses_a_bad_arch():
    r = run("--device", "cpu", "--arch", "mixtral", script=EXAMPLE)
    assert r.returncode != 0
    assert "--arch must be deepseek-v3 or qwen3-moe, got 'mixtral'" in r.stderr
