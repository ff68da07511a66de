#pragma once
// Row tiles handed out in order (RowTileScheduler::Params::tile_queue): the producer thread of each
// CTA takes its next tile index from one counter (atomicAdd) when the tile's first stage is free,
// and hands it to its consumers through the CTA's slot of that stage; each role seeks its own
// scheduler copy to it (tile indices only grow per CTA). The tiles in flight are then always a run
// of consecutive tiles — the ones that read the same A blocks and weight slabs (raster_order.hpp) —
// however the CTAs drift apart. With a fixed stride (tile b, b + grid, ... for CTA b) a CTA whose
// tiles ran faster works ahead of the others, the tiles in flight spread over the schedule and their
// operands stop fitting in L2 (about twice the DRAM reads of the queue's order).
//
// Queue words (caracal::gemm::kTileQueueWords; the launcher zeroes the counter before each
// launch): [0] the counter, from word 8 one one-word slot per CTA and stage of the Gemm's ring (a
// tile index). A slot is
// written before the stage's fill is announced (the barrier's arrival releases it) and read after
// the fill landed; it is rewritten only after every consumer warp released the stage. As the fused
// forward's task slots, in global memory rather than shared: compute-sanitizer's racecheck does not
// follow a stage barrier's arrivals from the reading warps' lane 0.
#include <cstdint>
#include <type_traits>

#include "caracal/gemm/grouped_gemm.hpp"
#include "device/gemm/gemm_config.cuh"
#include "device/gemm/tma_pair_pipeline.cuh"
#include "device/gemm/tma_pipeline.cuh"

namespace caracal::gemm {

inline constexpr int kTileQueueSlotsWord = 8;  // 32-byte aligned
inline constexpr uint32_t kNoMoreTiles = 0xffffffffu;

// Whether a Gemm (grouped_gemm_kernel.cuh) takes its tiles from a queue when it is given one: those
// whose scheduler's Params name one (RowTileScheduler's) do.
template <class Gemm, class = void>
inline constexpr bool kTakesTileQueue = false;
template <class Gemm>
inline constexpr bool kTakesTileQueue<Gemm, std::void_t<decltype(Gemm::Scheduler::Params::tile_queue)>> = true;

// A queue's slots for a ring of Stages stages fit in its public size.
template <int Stages>
inline constexpr bool kTileQueueFits = kTileQueueWords >= kTileQueueSlotsWord + kTileQueueMaxCtas * Stages;

// A Gemm's tile queue: nullptr when it was given none or takes none.
template <class Gemm, class Params>
__device__ uint32_t* tile_queue(Params const& p) {
  if constexpr (kTakesTileQueue<Gemm>) return p.tile_queue;
  return nullptr;
}

// CTA `cta`'s slot of stage `stage` of a ring of Stages (by default this CTA's).
template <int Stages>
__device__ uint32_t* tile_slot(uint32_t* queue, int stage, int cta = int(blockIdx.x)) {
  static_assert(kTileQueueFits<Stages>, "the public size of a tile queue");
  return queue + kTileQueueSlotsWord + cta * Stages + stage;
}

// The producer thread: takes the next tile index once the tile's first stage is free (not earlier:
// the tiles in flight stay consecutive), seeks `scheduler` to it and publishes it in the stage's
// slot of each of the kCtas CTAs that compute the tile (this one and, for CTA pairs,
// paired_gemm_kernel.cuh, the next one: the index then counts pairs). At the end of the queue it
// publishes kNoMoreTiles, completes the stage with no bytes and returns false.
template <class Gemm, int kCtas, class Scheduler, class Pipeline>
__device__ bool producer_take_tile(uint32_t* queue, Scheduler& scheduler, Pipeline const& pipe,
                                   typename Pipeline::State st) {
  static_assert(kCtas == 1 || kCtas == 2, "a tile is computed by one CTA or a pair");
  constexpr int kStages = Gemm::Policy::kStages;
  if constexpr (kTakesTileQueue<Gemm>) {
    pipe.producer_acquire(st);
    uint32_t const t = atomicAdd(queue, 1u);
    bool const has_tile = t < uint32_t(scheduler.num_tiles());
    uint32_t const slot = has_tile ? t : kNoMoreTiles;
    *tile_slot<kStages>(queue, st.stage) = slot;
    if constexpr (kCtas == 2) *tile_slot<kStages>(queue, st.stage, int(blockIdx.x) + 1) = slot;
    if (!has_tile) {
      pipe.producer_arrive(st);
      return false;
    }
    scheduler.seek(int(t));
    return true;
  }
  return false;
}

// A consumer thread: waits for the tile's first stage, reads its index from the stage's slot and
// seeks `scheduler` to it; false at the end of the queue.
template <class Gemm, class Scheduler>
__device__ bool consumer_take_tile(uint32_t* queue, Scheduler& scheduler, TmaPipeline<Gemm::Policy::kStages> const& pipe,
                                   PipelineState<Gemm::Policy::kStages> st) {
  if constexpr (kTakesTileQueue<Gemm>) {
    pipe.consumer_wait(st);
    uint32_t const t = *static_cast<volatile uint32_t*>(tile_slot<Gemm::Policy::kStages>(queue, st.stage));
    if (t == kNoMoreTiles) return false;
    scheduler.seek(int(t));
    return true;
  }
  return false;
}

// CTA pairs, a consumer thread of either CTA: as consumer_take_tile; at the end of the queue it
// also releases the stage (the leader's producer waits for every stage before it exits).
template <class Gemm, class Scheduler>
__device__ bool consumer_take_pair(uint32_t* queue, Scheduler& scheduler,
                                   TmaPairPipeline<Gemm::Policy::kStages> const& pipe,
                                   PipelineState<Gemm::Policy::kStages> st, int lane) {
  if constexpr (kTakesTileQueue<Gemm>) {
    pipe.consumer_wait_cluster(st);
    uint32_t const t = *static_cast<volatile uint32_t*>(tile_slot<Gemm::Policy::kStages>(queue, st.stage));
    if (t == kNoMoreTiles) {
      __syncwarp();  // every lane has read the slot before the leader may rewrite it
      pipe.consumer_release(st, lane);
      return false;
    }
    scheduler.seek(int(t));
    return true;
  }
  return false;
}

}  // namespace caracal::gemm
