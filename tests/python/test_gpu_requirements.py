"""CARACAL_REQUIRE_GPU and CARACAL_REQUIRE_GPUS are read as the GPU tests read them
(gpu_requirements.py; tests/gpu/gpu_requirements.hpp): the documented values are accepted, anything
else is a usage error naming the variable, the value and what is accepted. Needs no GPU."""
import os
import subprocess
import sys

import pytest

from gpu_requirements import SKIP_MARKER, parse_gpu_requirements


def test_unset_or_empty_require_nothing():
    assert parse_gpu_requirements(None, None) == (False, 0, None)
    assert parse_gpu_requirements("", "") == (False, 0, None)


def test_documented_values():
    assert parse_gpu_requirements("0", "0") == (False, 0, None)
    assert parse_gpu_requirements("1", "8") == (True, 8, None)
    assert parse_gpu_requirements(None, "08") == (False, 8, None)


@pytest.mark.parametrize("value", ["yes", "true", "no", "2", "01", " 1", "1 ", "-1", "on"])
def test_refuses_other_require_gpu_values(value):
    assert parse_gpu_requirements(value, None) == (
        False, 0, f'CARACAL_REQUIRE_GPU="{value}" is not accepted: it must be unset, empty, "0" or "1"')


@pytest.mark.parametrize("value", ["yes", "-1", "+2", "2x", " 2", "2 ", "0x2", "1.5", "two", "\u00b2"])
def test_refuses_other_require_gpus_values(value):
    assert parse_gpu_requirements(None, value) == (
        False, 0, f'CARACAL_REQUIRE_GPUS="{value}" is not accepted: it must be unset, empty or a non-negative '
                  "decimal integer (the GPUs this machine has)")


@pytest.mark.parametrize("name", ["CARACAL_REQUIRE_GPU", "CARACAL_REQUIRE_GPUS"])
def test_a_refused_value_is_a_usage_error(name):
    env = dict(os.environ, **{name: "yes"})
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider", __file__],
                         env=env, capture_output=True, text=True, timeout=300)
    out = run.stdout + run.stderr
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, out
    assert f'{name}="yes" is not accepted' in out
    assert SKIP_MARKER not in out  # a failure, never a skip
