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

// The readiness-flag stress test (ready_flags.cuh) on a world of one rank: CTAs [0, producers)
// each publish `rounds` blocks of `block_words` words and raise their counter after each; the
// other `consumers` CTAs wait for every producer's every block, each walking the producers in its
// own order, and count the words that do not hold the value the producer wrote.
struct ReadyBuffers {
  uint32_t* data = nullptr;                  // [rounds][producers][block_words]
  uint32_t* counters = nullptr;              // [producers], raised by every launch
  unsigned long long* mismatches = nullptr;  // [1]
  int producers = 0, consumers = 0, rounds = 0, block_words = 0;
};
// `launch` numbers this launch among those on the same counters (0, 1, ...): every counter starts
// it at launch * rounds, and the data pattern differs per launch.
void launch_ready_stress(comm::World& world, const ReadyBuffers& buffers, uint32_t launch, cudaStream_t stream);

// One CTA waits for counter `index` to reach 1; nothing raises it: the wait times out.
void launch_ready_wait_for_nothing(comm::World& world, uint32_t* counter, int index, cudaStream_t stream);

// An early start (LaunchShape::starts_early, grid_dependency.cuh) seen from both sides: a writer
// launch (cooperative, one CTA per rank) lets its dependent start, spins for spin_ns, then stores
// `value` and records its end; the reader launch after it (starting early, reader_ctas_per_rank
// CTAs per rank) records its first CTA's start, waits for the writer, and every CTA copies what it
// reads into seen[cta].
struct EarlyStartBuffers {
  uint32_t* value = nullptr;                    // [1]
  uint32_t* seen = nullptr;                     // [reader CTAs]
  unsigned long long* writer_end = nullptr;     // [1], start it at 0
  unsigned long long* reader_start = nullptr;   // [1], start it at ~0
};
void launch_early_start_pair(comm::World& world, const EarlyStartBuffers& buffers, uint32_t value, uint64_t spin_ns,
                             int reader_ctas_per_rank, cudaStream_t stream);
int early_reader_max_ctas_per_rank(const comm::World& world);

}  // namespace caracal::test
