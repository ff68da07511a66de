"""The Python tests need PyTorch, and those marked `gpu` a Hopper GPU and the built extension; where
one is missing they are skipped with the reason shown (CI: "skipped: PyTorch not installed")."""
import os
import random
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))

try:
    import torch
    _torch_missing = None
except ImportError:
    _torch_missing = "skipped: PyTorch not installed"


def _gpu_missing():
    if not torch.cuda.is_available():
        return "skipped: no GPU"
    if torch.cuda.get_device_capability() != (9, 0):
        return f"skipped: no GPU (needs sm_90, found {torch.cuda.get_device_name()})"
    try:
        from caracal._extension import load
        load()
    except ImportError as e:
        return f"skipped: extension not built ({e})"
    return None


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a Hopper GPU and the built extension")


def pytest_collection_modifyitems(config, items):
    """Without PyTorch every test is skipped; without a GPU (or the extension) the gpu-marked ones."""
    gpu_reason = None if _torch_missing else _gpu_missing()
    for reason, selected in ((_torch_missing, items),
                             (gpu_reason, [item for item in items if item.get_closest_marker("gpu")])):
        if reason and selected:
            print(f"\ncaracal python tests: {len(selected)} {reason}")
            for item in selected:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def seed():
    """A fresh seed per test (printed, so a failure can be replayed with CARACAL_SEED)."""
    value = int(os.environ.get("CARACAL_SEED", time.time_ns() % (2**31)))
    print(f"seed {value}")
    random.seed(value)
    torch.manual_seed(value)
    return value
