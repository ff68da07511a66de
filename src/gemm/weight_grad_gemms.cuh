#pragma once
// The weight-gradient kernels' Gemms (grouped_gemm_kernel.cuh): weight_grad.cu and
// weight_grad_bf16.cu instantiate them; a fused unit may derive one with IdleWarps work.
//
// Both operands are row buffers whose rows are this GEMM's K, so both are MN-major: TMA loads
// 64-row x 64-column boxes as they lie in memory and wgmma reads them transposed from shared
// memory (no transpose pass, no transposing producer).
#include "device/gemm/operand_loads.cuh"
#include "device/gemm/paired_gemm_kernel.cuh"
#include "device/gemm/weight_grad_epilogue.cuh"
#include "device/gemm/weight_tile_pair_scheduler.cuh"
#include "device/gemm/weight_tile_scheduler.cuh"

namespace caracal::gemm {

// fp32 gradients, one CTA a tile (CTA pairs measured 1-3% slower here on balanced routings).
struct WeightGradGemm {
  using OperandA = MNMajorRows;
  using OperandB = MNMajorRows;
  using Scheduler = WeightTileScheduler;
  using Epilogue = WeightGradEpilogue;
};

// bf16 gradients in CTA pairs sharing the N operand (paired_gemm_kernel.cuh): 2-15% faster than
// one CTA a tile here.
struct WeightGradBf16Gemm {
  using OperandA = MNMajorRows;
  using OperandB = MNMajorRows;
  using Scheduler = WeightTilePairScheduler;
  static constexpr RegisterSplit kRegisterSplit = kPairRegisterSplit;
  using Epilogue = WeightGradBf16Epilogue;
};

}  // namespace caracal::gemm
