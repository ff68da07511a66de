"""Loads the compiled operators (the `caracal` namespace of torch.ops) once, on first use."""
import glob
import os

import torch

_loaded = False


def load():
    """Loads _C*.so from this package (built by `pip install --no-build-isolation .`) or from the
    file named by CARACAL_TORCH_LIBRARY, then registers the ops' fake kernels and autograd."""
    global _loaded
    if _loaded:
        return
    path = os.environ.get("CARACAL_TORCH_LIBRARY")
    if not path:
        found = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "_C*.so")))
        if not found:
            raise ImportError(
                "caracal: the compiled extension (caracal/_C*.so) is missing; build it with "
                "`pip install --no-build-isolation .` from the repository root (see README), or set "
                "CARACAL_TORCH_LIBRARY to a built libcaracal_torch.so")
        path = found[0]
    torch.ops.load_library(path)
    from . import _ops  # noqa: F401  (registrations)
    _loaded = True
