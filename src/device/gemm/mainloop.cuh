#pragma once
// The tile GEMM mainloop of a policy (gemm_policy.cuh): the producer's TMA loads and the consumers'
// wgmma loop for one kBlockM x kBlockN output tile, K in a fixed order (k tile 0, 1, ...): the
// result of a tile does not depend on which CTA computes it or when.
//
// What differs between precisions is the collective the policy picks, Mainloop<Policy> (as
// CUTLASS's dispatch policies pick a collective): its parameters and stage storage, the loads of an
// operand's k step (values, and where scaled their scales) and the stage's bytes, and the stage
// scales a consumer thread reads, which decide how a k tile's wgmmas accumulate (promotion()).
// The unscaled collective is below; block-scaled policies take block_scaled_mainloop.cuh's.
// load_tile and mma_tile, and the kernels around them, are the same for every policy.
#include <cstdint>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "device/gemm/gemm_config.cuh"
#include "device/gemm/gemm_policy.cuh"
#include "device/gemm/tile_coord.cuh"
#include "device/gemm/tma_pipeline.cuh"

namespace caracal::gemm {

// The operands of one kernel: TMA descriptors (operand_loads.cuh gives each kind's tensor and box)
// and, for an MN-major operand, its MN extent (rows or columns of the output); unused when
// K-major.
struct MainloopParams {
  CUtensorMap a;
  CUtensorMap b;
  int a_mn_extent;
  int b_mn_extent;
};

// The stage ring. Swizzled buffers start on a 1024-byte (swizzle period) boundary: TMA and the
// wgmma descriptors both derive the swizzle from address bits, assuming that base.
template <class Policy>
struct MainloopStorage {
  static_assert(!Policy::kBlockScaled, "the stages of unscaled operands");
  using A = typename Policy::A;
  using B = typename Policy::B;
  alignas(1024) typename A::Element a[Policy::kStages][A::kRows * A::kBlockK];
  alignas(1024) typename B::Element b[Policy::kStages][B::kRows * B::kBlockK];
  alignas(8) uint64_t full[Policy::kStages];   // TMA bytes of the stage landed
  alignas(8) uint64_t empty[Policy::kStages];  // every consumer warp is done reading the stage
};

// How the wgmmas of an unscaled policy accumulate: straight into the tile's accumulators. A
// collective's promotion(accum) gives mma_tile an object with
//   mma_accumulators()              the registers the wgmmas accumulate in
//   begin(tiled_mma, continued)     before the tile's first wgmma (`continued`: accum holds a partial)
//   kPromotes                       whether each k tile's sums are promoted, slice by slice
//                                   (gemm_policy.cuh's kMmaN): then also
//     load_scales(stage)            before a k tile's wgmmas, its stage landed
//     prepare()                     while its first slice's wgmmas run
//     promote(tiled_mma, n)         once slice n's retired (the last slice's after the stage's
//                                   release)
template <class Accum>
struct DirectAccumulation {
  static constexpr bool kPromotes = false;
  Accum& accum;

  __device__ Accum& mma_accumulators() const { return accum; }
  // The first wgmma of the tile overwrites the accumulators (unless they continue a partial), so
  // they need no clearing.
  template <class TiledMma>
  __device__ void begin(TiledMma& tiled_mma, bool continued) const {
    tiled_mma.accumulate_ = continued ? cute::GMMA::ScaleOut::One : cute::GMMA::ScaleOut::Zero;
  }
};

// The stage scales a consumer thread of an unscaled policy reads: none.
struct NoStageScales {
  template <class Accum>
  __device__ DirectAccumulation<Accum> promotion(Accum& accum) const {
    return {accum};
  }
};

// The collective of unscaled policies.
template <class Policy, class = void>
struct Mainloop {
  static_assert(!Policy::kBlockScaled, "a block-scaled policy's collective is block_scaled_mainloop.cuh's");
  using Params = MainloopParams;
  using Storage = MainloopStorage<Policy>;
  // The TMA's bytes per stage.
  static constexpr uint32_t kStageBytes = Policy::kOperandBytes;

