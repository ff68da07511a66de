#pragma once
// What device code that host tests run too (task orders, tile schedulers) is written with:
// CARACAL_HOST_DEVICE is __host__ __device__ under nvcc and nothing under a host compiler, where
// min and max are std's (nvcc has its own for both sides).
#include <cstdint>

#if defined(__CUDACC__)
#define CARACAL_HOST_DEVICE __host__ __device__
#else
#define CARACAL_HOST_DEVICE
#include <algorithm>
#endif

namespace caracal {

#if !defined(__CUDACC__)
using std::max;
using std::min;
#endif

// A load of a word no thread writes while the kernel runs (a schedule's offsets, counts): through
// the read-only data cache on the device.
CARACAL_HOST_DEVICE inline int32_t load_read_only(const int32_t* p) {
#if defined(__CUDA_ARCH__)
  return __ldg(p);
#else
  return *p;
#endif
}

}  // namespace caracal
