#include "caracal/comm/loopback_world.hpp"

#include <limits>
#include <vector>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/error.hpp"

namespace caracal::comm {

LoopbackWorld::LoopbackWorld(int world_size, size_t heap_bytes_per_rank, int device, const DeviceAllocator& allocator)
    : World(WorldShape{"LoopbackWorld", world_size, 0, world_size, device}, heap_bytes_per_rank) {
  const size_t ranks = static_cast<size_t>(world_size);
  CARACAL_CHECK(heap_stride() <= std::numeric_limits<size_t>::max() / ranks, "LoopbackWorld: ", world_size,
                " heaps of ", heap_stride(), " bytes overflow size_t");
  heaps_ = allocate_device_block(ranks * heap_stride(), allocator, "LoopbackWorld heaps");
  // Zero before any launch: barrier state must start at epoch 0 and buffers start zero-filled.
  check_cuda(cudaMemset(heaps_.get(), 0, ranks * heap_stride()), "cudaMemset(LoopbackWorld heaps)");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize(LoopbackWorld setup)");
  std::vector<char*> heaps(ranks);
  for (size_t r = 0; r < ranks; ++r) heaps[r] = heaps_.get() + r * heap_stride();
  publish_heaps(heaps);
}

std::vector<int64_t> LoopbackWorld::all_gather(const std::vector<int64_t>& values) {
  std::vector<int64_t> all;
  all.reserve(values.size() * static_cast<size_t>(world_size()));
  for (int r = 0; r < world_size(); ++r) all.insert(all.end(), values.begin(), values.end());
  return all;
}

}  // namespace caracal::comm
