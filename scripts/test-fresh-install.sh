#!/usr/bin/env bash
# The README's PyTorch install, run as a user would on a fresh virtual environment:
#   python3 -m venv, pip install torch==2.11.0 (PyPI's CUDA 13.0 wheels; the venv's own setuptools
#   and no `wheel`), a clean clone of this repository's HEAD, then exactly
#     scripts/install-deps.sh && pip install --no-build-isolation .
#   and, from outside the source tree, `import caracal` and loading the extension (registers the
#   operators; no GPU needed).
# Usage: scripts/test-fresh-install.sh [work-dir]
#   Downloads about 3 GB (PyTorch and its CUDA libraries) and builds the extension from scratch
#   (about 20 minutes on 2 cores without a warm ccache). CARACAL_FRESH_VENV=DIR reuses a venv that
#   holds only PyTorch, skipping the download.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work="${1:-$(mktemp -d)}"
venv="${CARACAL_FRESH_VENV:-$work/venv}"
mkdir -p "$work"
if [ ! -x "$venv/bin/python" ]; then
  echo "test-fresh-install: python3 -m venv $venv; pip install torch==2.11.0"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check torch==2.11.0
fi
rm -rf "$work/caracal"
git clone -q "$root" "$work/caracal"
cd "$work/caracal"
export PATH="$venv/bin:$PATH"  # python3 and pip of the venv, as after `source venv/bin/activate`
echo "test-fresh-install: $(python3 -c 'import torch, setuptools; print("torch", torch.__version__, "setuptools", setuptools.__version__)')"
start=$(date +%s)
scripts/install-deps.sh && pip install -q --disable-pip-version-check --no-build-isolation .
echo "test-fresh-install: install took $(( $(date +%s) - start )) s"
cd "$work"  # not the source tree: the installed package
python3 - <<'PY'
import torch, caracal
from caracal._extension import load
load()  # the installed caracal/_C*.so, and the operators' registrations
ops = sorted(n for n in ("create_layer", "moe_forward", "moe_backward") if hasattr(torch.ops.caracal, n))
print("test-fresh-install: ok,", caracal.__file__, "extension loaded, ops", ops)
PY
