#pragma once
// A GEMM's precision and tile as one type, the policy every mainloop piece is instantiated on: the
// operand layouts and the wgmma (mma_config.cuh), the stage ring and its loads (mainloop.cuh,
// operand_loads.cuh), the kernel's shared storage (grouped_gemm_kernel.cuh). Each GEMM of
// expert_gemms/ names its policy; a new precision is one more policy, and a scaled one runs the
// block-scaled collective (mainloop.cuh says how a policy picks its collective).
//
//   ElementA, ElementB   the operands' values, as TMA copies them into the stages
//   kScaleA, kScaleB     how each operand's values are scaled (ScaleKind)
//   Accumulator          what the wgmmas accumulate in
//   kBlockM, kBlockN     the CTA tile; M is the schedule's row block (kBlockM, tile_shape.hpp)
//   kBlockK, kStages     the K depth of a stage (one 128-byte swizzle row of each operand) and the
//                        ring's depth
//   kChunkBuffers        each consumer warpgroup's ring of 8 KiB epilogue chunks (chunk_store.cuh):
//                        enough for a whole slice lets its stores drain under the next mainloop
// and derived from them: kMmaN, the N of one wgmma (mma_config.cuh). A promoted (block-scaled)
// policy issues a k step's wgmmas in slices of at most one 128-column scaling block, each promoted
// before the next: one slice's partial sums beside the tile's accumulators fit the registers.
#include <cstdint>

#include <cute/numeric/numeric_types.hpp>

#include "device/gemm/gemm_config.cuh"
#include "device/gemm/tile_shape.hpp"

namespace caracal::gemm {

// How an operand's values are scaled: not at all (the values are the operand), by one fp32 per row
// and kScaleBlock-wide K block (activations and gradients, 1 x 128), or by one fp32 per
// kScaleBlock x kScaleBlock block (weights, 128 x 128).
enum class ScaleKind { kNone, kPerRowBlock, kPerBlock };
inline constexpr int kScaleBlock = 128;

// One operand's share of a stage: `Rows` MN rows of BlockK values, scaled as `kScale` says.
template <class Element_, int Rows, int BlockK, ScaleKind kScale_>
struct OperandTile {
  using Element = Element_;
  static constexpr int kRows = Rows;
  static constexpr int kBlockK = BlockK;
  static constexpr ScaleKind kScale = kScale_;
  static constexpr uint32_t kBytes = uint32_t(sizeof(Element)) * kRows * kBlockK;
  // MN extent of one MN-major box: a 128-byte row of values (operand_loads.cuh).
  static constexpr int kMnBox = 128 / int(sizeof(Element));
  static_assert(kBlockK * sizeof(Element) == 128, "a stage's K depth is one 128-byte swizzle row");
};

template <class ElementA_, class ElementB_, ScaleKind kScaleA_, ScaleKind kScaleB_, class Accumulator_, int BlockM,
          int BlockN, int BlockK, int Stages, int ChunkBuffers = kChunkBuffers>
struct GemmPolicy {
  using ElementA = ElementA_;
  using ElementB = ElementB_;
  using Accumulator = Accumulator_;
  static constexpr ScaleKind kScaleA = kScaleA_;
  static constexpr ScaleKind kScaleB = kScaleB_;
  static constexpr int kBlockM = BlockM;
  static constexpr int kBlockN = BlockN;
  static constexpr int kBlockK = BlockK;
  static constexpr int kStages = Stages;
  static constexpr int kChunkBuffers = ChunkBuffers;
  static constexpr bool kBlockScaled = kScaleA_ != ScaleKind::kNone || kScaleB_ != ScaleKind::kNone;
  static constexpr int kMmaN = kBlockScaled && kBlockN > kScaleBlock ? kScaleBlock : kBlockN;