  // One thread, before the launch's first loads: the TMA descriptors into the cache.
  __device__ static void prefetch_descriptors(Params const& p) {
    cute::prefetch_tma_descriptor(&p.a);
    cute::prefetch_tma_descriptor(&p.b);
  }
  // Producer: operand A's (B's) share of stage `stage` at K index `k`, for output rows (columns)
  // from `mn`, through the Gemm's operand kind; `to` as operand_loads.cuh's loads.
  template <class Gemm>
  __device__ static void load_a(Params const& p, uint64_t* full, Storage& smem, int stage, int mn, int k, int expert,
                                uint16_t to = 0) {
    Gemm::OperandA::template load<typename Policy::A>(&p.a, full, smem.a[stage], mn, p.a_mn_extent, k, expert, to);
  }
  template <class Gemm>
  __device__ static void load_b(Params const& p, uint64_t* full, Storage& smem, int stage, int mn, int k, int expert,
                                uint16_t to = 0) {
    Gemm::OperandB::template load<typename Policy::B>(&p.b, full, smem.b[stage], mn, p.b_mn_extent, k, expert, to);
  }
  // Consumer thread `thread` (0..255, both warpgroups): the stage scales it reads.
  __device__ static NoStageScales stage_scales(Storage&, int /*thread*/) { return {}; }
};

// An epilogue that reads a source tensor may declare
//   static __device__ void prefetch_source(Params const&, TileCoord const&);
// the producer calls it this many k tiles before the end of the tile's loads (plus the stages
// it runs ahead of the consumers), so the source sits in L2 when the epilogue reads it, without
// being fetched so early that the operand stream evicts it again.
inline constexpr int kSourcePrefetchLead = 8;

// An epilogue whose sums may continue from partials (the weight gradients over a window, with
// WeightTileScheduler) declares
//   static constexpr bool kLoadsPartials = true;
//   template <class Accum> static __device__ bool load_partial(Params const&, TileCoord const&,
//                                                              ExpertWindow const&, Accum&, int warpgroup);
// and takes the scheduler's ExpertWindow in apply() too: the consumers call load_partial before a
// tile's mainloop, which then adds to what it loaded if it says so.
template <class Epilogue, class = void>
inline constexpr bool kLoadsPartials = false;
template <class Epilogue>
inline constexpr bool kLoadsPartials<Epilogue, std::void_t<decltype(Epilogue::kLoadsPartials)>> =
    Epilogue::kLoadsPartials;

template <class Epilogue, class = void>
inline constexpr bool kPrefetchesSource = false;
template <class Epilogue>
inline constexpr bool
    kPrefetchesSource<Epilogue, std::void_t<decltype(&Epilogue::prefetch_source)>> = true;

// A consumer thread's (0..255, both warpgroups) wgmma views of the stage ring's A and B:
// shared-memory descriptors, (MMA, MMA_M or MMA_N, MMA_K, stage); nothing is copied.
template <class Mma, class TiledMma, class Storage>
__device__ auto stage_fragment_a(TiledMma const& tiled_mma, Storage& smem, int thread) {
  using namespace cute;
  auto thr_mma = tiled_mma.get_thread_slice(thread);
  return thr_mma.make_fragment_A(thr_mma.partition_A(make_tensor(make_smem_ptr(&smem.a[0][0]), typename Mma::SmemLayoutA{})));
}
template <class Mma, class TiledMma, class Storage>
__device__ auto stage_fragment_b(TiledMma const& tiled_mma, Storage& smem, int thread) {
  using namespace cute;
  auto thr_mma = tiled_mma.get_thread_slice(thread);
  return thr_mma.make_fragment_B(thr_mma.partition_B(make_tensor(make_smem_ptr(&smem.b[0][0]), typename Mma::SmemLayoutB{})));
}

// Producer (one thread): streams the tile's A and B operands, k tile by k tile, through its Gemm's
// policy's collective and operand kinds (operand_loads.cuh).
template <class Gemm, class Collective = Mainloop<typename Gemm::Policy>>
__device__ void load_tile(typename Collective::Params const& p, typename Gemm::Epilogue::Params const& epilogue,
                          typename Collective::Storage& smem, TmaPipeline<Gemm::Policy::kStages> const& pipe,
                          PipelineState<Gemm::Policy::kStages>& st, TileCoord const& tile) {
  using Policy = typename Gemm::Policy;
  int const prefetch_at = max(tile.k_tiles - kSourcePrefetchLead, 0);
  for (int k = 0; k < tile.k_tiles; ++k) {
    if constexpr (kPrefetchesSource<typename Gemm::Epilogue>) {
      if (k == prefetch_at) Gemm::Epilogue::prefetch_source(epilogue, tile);
    }
    pipe.producer_acquire(st);
    uint64_t* full = pipe.producer_expect(st, Collective::kStageBytes);
    int const k_index = tile.k_begin + k * Policy::kBlockK;
    Collective::template load_a<Gemm>(p, full, smem, st.stage, tile.m_buffer, k_index, tile.expert);
    Collective::template load_b<Gemm>(p, full, smem, st.stage, tile.n_begin, k_index, tile.expert);
    st.advance();
  }
}

// Consumer warpgroup (of a TmaPipeline or a TmaPairPipeline): accumulates its 64 x kBlockN slice
// of the tile in `accum`, keeping one batch of wgmmas in flight while it waits for the next stage;
// `scales` (its collective's stage_scales) decide how each k tile's wgmmas accumulate there. With
// `active` false (the warpgroup's 64 rows need no work) it only walks the ring in step with the
// producer and leaves `accum` alone (the epilogue stores zeros instead; defining accumulators
// outside wgmma here would make the compiler serialize the wgmmas). With k_tiles == 0 there is
// nothing to walk: the caller passes active == false. `gathered`: the stages' A was written by
// cp.async (gathered_rows.cuh), which the wgmmas may read only after a proxy fence. `continued`:
// `accum` holds a partial sum to add to.
template <class TiledMma, class FragA, class FragB, class StageScales, class Accum, class Pipeline>
__device__ void mma_tile(TiledMma& tiled_mma, FragA const& tCrA, FragB const& tCrB, StageScales const& scales,
                         Accum& accum, Pipeline const& pipe, typename Pipeline::State& st, int k_tiles, bool active,
                         int lane, bool gathered = false, bool continued = false) {
  using namespace cute;
  if (!active) {
    for (int k = 0; k < k_tiles; ++k) {
      pipe.consumer_wait(st);  // keeps this warpgroup from releasing a stage before it is filled
      __syncwarp();            // every lane past its reads of the stage's tile slot
      pipe.consumer_release(st, lane);
      st.advance();
    }
    return;
  }

  // One wgmma site for every k tile (a peeled first tile makes the compiler copy the
  // accumulators between two register sets, which forces a full wait). Unpromoted, one batch of
  // wgmmas stays in flight across the stage waits; promoted, each k tile's batch of each N slice
  // (gemm_policy.cuh's kMmaN) retires before its sums are promoted (the next batch overwrites
  // them).
  auto promotion = scales.promotion(accum);
  constexpr bool kPromotes = decltype(promotion)::kPromotes;
  auto& mma_accum = promotion.mma_accumulators();
  promotion.begin(tiled_mma, continued);
  typename Pipeline::State release = st;
  CUTE_NO_UNROLL
  for (int k = 0; k < k_tiles; ++k) {
    pipe.consumer_wait(st);
    if (gathered) cutlass::arch::fence_view_async_shared();
    if constexpr (kPromotes) {
      promotion.load_scales(st.stage);
      CUTE_UNROLL
      for (int n = 0; n < size<1>(tCrB); ++n) {
        warpgroup_fence_operand(mma_accum);
        warpgroup_arrive();
        CUTE_UNROLL
        for (int kb = 0; kb < size<2>(tCrA); ++kb) {
          cute::gemm(tiled_mma, mma_accum, tCrA(_, 0, kb, st.stage), tCrB(_, n, kb, st.stage), mma_accum);
          tiled_mma.accumulate_ = GMMA::ScaleOut::One;
        }
        warpgroup_commit_batch();
        if (n == 0) promotion.prepare();
        warpgroup_wait<0>();
        warpgroup_fence_operand(mma_accum);
        // The last slice's wgmmas and the scale loads are done with the stage. Scales the producer
        // wrote with cp.async (gathered) are read with ld.shared by every lane: the warp meets before
        // lane 0 releases the stage for the next copies into it.
        if (n == size<1>(tCrB) - 1) {
          if (gathered) __syncwarp();
          pipe.consumer_release(st, lane);
        }
        promotion.promote(tiled_mma, n);
      }
    } else {
      warpgroup_fence_operand(mma_accum);
      warpgroup_arrive();
      CUTE_UNROLL
      for (int kb = 0; kb < size<2>(tCrA); ++kb) {
        cute::gemm(tiled_mma, tCrA(_, _, kb, st.stage), tCrB(_, _, kb, st.stage), mma_accum);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_wait<1>();  // the previous k tile's wgmmas are done: its stage can be refilled
      warpgroup_fence_operand(mma_accum);
      if (k > 0) {
        pipe.consumer_release(release, lane);
        release.advance();
      }
    }
    st.advance();
  }

  if constexpr (!kPromotes) {
    warpgroup_wait<0>();
    warpgroup_fence_operand(mma_accum);
    pipe.consumer_release(release, lane);
  }
}

}  // namespace caracal::gemm
