#pragma once
// A buffer in the symmetric heap, named by its byte offset (DESIGN §4). Every rank's heap has the
// same layout, so one SymmetricPtr names the same buffer on every rank; kernels resolve it for a
// rank with DeviceWorld::at(ptr, rank) and host code with World::local_pointer(ptr, local_rank).
// Plain data: valid in host and device code alike.
#include <cstddef>

namespace caracal::comm {

template <typename T>
struct SymmetricPtr {
  size_t offset = 0;  // bytes from the start of every rank's heap
};

}  // namespace caracal::comm
