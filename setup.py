"""Builds caracal's PyTorch extension with the project's CMake (see README: "From PyTorch").

    pip install --no-build-isolation .

Build isolation must be off: the extension is compiled against the PyTorch already installed.
The CMake build directory is build-python/ (or $CARACAL_PYTHON_BUILD_DIR), so rebuilds are
incremental. It needs the CUDA toolkit (nvcc 13.0) with NCCL 2.28 and the CUTLASS headers
(scripts/install-deps.sh puts them in .deps/; or set CUTLASS_DIR in the environment); NCCL from the
toolkit, else PyTorch's nvidia-nccl wheel where it brings headers; the tools,
benchmarks and tests are not built (-DCARACAL_TOOLS=OFF). Compile jobs: $CMAKE_BUILD_PARALLEL_LEVEL,
else one a core within 4 GiB of available memory each.
"""
import os
import shutil
import subprocess
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def build_jobs():
    """Parallel compile jobs: one per core, at most one per 4 GiB of available memory (a CUTLASS
    translation unit takes ~4 GB)."""
    try:
        with open("/proc/meminfo") as meminfo:
            available_kib = next(int(line.split()[1]) for line in meminfo if line.startswith("MemAvailable:"))
        by_memory = max(1, available_kib // (4 << 20))
    except (OSError, StopIteration, ValueError):
        by_memory = 4
    return max(1, min(os.cpu_count() or 1, by_memory))


def nccl_hints(env):
    """CMake's NCCL paths where the CUDA toolkit holds no NCCL >= 2.28 (no nccl_device.h) but
    PyTorch's own NCCL wheel (nvidia-nccl-cu13) brings its headers: the release the extension then
    runs with, as PyTorch loads it. [] otherwise (CMake looks in the toolkit's directories)."""
    nvcc = shutil.which("nvcc", path=env["PATH"])
    toolkit_includes = [Path("/usr/local/cuda/include")] + ([Path(nvcc).resolve().parents[1] / "include"] if nvcc else [])
    if any((d / "nccl_device.h").exists() for d in toolkit_includes):
        return []
    try:
        import nvidia.nccl
    except ImportError:
        return []
    for base in map(Path, nvidia.nccl.__path__):
        libraries = sorted((base / "lib").glob("libnccl.so*"))
        if (base / "include" / "nccl_device.h").exists() and libraries:
            return [f"-DCARACAL_NCCL_INCLUDE_DIR={base / 'include'}", f"-DCARACAL_NCCL_LIBRARY={libraries[0]}"]
    return []


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        import torch.utils

        build = Path(os.environ.get("CARACAL_PYTHON_BUILD_DIR", ROOT / "build-python"))
        cutlass = [f"-DCUTLASS_DIR={os.environ['CUTLASS_DIR']}"] if "CUTLASS_DIR" in os.environ else []
        env = dict(os.environ, PATH=f"/usr/local/cuda/bin:{os.environ.get('PATH', '')}")
        cmake_args = ["-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DCARACAL_PYTHON=ON", "-DCARACAL_TOOLS=OFF",
                      f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}", *cutlass, *nccl_hints(env)]
        subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build), *cmake_args], check=True, env=env)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(build_jobs())
        subprocess.run(["cmake", "--build", str(build), "--target", "caracal_torch", "-j", jobs], check=True, env=env)
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(build / "python" / "libcaracal_torch.so", target)


setup(ext_modules=[Extension("caracal._C", sources=[])], cmdclass={"build_ext": CMakeBuild},
      options={"build": {"build_base": "build-python/setuptools"}})  # not build/, the CMake build
