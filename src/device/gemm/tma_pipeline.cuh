#pragma once
// The shared-memory stage ring between the TMA producer and the wgmma consumers, Stages deep (a
// GEMM's policy's, gemm_policy.cuh).
//
// Every stage has a "full" mbarrier (the producer's arrive_and_expect_tx plus the TMA's
// transaction bytes) and an "empty" mbarrier (one arrival per consumer warp once its wgmmas have
// finished reading the stage). Both sides walk the ring in the same order across all the tiles
// of a persistent CTA; mbarrier waits name the phase by its parity.
#include <cstdint>

#include <cutlass/arch/barrier.h>

#include "device/gemm/gemm_config.cuh"

namespace caracal::gemm {

// Position in a ring of Stages stages: the stage and the parity of its current use.
template <int Stages>
struct PipelineState {
  int stage = 0;
  uint32_t phase = 0;

  __device__ void advance() {
    if (++stage == Stages) {
      stage = 0;
      phase ^= 1u;
    }
  }
};

template <int Stages>
class TmaPipeline {
 public:
  using FullBarrier = cutlass::arch::ClusterTransactionBarrier;
  using EmptyBarrier = cutlass::arch::ClusterBarrier;
  using State = PipelineState<Stages>;

  // The ring's barriers (MainloopStorage's full and empty).
  __device__ TmaPipeline(uint64_t (&full)[Stages], uint64_t (&empty)[Stages]) : full_(full), empty_(empty) {}

  // One thread, before the CTA-wide barrier that precedes any use. `full_arrivals`: arrivals that
  // complete a stage's fill (1: the producer's arrive_and_expect_tx; more when other threads
  // also arrive, as a gathering warp does).
  __device__ void init(uint32_t full_arrivals = 1) const {
    for (int s = 0; s < Stages; ++s) {
      FullBarrier::init(&full_[s], full_arrivals);
      EmptyBarrier::init(&empty_[s], kConsumerWarps);
    }
    cutlass::arch::fence_barrier_init();  // make the inits visible to the async (TMA) proxy
  }

  // Producer: wait until the consumers released the stage's previous use. A fresh barrier
  // counts as having completed the phase before its first, so the first lap does not wait.
  __device__ void producer_acquire(State st) const {
    EmptyBarrier::wait(&empty_[st.stage], st.phase ^ 1u);
  }
  // Producer: announce the bytes the stage's TMA copies will deliver; returns the barrier they
  // complete on.
  __device__ uint64_t* producer_expect(State st, uint32_t bytes) const {
    FullBarrier::arrive_and_expect_tx(&full_[st.stage], bytes);
    return &full_[st.stage];
  }

  // Producer: complete the stage's fill with no bytes (the end of a tile queue, tile_queue.cuh).
  __device__ void producer_arrive(State st) const { FullBarrier::arrive(&full_[st.stage]); }

  // Consumers: wait until the stage's bytes have landed.
  __device__ void consumer_wait(State st) const {
    FullBarrier::wait(&full_[st.stage], st.phase);
  }
  // Consumers, every thread of a warp after its reads of the stage completed: one arrival.
  __device__ void consumer_release(State st, int lane) const {
    if (lane == 0) EmptyBarrier::arrive(&empty_[st.stage]);
  }

 private:
  uint64_t* full_;
  uint64_t* empty_;
};

}  // namespace caracal::gemm
