#pragma once
// The backward's dx GEMM in DeepSeek-V3's FP8 recipe: dx = d_gate_up · W_gate_up[e] over K = 2I (the
// interleave permutes K in both operands alike), A d_gate_up in e4m3 [rows][2I] scaled per 1 x 128
// along 2I (the FP8 dgrad's second output), B W_gate_up's transposed e4m3 copy [L][D][2I] scaled
// per 128 x 128 block; dx's rows rounded once to bf16 and stored as they are (bf16_epilogue.cuh).
// Run by src/gemm/gate_up_dgrad_fp8.cu; the narrow tile by the fused FP8 backward.
#include "device/gemm/bf16_epilogue.cuh"
#include "device/gemm/gemm_policy.cuh"
#include "device/gemm/operand_loads.cuh"

namespace caracal::gemm {

struct Fp8GateUpDgradGemm {
  using Policy = Fp8BlockScaledWideGemmPolicy;
  using OperandA = KMajorRows;
  using OperandB = KMajorWeights;
  using Epilogue = RowsBf16Epilogue;
};

// The same in the dgrad's 128 x 128 x 128 tiles (the same bits: a tile's N changes no sum), for a
// launch whose stage ring the narrow dgrad sets (the fused FP8 backward's shared expert).
struct Fp8GateUpDgradNarrowGemm : Fp8GateUpDgradGemm {
  using Policy = Fp8BlockScaledGemmPolicy;
};

}  // namespace caracal::gemm
