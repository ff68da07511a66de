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

// One float of shared memory by ld.shared (through a generic pointer the compiler emits generic
// loads). Volatile: it stays after the stage's full-barrier wait, where the mainloop puts it.
__device__ inline float load_shared_float(float const* p) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(p))));
  return v;
}

// Two consecutive floats of shared memory (8-byte aligned) by one ld.shared.v2.
__device__ inline float2 load_shared_float2(float const* p) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];"
               : "=f"(v.x), "=f"(v.y)
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(p))));
  return v;
}

// A scaled operand's scale of MN index `mn` (a row of A, a column of B) in its stage's ScaleTile.
template <class Tile>
__device__ float scale_at(float const* scales, int mn) {
  if constexpr (Tile::kScale == ScaleKind::kPerRowBlock) {
    return load_shared_float(scales + mn);
  } else {
    return load_shared_float(scales + int(fp8_weight_scale_at(mn / kScaleBlock)));
  }
}

// A consumer thread's promotion: the wgmmas accumulate a k step's N slice (Policy::kMmaN columns)
// in `partial`; promote() adds it, scaled, to the slice's share of the tile's accumulators `accum`
// and has the next slice's first wgmma overwrite it.
// Per k step, as CUTLASS's blockwise collective: load_scales (before the wgmmas) reads the thread's
// scales from the stage into registers, prepare (while they run) multiplies them into one factor
// per (row, 128-column block), and after the wgmmas retire the stage is released before promote's
// FFMAs, which read registers only. B scaled per row block (the weight gradients: one scale per
// column of the tile) has a scale for each of the thread's N / 4 columns; its factors are formed in
// promote, one FMUL each, since keeping N / 2 of them would not fit the registers beside the
// accumulators.
template <class Policy, class Accum>
struct BlockScaledAccumulation {
  // One slice's sums: the accumulators of one (64 x kMmaN) wgmma atom.
  using PartialSums = decltype(cute::make_fragment_like(std::declval<Accum&>()(cute::_, 0, 0)));
  using A = typename Policy::A;
  using B = typename Policy::B;
  static_assert(A::kScale == ScaleKind::kPerRowBlock, "A scaled per 1 x 128 block");
  static constexpr bool kScaledColumns = B::kScale == ScaleKind::kPerRowBlock;
  // B per 128 x 128 block: one scale per 128-column block of the tile.
  static constexpr int kColumnBlocks = B::kRows / kScaleBlock;
  // Scales a thread keeps per k step for its columns: per column (value i's at (i / 4) * 2 + i % 2),
  // or per column block.
  static constexpr int kColumnScales = kScaledColumns ? B::kRows / 4 : kColumnBlocks;
  static constexpr bool kPromotes = true;

  Accum& accum;
  PartialSums partial;
  float const* scales_a;  // stage 0's ScaleTile of A; stage s at s * ScaleTile<A>::kSlot
  float const* scales_b;
  int row;     // the thread's first accumulator row in the tile (its second: row + 8)
  int column;  // its first accumulator column (gemm_config.cuh's pattern)
  float row_scale[2];
  float column_scale[kColumnScales];
  float factor[2][kScaledColumns ? 1 : kColumnBlocks];

  __device__ PartialSums& mma_accumulators() { return partial; }
  template <class TiledMma>
  __device__ void begin(TiledMma& tiled_mma, bool continued) {
    if (!continued) cute::clear(accum);
    tiled_mma.accumulate_ = cute::GMMA::ScaleOut::Zero;
  }
  // After the stage's full barrier, before its wgmmas.
  __device__ void load_scales(int stage) {
    float const* const sa = scales_a + stage * ScaleTile<A>::kSlot;
    float const* const sb = scales_b + stage * ScaleTile<B>::kSlot;
    row_scale[0] = scale_at<A>(sa, row);
    row_scale[1] = scale_at<A>(sa, row + 8);
    if constexpr (kScaledColumns) {
      // Columns column + 8t and + 8t + 1: one 8-byte load each t (column is even).
      CUTE_UNROLL
      for (int t = 0; t < B::kRows / 8; ++t) {
        float2 const pair = load_shared_float2(sb + column + 8 * t);
        column_scale[2 * t] = pair.x;
        column_scale[2 * t + 1] = pair.y;
      }
    } else {
      CUTE_UNROLL
      for (int b = 0; b < kColumnBlocks; ++b) column_scale[b] = scale_at<B>(sb, b * kScaleBlock);
    }
  }
  // While the wgmmas run; every lane's scale loads have returned once it has passed this.
  __device__ void prepare() {
    if constexpr (!kScaledColumns) {
      CUTE_UNROLL
      for (int r = 0; r < 2; ++r) {
        CUTE_UNROLL
        for (int b = 0; b < kColumnBlocks; ++b) factor[r][b] = row_scale[r] * column_scale[b];
      }
    }
  }
  // Slice n's value i is the tile's value j = i + n * size(partial) (mma_config.cuh); value
  // j = v0 + 2*v1 + 4*t is at row `row + 8*v1`, column `column + 8*t + v0`: column block
  // 8*t / 128 (column < 8).
  template <class TiledMma>
  __device__ void promote(TiledMma& tiled_mma, int n) {
    constexpr int kSliceValues = int(decltype(cute::size(std::declval<PartialSums&>()))::value);
    CUTE_UNROLL
    for (int i = 0; i < kSliceValues; ++i) {
      int const j = i + n * kSliceValues;
      if constexpr (kScaledColumns) {
        accum(j) += partial(i) * (row_scale[(j / 2) % 2] * column_scale[(j / 4) * 2 + j % 2]);
      } else {
        accum(j) += partial(i) * factor[(j / 2) % 2][8 * (j / 4) / kScaleBlock];
      }
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
    return {accum, cute::make_fragment_like(accum(cute::_, 0, 0)), scales_a, scales_b, row, 2 * (lane % 4)};
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
