#pragma once
// The stage ring of a CTA pair (a cluster of two, paired_gemm_kernel.cuh): one producer thread, in
// the leader CTA (rank 0), fills the stages of both CTAs; the consumers of both release a stage to
// it. Each CTA's stage s is the same shared-memory offset, so one TMA multicast fills an operand
// both tiles share (the TMA delivers the bytes and completes the transaction at that offset in
// every CTA of its mask).
//
//   full[s]  (each CTA)  one arrival, the leader's arrive-and-expect of the stage's bytes (for the
//                        follower a remote arrival), plus the TMA's transaction bytes
//   empty[s] (leader)    one arrival per consumer warp of both CTAs (the follower's are remote)
// The follower's empty barriers are never used. Arrivals have the default semantics (release at
// CTA scope: the stages' bytes are ordered by the TMA's transactions, the consumers' reads by their
// wgmma waits), except the fill of a tile's first stage, which releases at cluster scope what the
// leader wrote before it (the tile index, tile_queue.cuh) to the consumers' first wait of the tile,
// which acquires at cluster scope. Those two are a GPU-scope fence each (MEMBAR.ALL.GPU, CCTL.IVALL
// in the SASS): once a tile, never once a k tile (every stage's arrivals at cluster scope would make
// the GEMMs far slower).
#include <cstdint>

#include <cute/arch/cluster_sm90.hpp>
#include <cutlass/arch/barrier.h>

#include "device/gemm/gemm_config.cuh"
#include "device/gemm/tma_pipeline.cuh"

namespace caracal::gemm {

inline constexpr int kPairCtas = 2;
// TMA multicast masks: the CTAs of the pair an operand's box is written to (bit r: rank r).
inline constexpr uint16_t kToLeader = 0;  // the leader's own smem: a plain (non-multicast) load
inline constexpr uint16_t kToFollower = 0b10;
inline constexpr uint16_t kToBoth = 0b11;

namespace pair_detail {

// The shared::cluster address of `local` (an address in this CTA's shared memory) in CTA `rank`.
__device__ inline uint32_t peer_address(void const* local, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(remote)
               : "r"(uint32_t(__cvta_generic_to_shared(local))), "r"(rank));
  return remote;
}

}  // namespace pair_detail

template <int Stages>
class TmaPairPipeline {
 public:
  using FullBarrier = cutlass::arch::ClusterTransactionBarrier;
  using EmptyBarrier = cutlass::arch::ClusterBarrier;
  using State = PipelineState<Stages>;

  // The ring's barriers (MainloopStorage's full and empty) and this CTA's rank in the pair.
  __device__ TmaPairPipeline(uint64_t (&full)[Stages], uint64_t (&empty)[Stages], uint32_t rank)
      : full_(full), empty_(empty), rank_(rank) {}

  __device__ bool leader() const { return rank_ == 0; }

  // One thread of each CTA; then a cluster-wide barrier before any use (cute::cluster_sync()).
  __device__ void init() const {
    for (int s = 0; s < Stages; ++s) {
      FullBarrier::init(&full_[s], 1);
      EmptyBarrier::init(&empty_[s], kPairCtas * kConsumerWarps);
    }
    cutlass::arch::fence_barrier_init();
  }

  // Leader's producer: wait until both CTAs' consumers released the stage's previous use.
  __device__ void producer_acquire(State st) const {
    EmptyBarrier::wait(&empty_[st.stage], st.phase ^ 1u);
  }

  // Leader's producer: announce `bytes` for the stage in both CTAs (each receives a full stage);
  // returns the (CTA-relative) barrier the TMA copies complete on. `publishes`: the stage is a
  // tile's first, and what the thread wrote before is released at cluster scope with it.
  __device__ uint64_t* producer_expect(State st, uint32_t bytes, bool publishes) const {
    FullBarrier::arrive_and_expect_tx(&full_[st.stage], bytes);
    uint32_t const follower = pair_detail::peer_address(&full_[st.stage], 1);
    if (publishes) {
      asm volatile("mbarrier.arrive.expect_tx.release.cluster.shared::cluster.b64 _, [%0], %1;"
                   ::"r"(follower), "r"(bytes) : "memory");
    } else {
      asm volatile("mbarrier.arrive.expect_tx.shared::cluster.b64 _, [%0], %1;" ::"r"(follower), "r"(bytes)
                   : "memory");
    }
    return &full_[st.stage];
  }

  // Leader's producer: complete the stage's fill in both CTAs with no bytes (the queue's end).
  __device__ void producer_arrive(State st) const {
    FullBarrier::arrive(&full_[st.stage]);
    uint32_t const follower = pair_detail::peer_address(&full_[st.stage], 1);
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(follower) : "memory");
  }

  // Leader's producer, last: wait until the consumers of both CTAs released every stage, so no
  // remote arrival can reach this CTA's barriers after it exits.
  __device__ void producer_tail(State st) const {
    for (int s = 0; s < Stages; ++s) {
      producer_acquire(st);
      st.advance();
    }
  }

  // Consumers: wait until the stage's bytes landed.
  __device__ void consumer_wait(State st) const {
    FullBarrier::wait(&full_[st.stage], st.phase);
  }
  // Consumers, a tile's first stage: as consumer_wait, acquiring at cluster scope what the leader
  // wrote before it filled the stage (the tile index).
  __device__ void consumer_wait_cluster(State st) const {
    uint32_t const addr = uint32_t(__cvta_generic_to_shared(&full_[st.stage]));
    asm volatile(
        "{\n\t.reg .pred done;\n"
        "wait:\n\t"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n\t"
        "@!done bra wait;\n}"
        ::"r"(addr), "r"(st.phase) : "memory");
  }
  // Consumers, every thread of a warp after its reads of the stage completed: one arrival at the
  // leader's barrier.
  __device__ void consumer_release(State st, int lane) const {
    if (lane == 0) {
      uint32_t const leader = pair_detail::peer_address(&empty_[st.stage], 0);
      asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(leader) : "memory");
    }
  }

 private:
  uint64_t* full_;
  uint64_t* empty_;
  uint32_t rank_;
};

}  // namespace caracal::gemm
