#pragma once
// The grouped-GEMM CTA tile, visible to host code (argument checks, grid sizing) without CuTe.
#include "caracal/gemm/grouped_gemm.hpp"

namespace caracal::gemm {

inline constexpr int kBlockM = kGroupedGemmTileM;  // 128: one expert per M block
inline constexpr int kBlockN = 256;
inline constexpr int kBlockK = 64;  // one 128-byte swizzle row of bf16

}  // namespace caracal::gemm
