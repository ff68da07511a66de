#pragma once
// W virtual ranks on one GPU, driven by one process and one launch (DESIGN §4): every multi-rank
// path runs on a single GPU. Heaps are one device allocation, rank r's at base + r * stride, from
// `allocator` (cudaMalloc by default; the PyTorch binding passes its caching allocator).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "caracal/comm/cuda_memory.hpp"
#include "caracal/comm/world.hpp"

namespace caracal::comm {

class LoopbackWorld final : public World {
 public:
  // `heap_bytes_per_rank` is rounded up to a multiple of 256. Makes `device` current on the calling
  // thread. Throws caracal::Error for world_size < 1 (before touching the GPU), an allocator with
  // one function only, or CUDA failures. The heaps are freed with the world (after its last launch).
  LoopbackWorld(int world_size, size_t heap_bytes_per_rank, int device = 0, const DeviceAllocator& allocator = {});

 private:
  // All virtual ranks run in one launch on one stream: stream order is already a rendezvous.
  void rendezvous(cudaStream_t) override {}
  // One process builds every rank from one configuration: they cannot differ.
  std::vector<int64_t> all_gather(const std::vector<int64_t>& values) override;

  DeviceBlock heaps_;  // world_size heaps of heap_stride() bytes
};

}  // namespace caracal::comm
