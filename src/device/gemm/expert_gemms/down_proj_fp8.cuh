#pragma once
// The forward's down projection in DeepSeek-V3's FP8 recipe: DownProjGemm's operands and epilogue
// under the block-scaled policy (the activation's e4m3 rows scaled per 1 x 128 along I, W_down's
// e4m3 values per 128 x 128 block): y rounded once to bf16. Run by
// src/gemm/down_proj_fp8.cu.
#include "device/gemm/bf16_epilogue.cuh"
#include "device/gemm/gemm_policy.cuh"
#include "device/gemm/operand_loads.cuh"

namespace caracal::gemm {

struct Fp8DownProjGemm {
  using Policy = Fp8BlockScaledWideGemmPolicy;
  using OperandA = KMajorRows;
  using OperandB = KMajorWeights;
  using Epilogue = RowsBf16Epilogue;
};

}  // namespace caracal::gemm
