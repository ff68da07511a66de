#pragma once
// The tile GEMM mainloop: the producer's TMA loads and the consumers' wgmma loop for one
// 128 x 256 output tile, K in a fixed order (k tile 0, 1, ...): the result of a tile does not
// depend on which CTA computes it or when.
#include <cstdint>

#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/tensor.hpp>

#include "kernels/gemm/gemm_config.cuh"
#include "kernels/gemm/tile_scheduler.cuh"
#include "kernels/gemm/tma_pipeline.cuh"

namespace caracal::kernels::gemm {

// Producer (one thread): streams the tile's A rows and its expert's B rows, k tile by k tile.
// A: rows [row_begin, +128) of the [rows][K] activations; B: rows [n_block * 256, +256) of
// expert `expert` in the [L][N][K] weights (rows past N are zero-filled by the TMA).
__device__ inline void load_tile(Params const& p, SharedStorage& smem, TmaPipeline const& pipe,
                                 PipelineState& st, TileCoord const& tile) {
  constexpr uint64_t kCacheHint = uint64_t(cute::TMA::CacheHintSm90::EVICT_NORMAL);
  int const n_begin = tile.n_block * kBlockN;
  for (int k = 0; k < p.k_tiles; ++k) {
    pipe.producer_acquire(st);
    uint64_t* full = pipe.producer_expect(st, kStageBytes);
    int const k_begin = k * kBlockK;
    cute::SM90_TMA_LOAD_2D::copy(&p.a, full, kCacheHint, smem.a[st.stage], k_begin, tile.row_begin);
    cute::SM90_TMA_LOAD_3D::copy(&p.b, full, kCacheHint, smem.b[st.stage], k_begin, n_begin,
                                 tile.expert);
    st.advance();
  }
}

// Consumer warpgroup: accumulates its 64 x 256 slice of the tile in `accum`, keeping one batch of
// wgmmas in flight while it waits for the next stage. With `active` false (the warpgroup's 64
// rows are all padding) it only walks the ring in step with the producer and leaves `accum`
// alone (the epilogue stores zeros instead; defining accumulators outside wgmma here would make
// the compiler serialize the wgmmas).
template <class FragA, class FragB, class Accum>
__device__ void mma_tile(TiledMma& tiled_mma, FragA const& tCrA, FragB const& tCrB, Accum& accum,
                         TmaPipeline const& pipe, PipelineState& st, int k_tiles, bool active,
                         int lane) {
  using namespace cute;
  if (!active) {
    for (int k = 0; k < k_tiles; ++k) {
      pipe.consumer_wait(st);  // keeps this warpgroup from releasing a stage before it is filled
      pipe.consumer_release(st, lane);
      st.advance();
    }
    return;
  }

  // One wgmma site for every k tile (a peeled first tile makes the compiler copy the
  // accumulators between two register sets, which forces a full wait). The first wgmma of the
  // tile overwrites the accumulators, so they need no clearing.
  tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
  PipelineState release = st;
  CUTE_NO_UNROLL
  for (int k = 0; k < k_tiles; ++k) {
    pipe.consumer_wait(st);
    warpgroup_fence_operand(accum);
    warpgroup_arrive();
    CUTE_UNROLL
    for (int kb = 0; kb < size<2>(tCrA); ++kb) {
      cute::gemm(tiled_mma, tCrA(_, _, kb, st.stage), tCrB(_, _, kb, st.stage), accum);
      tiled_mma.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
    warpgroup_wait<1>();  // the previous k tile's wgmmas are done: its stage can be refilled
    warpgroup_fence_operand(accum);
    if (k > 0) {
      pipe.consumer_release(release, lane);
      release.advance();
    }
    st.advance();
  }

  warpgroup_wait<0>();
  warpgroup_fence_operand(accum);
  pipe.consumer_release(release, lane);
}

}  // namespace caracal::kernels::gemm
