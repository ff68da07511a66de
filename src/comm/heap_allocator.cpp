#include "caracal/comm/heap_allocator.hpp"

#include <limits>

#include "caracal/error.hpp"

namespace caracal::comm {

SymmetricHeapAllocator::SymmetricHeapAllocator(size_t base, size_t capacity) : base_(base), capacity_(capacity) {
  CARACAL_CHECK(base % kAlignment == 0 && capacity % kAlignment == 0, "symmetric heap: base ", base,
                " and capacity ", capacity, " must be multiples of ", kAlignment, " bytes");
  CARACAL_CHECK(capacity <= std::numeric_limits<size_t>::max() - base, "symmetric heap: capacity ", capacity,
                " bytes overflows the heap's address range");
}

size_t SymmetricHeapAllocator::allocate(size_t bytes) {
  // Every allocation is padded to kAlignment, so used_ stays aligned and so does the next offset.
  const bool fits = bytes <= left() && (bytes + kAlignment - 1) / kAlignment * kAlignment <= left();
  CARACAL_CHECK(fits, "symmetric heap: asked for ", bytes, " bytes, ", left(), " of ", capacity_, " left");
  const size_t offset = base_ + used_;
  used_ += (bytes + kAlignment - 1) / kAlignment * kAlignment;
  return offset;
}

size_t SymmetricHeapAllocator::allocate(size_t count, size_t element_bytes) {
  CARACAL_CHECK(element_bytes == 0 || count <= std::numeric_limits<size_t>::max() / element_bytes,
                "symmetric heap: asked for ", count, " elements of ", element_bytes,
                " bytes, which overflows size_t");
  return allocate(count * element_bytes);
}

}  // namespace caracal::comm
