"""What a skip of the Python tests prints, and CARACAL_REQUIRE_GPU / CARACAL_REQUIRE_GPUS read as the
GPU tests read them (tests/gpu/gpu_requirements.hpp): strictly, so that a value meaning something
else fails loudly instead of skipping. Needs no PyTorch."""

# Starts every skip reason of the Python tests (conftest.py, the importorskip calls), as
# CARACAL_SKIP_MARKER does the GPU tests' (tests/gpu/gpu_requirements.hpp). Nothing else may print it
# (tests/scripts/test_skip_marker.sh).
SKIP_MARKER = "CARACAL_SKIPPED: "


def parse_gpu_requirements(require_gpu, require_gpus):
    """(gpu, gpus, error) from the variables' values (None where unset): gpu is True for
    CARACAL_REQUIRE_GPU=1 (unset, empty and "0" mean False); gpus is CARACAL_REQUIRE_GPUS, a
    non-negative decimal integer (0 when unset or empty); error names the variable, the value and what
    is accepted when a value is refused, else None."""
    errors = []
    if require_gpu not in (None, "", "0", "1"):
        errors.append(f'CARACAL_REQUIRE_GPU="{require_gpu}" is not accepted: it must be unset, empty, "0" or "1"')
    gpus = 0
    if require_gpus and require_gpus.isascii() and require_gpus.isdigit():
        gpus = int(require_gpus)
    elif require_gpus:
        errors.append(f'CARACAL_REQUIRE_GPUS="{require_gpus}" is not accepted: it must be unset, empty or a '
                      "non-negative decimal integer (the GPUs this machine has)")
    return require_gpu == "1", gpus, "; ".join(errors) or None
