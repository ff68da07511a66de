#pragma once
// An up/gate tile's activation_ready raised one tile late. After an up/gate tile's epilogue a
// consumer warpgroup's leader would wait for its TMA stores to reach global memory (~1 us) before
// raising the block's counter, with the next tile's stages already in shared memory. Instead it
// keeps the counter pending and raises it after the next tile's mainloop, when the stores have
// long completed (the drain then returns at once).
//
// Deadlock guard: the next tile's first stage may never come while the signal is pending (this
// CTA's producer may wait for this very activation, or for ring rows that a down tile waiting on
// it must release). So before blocking on that stage the leader polls it for a bounded time and,
// if it has not come, drains and raises the counter first. The later stages of a tile wait on no
// counter (its producer waited for everything before the first), so only the first needs this.
#include <cstdint>

#include "device/comm/ready_flags.cuh"
#include "device/gemm/chunk_store.cuh"
#include "device/gemm/tma_pipeline.cuh"

namespace caracal::fused {

// How long the leader polls the next tile's first stage while a signal is pending: ~2 us, several
// times a stage's usual refill.
inline constexpr long long kPendingPollCycles = 4000;

// Held by every thread of a consumer warpgroup; only its leader (the thread that issues the
// warpgroup's TMA stores and so can wait for them) ever holds a counter.
class PendingActivation {
 public:
  // The leader: `counter` is raised once the stores issued so far have completed.
  __device__ void hold(uint32_t* counter) { counter_ = counter; }

  // Raises the pending counter, if any, after the leader's stores have completed.
  __device__ void publish(const gemm::ChunkStoreRing& ring) {
    if (counter_ == nullptr) return;
    ring.drain();
    comm::async_proxy_fence();  // the down tiles read the activation by TMA
    comm::signal_ready_thread(counter_);
    counter_ = nullptr;
  }

  // Before blocking on the stage `st`: publishes unless the stage lands within the poll bound.
  __device__ void publish_unless_ready(const gemm::TmaPipeline& pipe, gemm::PipelineState st,
                                       const gemm::ChunkStoreRing& ring) {
    if (counter_ != nullptr && !pipe.consumer_try_wait(st, kPendingPollCycles)) publish(ring);
  }

 private:
  uint32_t* counter_ = nullptr;
};

}  // namespace caracal::fused
