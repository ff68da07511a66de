# Sourced by the device-machine scripts: picks the libnccl.so.2 of the release whose headers the
# build used ($build/NCCL_VERSION; the device API is inlined into our kernels) and keeps NVLink
# multicast off. Candidates: PyTorch's nvidia-nccl-cu13, the toolkit's, the system's.
# Needs $build; sets LD_LIBRARY_PATH and nccl_found (a line for the summary).
export NCCL_NVLS_ENABLE=0  # never NVLink multicast
nccl_version() {  # prints a libnccl.so.2's version as 2.28.9
  python3 -c 'import ctypes, sys
v = ctypes.c_int(); ctypes.CDLL(sys.argv[1]).ncclGetVersion(ctypes.byref(v))
print(f"{v.value // 10000}.{v.value // 100 % 100}.{v.value % 100}")' "$1" 2>/dev/null
}
want_nccl=$(cat "$build/NCCL_VERSION" 2>/dev/null)
nccl_found="none matching ${want_nccl:-?}"
for dir in "$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)" \
           /usr/local/cuda/lib64 /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu; do
  [ -n "$dir" ] && [ -f "$dir/libnccl.so.2" ] || continue
  if [ "$(nccl_version "$dir/libnccl.so.2")" = "$want_nccl" ]; then
    export LD_LIBRARY_PATH="$dir:${LD_LIBRARY_PATH:-}"
    nccl_found="$dir/libnccl.so.2 ($want_nccl)"
    break
  fi
done
