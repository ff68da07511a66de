#pragma once
// Random device data for the benchmarks: values uniform in [lo, hi) from a hash of (seed, index),
// so a buffer fills in one pass at memory speed and a seed replays the same data.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "caracal/comm/cuda_check.hpp"

namespace caracal::bench {

namespace detail {

__device__ __forceinline__ float hashed_uniform(uint64_t seed, size_t index, float lo, float hi) {
  uint64_t z = seed ^ (static_cast<uint64_t>(index) * 0xD1B54A32D192ED03ull);
  z += 0x9E3779B97F4A7C15ull;  // splitmix64
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return lo + (hi - lo) * static_cast<float>(z >> 40) * (1.0f / static_cast<float>(1 << 24));
}

template <typename T>
__global__ void fill_uniform_kernel(T* out, size_t count, uint64_t seed, float lo, float hi) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = static_cast<T>(hashed_uniform(seed, i, lo, hi));
  }
}

}  // namespace detail

// `count` values of T (float or __nv_bfloat16, rounded to nearest) uniform in [lo, hi), on `stream`.
template <typename T>
void fill_uniform(T* out, size_t count, uint64_t seed, float lo, float hi, cudaStream_t stream) {
  if (count == 0) return;
  detail::fill_uniform_kernel<<<2048, 256, 0, stream>>>(out, count, seed, lo, hi);
  check_cuda(cudaGetLastError(), "fill_uniform_kernel launch");
}

}  // namespace caracal::bench
