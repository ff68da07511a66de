#pragma once
// The mainloop collective of block-scaled policies (gemm_policy.cuh: both operands scaled, one
// 128-wide scaling block per k step), as CUTLASS's sm90 FP8 blockwise-scaling collective: the
// producer loads each k step's scales with its operands (operand_loads.cuh's load_scales, the same
// stage and barrier), and each consumer thread, once a k step's wgmmas are done, adds their partial
// sums times the step's scales of its rows and columns to the tile's fp32 accumulators (promotion:
// the tensor cores' low-precision accumulation never runs past one scaling block). The skeleton
// (load_tile, mma_tile, the kernels) is mainloop.cuh's.
#include <cstdint>
#include <type_traits>

#include <cute/tensor.hpp>

#include "device/gemm/gemm_config.cuh"
#include "device/gemm/gemm_policy.cuh"
#include "device/gemm/mainloop.cuh"
#include "device/gemm/operand_loads.cuh"

namespace caracal::gemm {

// A scaled operand's scale of MN index `mn` (a row of A, a column of B) in its stage's ScaleTile.
template <class Tile>
__device__ float scale_at(float const* scales, int mn) {
  if constexpr (Tile::kScale == ScaleKind::kPerRowBlock) {
    return scales[mn];
  } else {
    return scales[int(fp8_weight_scale_at(mn / kScaleBlock))];
  }
}

// A consumer thread's promotion: the wgmmas accumulate a k step in `partial`; after_k_tile adds it,
// scaled, to the tile's accumulators `accum` and has the next step's first wgmma overwrite it.
template <class Policy, class Accum>
struct BlockScaledAccumulation {
  using PartialSums = decltype(cute::make_fragment_like(std::declval<Accum&>()));

  Accum& accum;
  PartialSums partial;
  float const* scales_a;  // stage 0's ScaleTile of A; stage s at s * ScaleTile<A>::kSlot
  float const* scales_b;
  int row;     // the thread's first accumulator row in the tile (its second: row + 8)
  int column;  // its first accumulator column (gemm_config.cuh's pattern)

  __device__ PartialSums& mma_accumulators() { return partial; }
  template <class TiledMma>
  __device__ void begin(TiledMma& tiled_mma, bool continued) {
    if (!continued) cute::clear(accum);
    tiled_mma.accumulate_ = cute::GMMA::ScaleOut::Zero;
  }
  // Value i = v0 + 2*v1 + 4*t is at row `row + 8*v1`, column `column + 8*t + v0`.
  template <class TiledMma>
  __device__ void after_k_tile(TiledMma& tiled_mma, int stage) {
    using A = typename Policy::A;
    using B = typename Policy::B;
    cute::warpgroup_wait<0>();
    cute::warpgroup_fence_operand(partial);
    float const* const sa = scales_a + stage * ScaleTile<A>::kSlot;
    float const* const sb = scales_b + stage * ScaleTile<B>::kSlot;
    float const row_scale[2] = {scale_at<A>(sa, row), scale_at<A>(sa, row + 8)};
    CUTE_UNROLL
    for (int i = 0; i < int(cute::size(accum)); ++i) {
      float const column_scale = scale_at<B>(sb, column + 8 * (i / 4) + i % 2);
      accum(i) += partial(i) * (row_scale[(i / 2) % 2] * column_scale);
    }
    tiled_mma.accumulate_ = cute::GMMA::ScaleOut::Zero;
  }
};

// The stage scales consumer thread `thread` (0..255, both warpgroups) reads.
template <class Policy>
struct BlockStageScales {
  float const* scales_a;
  float const* scales_b;
  int thread;

  template <class Accum>
  __device__ BlockScaledAccumulation<Policy, Accum> promotion(Accum& accum) const {
    int const lane = thread % 32;
    int const row = (thread / kWarpgroupThreads) * kWarpgroupRows + (thread % kWarpgroupThreads) / 32 * 16 + lane / 4;
    return {accum, cute::make_fragment_like(accum), scales_a, scales_b, row, 2 * (lane % 4)};
  }
};

template <class Policy>
struct Mainloop<Policy, std::enable_if_t<Policy::kBlockScaled>> {
  using A = typename Policy::A;
  using B = typename Policy::B;
  static_assert(A::kScale != ScaleKind::kNone && B::kScale != ScaleKind::kNone, "both operands scaled");
  static_assert(std::is_same_v<typename Policy::Accumulator, float>, "promotion into fp32 accumulators");

  // The operands' maps and extents, and their scales' maps (operand_loads.cuh's ScaleTile).
  struct Params : MainloopParams {
    CUtensorMap scales_a;
    CUtensorMap scales_b;
  };

  struct Storage {
    alignas(1024) typename A::Element a[Policy::kStages][A::kRows * A::kBlockK];
    alignas(1024) typename B::Element b[Policy::kStages][B::kRows * B::kBlockK];
    alignas(128) float scales_a[Policy::kStages][ScaleTile<A>::kSlot];
    alignas(128) float scales_b[Policy::kStages][ScaleTile<B>::kSlot];
    alignas(8) uint64_t full[Policy::kStages];   // TMA bytes of the stage landed, scales too
    alignas(8) uint64_t empty[Policy::kStages];  // every consumer warp is done reading the stage
  };

  static constexpr uint32_t kStageBytes = Policy::kOperandBytes + ScaleTile<A>::kBytes + ScaleTile<B>::kBytes;

  __device__ static void prefetch_descriptors(Params const& p) {
    cute::prefetch_tma_descriptor(&p.a);
    cute::prefetch_tma_descriptor(&p.b);
    cute::prefetch_tma_descriptor(&p.scales_a);
    cute::prefetch_tma_descriptor(&p.scales_b);
  }
  template <class Gemm>
  __device__ static void load_a(Params const& p, uint64_t* full, Storage& smem, int stage, int mn, int k, int expert,
                                uint16_t to = 0) {
    Gemm::OperandA::template load<A>(&p.a, full, smem.a[stage], mn, p.a_mn_extent, k, expert, to);
    Gemm::OperandA::template load_scales<A>(&p.scales_a, full, smem.scales_a[stage], mn, k, expert, to);
  }
  template <class Gemm>
  __device__ static void load_b(Params const& p, uint64_t* full, Storage& smem, int stage, int mn, int k, int expert,
                                uint16_t to = 0) {
    Gemm::OperandB::template load<B>(&p.b, full, smem.b[stage], mn, p.b_mn_extent, k, expert, to);
    Gemm::OperandB::template load_scales<B>(&p.scales_b, full, smem.scales_b[stage], mn, k, expert, to);
  }
  __device__ static BlockStageScales<Policy> stage_scales(Storage& smem, int thread) {
    return {&smem.scales_a[0][0], &smem.scales_b[0][0], thread};
  }
};

}  // namespace caracal::gemm
