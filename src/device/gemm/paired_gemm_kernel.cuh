#pragma once
// The grouped-GEMM kernel over row tiles with CTAs in clusters of two: grouped_gemm_kernel.cuh's
// warp roles and collectives (the prologue and storage of persistent_task_kernel.cuh), but the two
// CTAs of a cluster take a pair of tiles at a time (row_tile_pair_scheduler.cuh) and the leader's
// producer thread fills both CTAs' stages (tma_pair_pipeline.cuh): each CTA's own operand with a
// load to that CTA, the shared one with one TMA multicast to both. The follower's producer thread
// has nothing to do; warps 1-3 of both CTAs run the Gemm's IdleWarps work, if any. Each CTA's
// consumers compute and store their own tile exactly as the one-CTA kernel does. The roles are
// written out here: through persistent_task_kernel.cuh's role functions ptxas allocates the row-tile
// pair kernels' uniform registers differently.
//
// `Gemm` as for grouped_gemm_kernel, with a pair scheduler (RowTilePairScheduler for row tiles,
// WeightTilePairScheduler for the weight gradients).
#include <cstdint>

#include <cute/arch/cluster_sm90.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>

#include "device/gemm/chunk_store.cuh"
#include "device/gemm/gemm_config.cuh"
#include "device/gemm/grouped_gemm_kernel.cuh"
#include "device/gemm/mainloop.cuh"
#include "device/gemm/mma_config.cuh"
#include "device/gemm/persistent_task_kernel.cuh"
#include "device/gemm/row_tile_pair_scheduler.cuh"
#include "device/gemm/tile_queue.cuh"
#include "device/gemm/tma_pair_pipeline.cuh"
#include "device/gemm/weight_tile_pair_scheduler.cuh"

