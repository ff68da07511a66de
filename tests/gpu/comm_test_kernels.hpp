#pragma once
// Test kernels for the communication layer, behind host functions so that the GoogleTest sources
// stay plain C++. They use only DeviceWorld, world_barrier and launch(): the same code runs on
// every backend.
#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "caracal/comm/symmetric_ptr.hpp"
#include "caracal/comm/world.hpp"

namespace caracal::test {

inline constexpr int kExchangeThreads = 256;

// What the exchange kernel reads and writes: `words` uint32 per rank in the symmetric heap, and
// per local rank two device counters that the host checks afterwards.
struct ExchangeBuffers {
  comm::SymmetricPtr<uint32_t> data;
  size_t words = 0;
  uint32_t* rounds = nullptr;                // [local_ranks] launches completed by each local rank
  unsigned long long* mismatches = nullptr;  // [local_ranks] peer words that held the wrong value
};

// `iterations` (>= 1) times: every rank fills its buffer with a pattern specific to (round,
// iteration, rank), passes a world barrier, checks every rank's buffer, passes a second barrier
// (so nobody overwrites a buffer still being read). The round is read from `rounds` at the start
// and bumped at the end, so every launch and every graph replay writes different values.
void launch_exchange(comm::World& world, const ExchangeBuffers& buffers, int ctas_per_rank, int iterations,
                     cudaStream_t stream);
int exchange_max_ctas_per_rank(const comm::World& world);

// One world barrier that rank `absent_rank`'s CTAs never reach: they return at once.
void launch_barrier_without_rank(comm::World& world, int absent_rank, int ctas_per_rank, cudaStream_t stream);

}  // namespace caracal::test
