#pragma once
// The grouped GEMMs' tile as host code sees it (argument checks, grid sizing) without CuTe: M is
// the schedule's row block, every GEMM's; N the bf16 policy's tile, which the backward's epilogues,
// the pair and weight-tile schedulers and the fused task lists are written for (the forward's
// epilogues and RowTileSchedulerOf take any policy's N). The K depth and the stage ring are a
// GEMM's policy's (gemm_policy.cuh).
#include "caracal/gemm/gemm_tiles.hpp"

namespace caracal::gemm {

inline constexpr int kBlockM = kGroupedGemmTileM;  // 128: one expert per M block
inline constexpr int kBlockN = kBf16Tile.n;

// Tiles of one expert are visited in groups of this many M blocks, N blocks outer, M blocks
// inner (raster_order.hpp): the CTAs running at one time share a few A blocks and a few weight
// slabs in L2.
inline constexpr int kRasterGroupBlocks = 8;

}  // namespace caracal::gemm