namespace caracal::gemm {

// The leader's producer thread holds both tiles of a pair: at 48 registers it spills; the consumers
// need no more than 224.
inline constexpr RegisterSplit kPairRegisterSplit{56, 224};

// A GEMM of src/device/gemm/expert_gemms/ as CTA pairs run it: pairs of tiles from PairScheduler,
// with the pairs' setmaxnreg budgets.
template <class ExpertGemm, class PairScheduler>
struct ScheduledInPairs : ExpertGemm {
  static_assert(PairScheduler::kRunsAsPairs, "a scheduler of tile pairs");
  using Scheduler = PairScheduler;
  static constexpr RegisterSplit kRegisterSplit = kPairRegisterSplit;
};

// Whether a Gemm runs as CTA pairs: its Scheduler hands out pairs of tiles (RowTilePairScheduler,
// WeightTilePairScheduler: `static constexpr bool kRunsAsPairs = true`).
template <class Gemm, class = void>
inline constexpr bool kRunsAsPairs = false;
template <class Gemm>
inline constexpr bool kRunsAsPairs<Gemm, std::void_t<decltype(Gemm::Scheduler::kRunsAsPairs)>> =
    Gemm::Scheduler::kRunsAsPairs;

// The leader's producer thread: streams both tiles of `pair` (located), k tile by k tile.
template <class Gemm, class Collective = Mainloop<typename Gemm::Policy>>
__device__ void load_pair(typename Collective::Params const& p, typename Gemm::Epilogue::Params const& epilogue,
                          typename Collective::Storage& smem, TmaPairPipeline<Gemm::Policy::kStages> const& pipe,
                          PipelineState<Gemm::Policy::kStages>& st, TilePair const& pair, TileCoord const& second) {
  using Policy = typename Gemm::Policy;
  TileCoord const& first = pair.first;
  int const prefetch_at = max(first.k_tiles - kSourcePrefetchLead, 0);
  for (int k = 0; k < first.k_tiles; ++k) {
    if constexpr (kPrefetchesSource<typename Gemm::Epilogue>) {
      if (k == prefetch_at) {
        Gemm::Epilogue::prefetch_source(epilogue, first);
        if (pair.has_second) Gemm::Epilogue::prefetch_source(epilogue, second);
      }
    }
    pipe.producer_acquire(st);
    uint64_t* full = pipe.producer_expect(st, Collective::kStageBytes, k == 0);
    int const k_index = first.k_begin + k * Policy::kBlockK;
    int const s = st.stage;
    if (pair.shares_rows) {
      Collective::template load_a<Gemm>(p, full, smem, s, first.m_buffer, k_index, first.expert, kToBoth);
      Collective::template load_b<Gemm>(p, full, smem, s, first.n_begin, k_index, first.expert, kToLeader);
      Collective::template load_b<Gemm>(p, full, smem, s, second.n_begin, k_index, first.expert, kToFollower);
    } else {
      Collective::template load_a<Gemm>(p, full, smem, s, first.m_buffer, k_index, first.expert, kToLeader);
      Collective::template load_a<Gemm>(p, full, smem, s, second.m_buffer, k_index, first.expert, kToFollower);
      Collective::template load_b<Gemm>(p, full, smem, s, first.n_begin, k_index, first.expert, kToBoth);
    }
    st.advance();
  }
}

template <class Gemm>
__global__ void __launch_bounds__(kThreads, 1)
    paired_gemm_kernel(CUTE_GRID_CONSTANT GemmParams<Gemm> const p) {
  using namespace cute;
  static_assert(kRunsAsPairs<Gemm>);
  using Policy = typename Gemm::Policy;
  using Mma = MmaConfigOf<Gemm>;
  constexpr RegisterSplit kRegisters = checked_register_split<Gemm>();
  extern __shared__ uint8_t smem_raw[];
  KernelStorage<Policy>& smem = kernel_storage<Policy>(smem_raw);

  int const warpgroup = warpgroup_role();
  int const lane = int(threadIdx.x) % 32;

  TmaPairPipeline const pipe(smem.mainloop.full, smem.mainloop.empty, block_rank_in_cluster());
  start_persistent_cta(
      [&] {
        pipe.init();
        if (pipe.leader()) Mainloop<Policy>::prefetch_descriptors(p.mainloop);
      },
      // Both CTAs' barriers exist before either CTA's threads touch the other's.
      [] { cluster_sync(); });

  int const cluster = int(blockIdx.x) / kPairCtas;
  using Scheduler = typename Gemm::Scheduler;
  Scheduler scheduler(p.scheduler, cluster, int(gridDim.x) / kPairCtas);
  uint32_t* const queue = tile_queue<Gemm>(p.scheduler);  // a constant nullptr where the Gemm takes none

  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<kRegisters.producer>();
    if (threadIdx.x == 0 && pipe.leader()) {
      PipelineState<Policy::kStages> st;
      for (;; scheduler.advance()) {
        if (queue != nullptr) {
          if (!producer_take_tile<Gemm, 2>(queue, scheduler, pipe, st)) {
            st.advance();  // past the end-of-queue stage, which the consumers release too
            break;
          }
        } else if (!scheduler.has_tile()) {
          break;
        }
        TilePair pair = scheduler.pair();
        TileCoord second = pair.second();
        Scheduler::locate(p.scheduler, pair.first);
        Scheduler::locate(p.scheduler, second);
        load_pair<Gemm>(p.mainloop, p.epilogue, smem.mainloop, pipe, st, pair, second);
      }
      pipe.producer_tail(st);
    }
    run_idle_warps<Gemm>(p, lane);
  } else {
    cutlass::arch::warpgroup_reg_alloc<kRegisters.consumer>();
    int const consumer = warpgroup - 1;                       // 0 or 1
    int const thread = int(threadIdx.x) - kWarpgroupThreads;  // 0..255
    int const wg_thread = thread % kWarpgroupThreads;

    typename Mma::TiledMma tiled_mma;
    Tensor tCrA = stage_fragment_a<Mma>(tiled_mma, smem.mainloop, thread);
    Tensor tCrB = stage_fragment_b<Mma>(tiled_mma, smem.mainloop, thread);
    auto const scales = Mainloop<Policy>::stage_scales(smem.mainloop, thread);
    Tensor accum = partition_fragment_C(tiled_mma, Shape<Int<Policy::kBlockM>, Int<Policy::kBlockN>>{});
    static_assert(kTileNOf<decltype(accum)> == Policy::kBlockN, "the accumulators cover the policy's tile");

    ChunkStoreRing ring(smem.epilogue.chunks[consumer], consumer, wg_thread);
    PipelineState<Policy::kStages> st;
    for (;; scheduler.advance()) {
      if (queue != nullptr) {
        if (!consumer_take_pair<Gemm>(queue, scheduler, pipe, st, lane)) break;
      } else if (!scheduler.has_tile()) {
        break;
      }
      TilePair const pair = scheduler.pair();
      bool const exists = pipe.leader() || pair.has_second;
      TileCoord tile = pipe.leader() ? pair.first : pair.second();
      Scheduler::locate(p.scheduler, tile);
      bool const active = exists && tile.m_begin + consumer * kWarpgroupRows < tile.active_end;
      // The weight gradients' window: the pair's expert's (both tiles share it).
      consume_tile<Gemm>(p.epilogue, scheduler, tile, active, exists, tiled_mma, tCrA, tCrB, scales, accum, pipe,
                         st, ring, consumer, lane);
    }
    ring.drain();
  }
}

}  // namespace caracal::gemm
