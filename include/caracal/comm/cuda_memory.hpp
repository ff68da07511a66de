#pragma once
// Owning handles for CUDA allocations, so that setup code that throws half way frees what it made.
#include <cstddef>
#include <functional>
#include <memory>

#include <cuda_runtime.h>

#include "caracal/comm/cuda_check.hpp"

namespace caracal::comm {

struct CudaFree {
  void operator()(void* p) const { (void)cudaFree(p); }
};
struct CudaFreeHost {
  void operator()(void* p) const { (void)cudaFreeHost(p); }
};

template <typename T>
using DeviceMemory = std::unique_ptr<T, CudaFree>;
template <typename T>
using PinnedMemory = std::unique_ptr<T, CudaFreeHost>;

// cudaMalloc of `count` elements of T on the current device; `what` names it in errors.
template <typename T>
DeviceMemory<T> device_alloc(size_t count, const char* what) {
  void* p = nullptr;
  check_cuda(cudaMalloc(&p, count * sizeof(T)), what);
  return DeviceMemory<T>(static_cast<T*>(p));
}

// Pinned host memory for `count` elements of T, mapped into the device address space.
template <typename T>
PinnedMemory<T> pinned_mapped_alloc(size_t count, const char* what) {
  void* p = nullptr;
  check_cuda(cudaHostAlloc(&p, count * sizeof(T), cudaHostAllocMapped | cudaHostAllocPortable), what);
  return PinnedMemory<T>(static_cast<T*>(p));
}

// Where a block of ordinary device memory comes from: the functions given, or cudaMalloc / cudaFree
// when both are empty. MoELayer's activations and LoopbackWorld's heaps take one; the PyTorch
// binding passes its caching allocator, so that torch.cuda.memory_allocated() counts the block.
struct DeviceAllocator {
  std::function<void*(size_t bytes)> allocate;
  std::function<void(void* block)> free;
};

using DeviceBlock = std::unique_ptr<char, std::function<void(char*)>>;

// `bytes` from `allocator` (256-byte aligned); `what` names the block in errors. Throws
// caracal::Error for an allocator with one function only, a failed allocation, or misaligned memory
// (given back to the allocator first).
DeviceBlock allocate_device_block(size_t bytes, const DeviceAllocator& allocator, const char* what);

}  // namespace caracal::comm
