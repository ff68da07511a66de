#pragma once
// Device buffers of caracal bench's baselines.
#include <algorithm>
#include <cstddef>

#include "caracal/comm/cuda_memory.hpp"

namespace caracal::bench_tool {

// `count` elements, and at least one: a buffer for no rows still hands the kernels a non-null
// pointer.
template <typename T>
comm::DeviceMemory<T> device_buffer(size_t count, const char* what) {
  return comm::device_alloc<T>(std::max<size_t>(count, 1), what);
}

}  // namespace caracal::bench_tool
