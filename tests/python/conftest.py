"""The Python tests need PyTorch, and those marked `gpu` a Hopper GPU and the built extension; where
one is missing they are skipped with the reason shown, which starts with SKIP_MARKER
("CARACAL_SKIPPED: no GPU"; gpu_requirements.py). A CUDA driver that is installed but unusable fails
them instead, and CARACAL_REQUIRE_GPU=1 (the GPU check scripts set it) turns every GPU skip into a
failure: on the GPU machine a skip hides nothing. A value of CARACAL_REQUIRE_GPU or
CARACAL_REQUIRE_GPUS other than those the GPU tests accept is a usage error."""
import ctypes
import os
import random
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))

from gpu_requirements import SKIP_MARKER, parse_gpu_requirements  # noqa: E402

try:
    import torch
    _torch_missing = None
except ImportError:
    _torch_missing = SKIP_MARKER + "PyTorch not installed"


def _driver_installed():
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def _gpu_missing():
    if not torch.cuda.is_available():
        if _driver_installed() and torch.cuda.device_count() == 0 and os.path.exists("/dev/nvidiactl"):
            raise pytest.UsageError("a CUDA driver and device nodes are present but PyTorch sees no GPU: "
                                    "the driver is broken or does not match PyTorch's CUDA")
        return SKIP_MARKER + "no GPU"
    if torch.cuda.get_device_capability() != (9, 0):
        return f"{SKIP_MARKER}no GPU (needs sm_90, found {torch.cuda.get_device_name()})"
    try:
        from caracal._extension import load
        load()
    except ImportError as e:
        return f"{SKIP_MARKER}extension not built ({e})"
    return None


def _require_gpu():
    """True where CARACAL_REQUIRE_GPU=1; a usage error where either variable's value is refused."""
    gpu, _, error = parse_gpu_requirements(os.environ.get("CARACAL_REQUIRE_GPU"),
                                           os.environ.get("CARACAL_REQUIRE_GPUS"))
    if error:
        raise pytest.UsageError(error)
    return gpu


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a Hopper GPU and the built extension")
    _require_gpu()


def pytest_collection_modifyitems(config, items):
    """Without PyTorch every test is skipped; without a GPU (or the extension) the gpu-marked ones."""
    gpu_reason = _torch_missing or _gpu_missing()
    if gpu_reason and _require_gpu():
        raise pytest.UsageError("CARACAL_REQUIRE_GPU=1 but the GPU tests would skip: " +
                                gpu_reason.removeprefix(SKIP_MARKER))
    for reason, selected in ((_torch_missing, items),
                             (gpu_reason, [item for item in items if item.get_closest_marker("gpu")])):
        if reason and selected:
            print(f"\ncaracal python tests: {len(selected)} {reason}")
            for item in selected:
                item.add_marker(pytest.mark.skip(reason=reason))


_counts = {"gpu": [0, 0], "other": [0, 0]}  # gpu-marked tests and the others: [ran, skipped]


def pytest_runtest_logreport(report):
    """Counts each test once: skipped (in whichever phase), else run (its call phase)."""
    kind = "gpu" if "gpu" in report.keywords else "other"
    if report.skipped:
        _counts[kind][1] += 1
    elif report.when == "call":
        _counts[kind][0] += 1


def pytest_terminal_summary(terminalreporter):
    """The counts scripts/python-tests.sh reads (it reports a run whose GPU tests all skipped as a skip)."""
    (gpu_ran, gpu_skipped), (other_ran, other_skipped) = _counts["gpu"], _counts["other"]
    terminalreporter.write_line(f"caracal python tests: gpu tests {gpu_ran} ran, {gpu_skipped} skipped; "
                                f"other tests {other_ran} ran, {other_skipped} skipped")


@pytest.fixture
def seed():
    """A fresh seed per test (printed, so a failure can be replayed with CARACAL_SEED)."""
    value = int(os.environ.get("CARACAL_SEED", time.time_ns() % (2**31)))
    print(f"seed {value}")
    random.seed(value)
    torch.manual_seed(value)
    return value
