#pragma once
// Shared by the communication GPU tests: the exchange buffers of one world and their checks.
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "caracal/comm/cuda_memory.hpp"
#include "caracal/comm/world.hpp"
#include "comm_test_kernels.hpp"
#include "gpu_test_util.hpp"

namespace caracal::test {

// The exchange's symmetric buffer and per-local-rank counters, zeroed.
class Exchange {
 public:
  Exchange(comm::World& world, size_t words)
      : rounds_(comm::device_alloc<uint32_t>(static_cast<size_t>(world.local_ranks()), "cudaMalloc(rounds)")),
        mismatches_(comm::device_alloc<unsigned long long>(static_cast<size_t>(world.local_ranks()),
                                                           "cudaMalloc(mismatches)")),
        local_ranks_(world.local_ranks()) {
    buffers_.data = world.allocate<uint32_t>(words);
    buffers_.words = words;
    buffers_.rounds = rounds_.get();
    buffers_.mismatches = mismatches_.get();
    check_cuda(cudaMemset(rounds_.get(), 0, sizeof(uint32_t) * local_ranks_), "cudaMemset(rounds)");
    check_cuda(cudaMemset(mismatches_.get(), 0, sizeof(unsigned long long) * local_ranks_), "cudaMemset(mismatches)");
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }

  const ExchangeBuffers& buffers() const { return buffers_; }

  // After the stream is done: every local rank completed `rounds` launches and saw no wrong word.
  void expect_clean(uint32_t rounds) const {
    std::vector<uint32_t> done(static_cast<size_t>(local_ranks_));
    std::vector<unsigned long long> bad(static_cast<size_t>(local_ranks_));
    CARACAL_ASSERT_CUDA(cudaMemcpy(done.data(), rounds_.get(), sizeof(uint32_t) * done.size(), cudaMemcpyDeviceToHost));
    CARACAL_ASSERT_CUDA(
        cudaMemcpy(bad.data(), mismatches_.get(), sizeof(unsigned long long) * bad.size(), cudaMemcpyDeviceToHost));
    for (int l = 0; l < local_ranks_; ++l) {
      EXPECT_EQ(done[static_cast<size_t>(l)], rounds) << "local rank " << l;
      EXPECT_EQ(bad[static_cast<size_t>(l)], 0u) << "local rank " << l;
    }
  }

 private:
  comm::DeviceMemory<uint32_t> rounds_;
  comm::DeviceMemory<unsigned long long> mismatches_;
  int local_ranks_;
  ExchangeBuffers buffers_;
};

// One exchange launch (`ctas_per_rank` CTAs, `iterations` rounds) on `stream` that goes through:
// the world reports no fault, and every local rank has completed `launches` launches in all.
inline void expect_clean_launch(comm::World& world, const Exchange& exchange, int ctas_per_rank, int iterations,
                                const Stream& stream, uint32_t launches) {
  launch_exchange(world, exchange.buffers(), ctas_per_rank, iterations, stream.get());
  stream.sync();
  EXPECT_NO_THROW(world.check());
  exchange.expect_clean(launches);
}

// Captures `enqueue(stream)` into a graph (CapturedGraph), replays it `replays` times on `stream`,
// waits.
template <typename Enqueue>
void replay_graph(const Stream& stream, int replays, Enqueue enqueue) {
  const CapturedGraph graph(stream, enqueue);
  for (int i = 0; i < replays; ++i) graph.launch(stream);
  check_cuda(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize(graph replays)");
}

}  // namespace caracal::test
