#include "comm_test_kernels.hpp"

#include "device/comm/device_sync.cuh"
#include "device/comm/grid_dependency.cuh"
#include "comm/launch.cuh"
#include "device/comm/ready_flags.cuh"

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
  const comm::CtaPlace place = comm::whole_launch_place(world);
  const int rank = place.rank;
  const int local = place.local_rank;
  // Read before the first barrier, written after the last one: every CTA sees the same round.
  const uint32_t round = buffers.rounds[local];
  uint32_t* mine = world.at(buffers.data, rank);
  const size_t stride = static_cast<size_t>(place.count) * blockDim.x;
  const size_t first = static_cast<size_t>(place.index) * blockDim.x + threadIdx.x;
  unsigned long long bad = 0;
  for (int it = 0; it < iterations; ++it) {
    const uint32_t step = round * static_cast<uint32_t>(iterations) + static_cast<uint32_t>(it);
    for (size_t i = first; i < buffers.words; i += stride) mine[i] = pattern(step, rank, i);
    if (!comm::world_barrier(world, place)) return;
    for (int peer = 0; peer < world.world_size; ++peer) {
      const uint32_t* theirs = world.at(buffers.data, peer);
      for (size_t i = first; i < buffers.words; i += stride) bad += theirs[i] != pattern(step, peer, i);
    }
    if (!comm::world_barrier(world, place)) return;
  }
  if (bad != 0) atomicAdd(&buffers.mismatches[local], bad);
  if (place.index == 0 && threadIdx.x == 0) buffers.rounds[local] = round + 1;
}

__global__ void barrier_without_rank_kernel(DeviceWorld world, int absent_rank) {
  const comm::CtaPlace place = comm::whole_launch_place(world);
  if (place.rank == absent_rank) return;
  (void)comm::world_barrier(world, place);
}

// Two roles: CTAs [0, producers) produce, the next `consumers` consume (a cooperative launch:
// all co-resident).
__global__ void ready_stress_kernel(DeviceWorld world, ReadyBuffers b, uint32_t launch) {
  const uint32_t base = launch * static_cast<uint32_t>(b.rounds);
  const auto block_of = [&](int round, int producer) {
    return b.data + (static_cast<size_t>(round) * b.producers + producer) * b.block_words;
  };
  if (comm::in_role(world, 0, b.producers)) {
    const int producer = comm::role_place(world, 0, b.producers).index;
    for (int r = 0; r < b.rounds; ++r) {
      uint32_t* block = block_of(r, producer);
      for (int i = static_cast<int>(threadIdx.x); i < b.block_words; i += static_cast<int>(blockDim.x)) {
        block[i] = pattern(base + static_cast<uint32_t>(r), producer, static_cast<size_t>(i));
      }
      comm::signal_ready(&b.counters[producer]);
    }
    return;
  }
  const comm::CtaPlace place = comm::role_place(world, b.producers, b.consumers);
  const int consumer = place.index;
  unsigned long long bad = 0;
  for (int r = 0; r < b.rounds; ++r) {
    for (int k = 0; k < b.producers; ++k) {
      const int p = (k + consumer) % b.producers;  // consumers take the producers in different orders
      if (!comm::wait_ready(world, place, &b.counters[p], base + static_cast<uint32_t>(r) + 1, p)) return;
      const uint32_t* block = block_of(r, p);
      for (int i = static_cast<int>(threadIdx.x); i < b.block_words; i += static_cast<int>(blockDim.x)) {
        bad += block[i] != pattern(base + static_cast<uint32_t>(r), p, static_cast<size_t>(i));
      }
    }
  }
  if (bad != 0) atomicAdd(b.mismatches, bad);
}

__global__ void ready_wait_for_nothing_kernel(DeviceWorld world, uint32_t* counter, int index) {
  (void)comm::wait_ready(world, comm::whole_launch_place(world), counter, 1, index);
}

__global__ void early_writer_kernel(DeviceWorld, EarlyStartBuffers b, uint32_t value, uint64_t spin_ns) {
  comm::allow_dependent_launch();
  const uint64_t start = comm::global_time_ns();
  while (comm::global_time_ns() - start < spin_ns) {
  }
  if (threadIdx.x == 0) {
    if (blockIdx.x == 0) *b.value = value;
    atomicMax(b.writer_end, static_cast<unsigned long long>(comm::global_time_ns()));
  }
}

__global__ void early_reader_kernel(DeviceWorld, EarlyStartBuffers b) {
  if (threadIdx.x == 0) atomicMin(b.reader_start, static_cast<unsigned long long>(comm::global_time_ns()));
  comm::wait_for_previous_grid();
  if (threadIdx.x == 0) b.seen[blockIdx.x] = *b.value;
}

}  // namespace

void launch_early_start_pair(comm::World& world, const EarlyStartBuffers& buffers, uint32_t value, uint64_t spin_ns,
                             int reader_ctas_per_rank, cudaStream_t stream) {
  comm::launch(world, "early_writer", comm::LaunchShape{1, kExchangeThreads, 0}, stream, early_writer_kernel, buffers,
               value, spin_ns);
  comm::LaunchShape reader{reader_ctas_per_rank, kExchangeThreads, 0};
  reader.starts_early = true;
  comm::launch(world, "early_reader", reader, stream, early_reader_kernel, buffers);
}

int early_reader_max_ctas_per_rank(const comm::World& world) {
  return comm::max_ctas_per_rank(world, early_reader_kernel, kExchangeThreads);
}

void launch_ready_stress(comm::World& world, const ReadyBuffers& buffers, uint32_t launch, cudaStream_t stream) {
  comm::launch(world, "ready_stress", comm::LaunchShape{buffers.producers + buffers.consumers, kExchangeThreads, 0},
               stream, ready_stress_kernel, buffers, launch);
}

void launch_ready_wait_for_nothing(comm::World& world, uint32_t* counter, int index, cudaStream_t stream) {
  comm::launch(world, "ready_wait_for_nothing", comm::LaunchShape{1, kExchangeThreads, 0}, stream,
               ready_wait_for_nothing_kernel, counter, index);
}

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
