#include "comm_test_kernels.hpp"

#include "caracal/comm/device_sync.cuh"
#include "caracal/comm/launch.cuh"

namespace caracal::test {
namespace {

using comm::DeviceWorld;

__device__ uint32_t pattern(uint32_t step, int rank, size_t index) {
  uint32_t x = static_cast<uint32_t>(index) * 0x9E3779B1u;
  x ^= (static_cast<uint32_t>(rank) + 1u) * 0x85EBCA77u;
  x ^= (step + 1u) * 0xC2B2AE3Du;
  x ^= x >> 15;
  return x * 0x2C1B3C6Du;
}

__global__ void exchange_kernel(DeviceWorld world, ExchangeBuffers buffers, int iterations) {
  const int rank = world.rank();
  const int local = world.local_rank();
  // Read before the first barrier, written after the last one: every CTA sees the same round.
  const uint32_t round = buffers.rounds[local];
  uint32_t* mine = world.at(buffers.data, rank);
  const size_t stride = static_cast<size_t>(world.ctas_per_rank) * blockDim.x;
  const size_t first = static_cast<size_t>(world.cta()) * blockDim.x + threadIdx.x;
  unsigned long long bad = 0;
  for (int it = 0; it < iterations; ++it) {
    const uint32_t step = round * static_cast<uint32_t>(iterations) + static_cast<uint32_t>(it);
    for (size_t i = first; i < buffers.words; i += stride) mine[i] = pattern(step, rank, i);
    if (!comm::world_barrier(world)) return;
    for (int peer = 0; peer < world.world_size; ++peer) {
      const uint32_t* theirs = world.at(buffers.data, peer);
      for (size_t i = first; i < buffers.words; i += stride) bad += theirs[i] != pattern(step, peer, i);
    }
    if (!comm::world_barrier(world)) return;
  }
  if (bad != 0) atomicAdd(&buffers.mismatches[local], bad);
  if (world.cta() == 0 && threadIdx.x == 0) buffers.rounds[local] = round + 1;
}

__global__ void barrier_without_rank_kernel(DeviceWorld world, int absent_rank) {
  if (world.rank() == absent_rank) return;
  (void)comm::world_barrier(world);
}

}  // namespace

void launch_exchange(comm::World& world, const ExchangeBuffers& buffers, int ctas_per_rank, int iterations,
                     cudaStream_t stream) {
  comm::launch(world, "exchange", comm::LaunchShape{ctas_per_rank, kExchangeThreads, 0}, stream, exchange_kernel,
               buffers, iterations);
}

int exchange_max_ctas_per_rank(const comm::World& world) {
  return comm::max_ctas_per_rank(world, exchange_kernel, kExchangeThreads);
}

void launch_barrier_without_rank(comm::World& world, int absent_rank, int ctas_per_rank, cudaStream_t stream) {
  comm::launch(world, "barrier_without_rank", comm::LaunchShape{ctas_per_rank, kExchangeThreads, 0}, stream,
               barrier_without_rank_kernel, absent_rank);
}

}  // namespace caracal::test