  using A = OperandTile<ElementA, kBlockM, kBlockK, kScaleA>;
  using B = OperandTile<ElementB, kBlockN, kBlockK, kScaleB>;
  // Operand bytes the TMA deposits per stage (a scaled mainloop adds its scales').
  static constexpr uint32_t kOperandBytes = A::kBytes + B::kBytes;
  // The K of one wgmma: 32 bytes of each operand (16 bf16, 32 e4m3).
  static constexpr int kMmaK = 32 / int(sizeof(ElementA));

  static_assert(sizeof(ElementA) == sizeof(ElementB), "wgmma multiplies operands of one width");
  static_assert(kBlockM == gemm::kBlockM, "every GEMM's M tile is the schedule's row block");
  static_assert(!kBlockScaled || kBlockK == kScaleBlock, "a scaled stage is one scaling block deep in K");
  static_assert(kScaleA != ScaleKind::kPerBlock || kBlockM % kScaleBlock == 0, "whole 128 x 128 blocks of A");
  static_assert(kScaleB != ScaleKind::kPerBlock || kBlockN % kScaleBlock == 0, "whole 128 x 128 blocks of B");
  static_assert(kBlockN % kMmaN == 0, "whole wgmma slices");
};

// Today's GEMMs: bf16 operands, fp32 accumulators, 128 x 256 x 64 tiles in a ring of 4 stages
// (48 KiB each).
using Bf16GemmPolicy = GemmPolicy<cute::bfloat16_t, cute::bfloat16_t, ScaleKind::kNone, ScaleKind::kNone, float,
                                  kBf16Tile.m, kBf16Tile.n, kBf16Tile.k, 4>;

// DeepSeek-V3's recipe: e4m3 activations scaled per 1 x 128 block along K, e4m3 weights per
// 128 x 128 block, fp32 accumulators promoted per 128-wide K block (block_scaled_mainloop.cuh).
// 128 x 128 x 128 tiles, for the dgrad where K is short (its epilogue's outputs are per tile, I
// only a multiple of 128): a consumer thread holds the tile's and the block's accumulators, 64 each.
using Fp8BlockScaledGemmPolicy = GemmPolicy<cute::float_e4m3_t, cute::float_e4m3_t, ScaleKind::kPerRowBlock,
                                            ScaleKind::kPerBlock, float, kFp8NarrowTile.m, kFp8NarrowTile.n,
                                            kFp8NarrowTile.k, 5>;

// The same recipe in 128 x 256 x 128 tiles, for the row GEMMs (the forward's up/gate and down, the
// backward's dx, and the dgrad where K is long): a warpgroup's k step is two 64 x 128 slices
// of wgmmas, each promoted into its half of the 64 x 256 accumulators. Four stages of 48 KiB with
// their scales and the chunk ring fill the 227 KiB exactly (persistent_task_kernel.cuh: no slack).
using Fp8BlockScaledWideGemmPolicy = GemmPolicy<cute::float_e4m3_t, cute::float_e4m3_t, ScaleKind::kPerRowBlock,
                                                ScaleKind::kPerBlock, float, kFp8WideTile.m, kFp8WideTile.n,
                                                kFp8WideTile.k, 4>;

// The weight gradients in that recipe: both operands are rows quantized down their columns (1 x 128
// blocks along the tokens, this GEMM's K), so both are scaled per row block; the promotion scales
// each accumulator by its row's and its column's scale (block_scaled_mainloop.cuh). A warpgroup's
// fp32 slice (64 x 128: four chunks) fits its chunk ring whole, so a tile's stores drain under the
// next tile's mainloop (a tile is only K / 128 stages deep: 4 at 512 rows an expert).
using Fp8WeightGradPolicy = GemmPolicy<cute::float_e4m3_t, cute::float_e4m3_t, ScaleKind::kPerRowBlock,
                                       ScaleKind::kPerRowBlock, float, kFp8WeightGradTile.m, kFp8WeightGradTile.n,
                                       kFp8WeightGradTile.k, 4, 4>;

}  // namespace caracal::gemm
