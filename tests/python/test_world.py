"""caracal.World's bookkeeping that needs no GPU: how the ranks' engine records are compared when an
NCCL world makes an engine (World._agree_on_next_engine), so that ranks that diverge get an error
naming each rank's instead of a hang on a store key or heaps laid out differently."""
import os
import sys

import pytest

from gpu_requirements import SKIP_MARKER

pytest.importorskip("torch", reason=SKIP_MARKER + "PyTorch not installed")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
from caracal.world import _first_divergence  # noqa: E402

KEY = (1024, 512, 32, 4, 512, 4096, True, 1.0, 0, 0, True, 0, True)


def test_ranks_making_the_same_engine_agree():
    assert _first_divergence([(3, 1, KEY)] * 4) == ""


def test_a_rank_with_another_configuration_is_named():
    other = KEY[:3] + (8,) + KEY[4:]
    message = _first_divergence([(3, 1, KEY), (3, 1, other)])
    assert "rank 0: NCCL ids shared 3, engines made 1, configuration " + str(KEY) in message
    assert "rank 1: NCCL ids shared 3, engines made 1, configuration " + str(other) in message


def test_a_rank_that_made_an_extra_engine_is_named():
    message = _first_divergence([(3, 1, KEY), (4, 2, KEY), (3, 1, KEY)])
    assert "rank 1: NCCL ids shared 4, engines made 2" in message
