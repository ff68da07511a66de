#!/usr/bin/env bash
# The README's PyTorch install, run as a user would on a fresh virtual environment:
#   python3 -m venv, pip install torch==2.11.0 (PyPI's CUDA 13.0 wheels; the venv's own setuptools
#   and no `wheel`), a clean copy of this repository's HEAD, then exactly
#     scripts/install-deps.sh && pip install --no-build-isolation .
#   and, from outside the source tree, `import caracal` and loading the extension (registers the
#   operators; no GPU needed).
# Usage: scripts/test-fresh-install.sh [work-dir]
#   Downloads about 3 GB (PyTorch and its CUDA libraries) and builds the extension from scratch
#   (about 20 minutes on 2 cores without a warm ccache). CARACAL_FRESH_VENV=DIR reuses a venv that
#   holds only PyTorch, skipping the download.
# CARACAL_FRESH_EXTRAS=transformers: the README's Hugging Face install instead,
#     scripts/install-deps.sh --python && pip install --no-build-isolation ".[transformers]"
#   then, where a GPU is present, the README's transformers example as written (its marked block).
# CARACAL_FRESH_SYSTEM_TORCH=1: for a machine that cannot download (the GPU machine): the venv
#   sees python3's own packages (its PyTorch, transformers, setuptools; pip with no index), and
#   the CUTLASS headers come from this checkout's .deps/ (scripts/install-deps.sh run beforehand),
#   and the source is this working tree as it is (not a clone of HEAD).
# Exit status non-zero when any step failed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work="${1:-$(mktemp -d)}"
venv="${CARACAL_FRESH_VENV:-$work/venv}"
extras="${CARACAL_FRESH_EXTRAS:-}"
system_torch="${CARACAL_FRESH_SYSTEM_TORCH:-0}"
case "$extras" in ""|transformers) ;; *) echo "test-fresh-install: CARACAL_FRESH_EXTRAS must be empty or 'transformers', got '$extras'" >&2; exit 2 ;; esac
mkdir -p "$work"
if [ ! -x "$venv/bin/python" ]; then
  if [ "$system_torch" = 1 ]; then
    # Not --system-site-packages: where python3 is itself a venv's (the GPU machine's), that would
    # give the base interpreter's packages, not python3's. A .pth file adds python3's own instead.
    outer_site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "test-fresh-install: python3 -m venv $venv, seeing $outer_site (the system's PyTorch)"
    python3 -m venv "$venv"
    echo "$outer_site" >"$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/system_torch.pth"
  else
    echo "test-fresh-install: python3 -m venv $venv; pip install torch==2.11.0"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check torch==2.11.0
  fi
fi
rm -rf "$work/caracal"
if [ "$system_torch" != 1 ]; then
  git clone -q "$root" "$work/caracal"
else  # the GPU machine's copy of a working tree (its .git, if any, is not this tree's): the tree
      # as it is, without what git ignores
  mkdir -p "$work/caracal"
  tar -C "$root" --exclude='./build' --exclude='./build-*' --exclude='./.deps' --exclude='./.whl' \
      --exclude='./.venv-torch' --exclude='__pycache__' --exclude='*.egg-info' -cf - . | tar -C "$work/caracal" -xf -
fi
if [ "$system_torch" = 1 ]; then
  export PIP_NO_INDEX=1  # nothing to download: every requirement must already be there
  [ -d "$root/.deps" ] || { echo "test-fresh-install: no $root/.deps (run scripts/install-deps.sh here first)" >&2; exit 1; }
  cp -r "$root/.deps" "$work/caracal/.deps"
fi
cd "$work/caracal"
export PATH="$venv/bin:$PATH"  # python3 and pip of the venv, as after `source venv/bin/activate`
echo "test-fresh-install: $(python3 -c 'import torch, setuptools; print("torch", torch.__version__, "setuptools", setuptools.__version__)')"
start=$(date +%s)
if [ "$extras" = transformers ]; then
  scripts/install-deps.sh --python && pip install -q --disable-pip-version-check --no-build-isolation ".[transformers]"
else
  scripts/install-deps.sh && pip install -q --disable-pip-version-check --no-build-isolation .
fi
echo "test-fresh-install: install took $(( $(date +%s) - start )) s"
python3 scripts/lib/readme_example.py transformers >"$work/readme_transformers_example.py"
cd "$work"  # not the source tree: the installed package
python3 - <<'PY'
import torch, caracal
from caracal._extension import load
load()  # the installed caracal/_C*.so, and the operators' registrations
ops = sorted(n for n in ("create_layer", "moe_forward", "moe_backward") if hasattr(torch.ops.caracal, n))
print("test-fresh-install: ok,", caracal.__file__, "extension loaded, ops", ops)
PY
if [ "$extras" = transformers ]; then
  if python3 -c 'import torch, sys; sys.exit(not torch.cuda.is_available())'; then
    echo "test-fresh-install: the README's transformers example, as written"
    PYTHONUNBUFFERED=1 python3 -W error:caracal "$work/readme_transformers_example.py"  # a fallback warning fails it
    echo "test-fresh-install: README transformers example ok"
  else
    python3 -c 'import caracal.integrations.transformers, transformers; print("test-fresh-install: transformers", transformers.__version__, "integration imported (no GPU: the example not run)")'
  fi
fi
