#!/usr/bin/env bash
# Installs everything Caracal needs to build and test, idempotently:
#   - Debian packages: compiler toolchain, CMake, Ninja, ccache, GoogleTest, nlohmann-json, CLI11;
#   - CUTLASS/CuTe headers from PyPI (nvidia-cutlass, pinned) into .deps/ (git-ignored).
# The CUDA toolkit (nvcc, cuBLAS, NCCL) must already be installed under /usr/local/cuda.
#   scripts/install-deps.sh [--python]
# --python: only what the PyTorch extension's build needs (`pip install --no-build-isolation .`:
# compiler, CMake, Ninja, CUTLASS; not the tools' GoogleTest, nlohmann-json, CLI11, ccache).
# A tool already on PATH (a pip-installed cmake or ninja) counts as installed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cutlass_version=4.2.0.0
cutlass_dir="$root/.deps/nvidia-cutlass-$cutlass_version"
python_only=0
case "${1:-}" in
  "") ;;
  --python) python_only=1 ;;
  *) echo "install-deps: unknown argument '$1' (expected nothing or --python)" >&2; exit 2 ;;
esac

apt_packages=(g++ cmake ninja-build python3)
((python_only)) || apt_packages+=(ccache libgtest-dev nlohmann-json3-dev libcli11-dev)
declare -A command_of=([g++]=g++ [cmake]=cmake [ninja-build]=ninja [ccache]=ccache [python3]=python3)
missing=()
for p in "${apt_packages[@]}"; do
  if [ -n "${command_of[$p]:-}" ] && command -v "${command_of[$p]}" >/dev/null 2>&1; then continue; fi
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: apt-get install ${missing[*]}"
  sudo_cmd=""; [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ ! -f "$cutlass_dir/cutlass_library/source/include/cute/tensor.hpp" ]; then
  echo "install-deps: nvidia-cutlass==$cutlass_version -> ${cutlass_dir#$root/}"
  rm -rf "$cutlass_dir"
  python3 -m pip install -q --disable-pip-version-check --no-deps --no-compile \
    --target "$cutlass_dir" "nvidia-cutlass==$cutlass_version" 2>&1 | grep -v 'Running pip as' || true
  test -f "$cutlass_dir/cutlass_library/source/include/cute/tensor.hpp"
fi

if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "install-deps: error: the CUDA toolkit (nvcc) was not found; install CUDA 13.0 first" >&2
  exit 1
fi

# `pip install --no-build-isolation .` (the PyTorch extension, README) builds with this
# environment's own setuptools, whose bdist_wheel comes with setuptools >= 70.1 or from the wheel
# package: add wheel where PyTorch is installed and neither is there.
if python3 -c 'import torch' >/dev/null 2>&1 &&
   ! python3 -c 'import importlib.util as u, sys; sys.exit(not (u.find_spec("wheel") or u.find_spec("setuptools.command.bdist_wheel")))' \
     >/dev/null 2>&1; then
  echo "install-deps: pip install wheel (bdist_wheel for pip install --no-build-isolation .)"
  python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore wheel ||
    echo "install-deps: warning: could not install wheel; pip install --no-build-isolation . will need it" >&2
fi
