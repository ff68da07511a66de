#pragma once
// The bump allocator behind World::allocate: hands out 256-byte aligned offsets of the symmetric
// heap at setup time. Host-only arithmetic (no CUDA), so every rank that makes the same
// allocations in the same order gets the same offsets, which is what makes the heap symmetric.
#include <cstddef>

namespace caracal::comm {

class SymmetricHeapAllocator {
 public:
  static constexpr size_t kAlignment = 256;

  // Offsets start at `base` (bytes reserved ahead of the user region) and `capacity` bytes are
  // available from there; both multiples of kAlignment.
  SymmetricHeapAllocator(size_t base, size_t capacity);

  // Returns the offset of `bytes` fresh bytes, aligned to kAlignment. Throws caracal::Error
  // ("symmetric heap: asked for X bytes, Y of Z left") when they do not fit.
  size_t allocate(size_t bytes);
  // As allocate(count * element_bytes), also catching the multiplication's overflow.
  size_t allocate(size_t count, size_t element_bytes);

  size_t capacity() const { return capacity_; }
  size_t used() const { return used_; }
  size_t left() const { return capacity_ - used_; }

 private:
  size_t base_;
  size_t capacity_;
  size_t used_ = 0;
};

}  // namespace caracal::comm
