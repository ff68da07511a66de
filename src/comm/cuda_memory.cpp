#include "caracal/comm/cuda_memory.hpp"

#include <cstdint>

#include "caracal/error.hpp"

namespace caracal::comm {

DeviceBlock allocate_device_block(size_t bytes, const DeviceAllocator& allocator, const char* what) {
  CARACAL_CHECK(static_cast<bool>(allocator.allocate) == static_cast<bool>(allocator.free), what,
                ": the allocator needs both allocate and free, or neither (cudaMalloc)");
  if (!allocator.allocate) {
    return {device_alloc<char>(bytes, what).release(), [](char* p) { (void)cudaFree(p); }};
  }
  char* p = static_cast<char*>(allocator.allocate(bytes));
  CARACAL_CHECK(p != nullptr, what, ": the allocator returned null for ", bytes, " bytes");
  // Owned from here: a refused block goes back to the allocator.
  DeviceBlock block(p, [free = allocator.free](char* b) { free(b); });
  CARACAL_CHECK(reinterpret_cast<uintptr_t>(p) % 256 == 0, what, ": the allocator must return 256-byte aligned ",
                "memory, got ", static_cast<void*>(p));
  return block;
}

}  // namespace caracal::comm
