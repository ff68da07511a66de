#pragma once
// The forward's up/gate GEMM in DeepSeek-V3's FP8 recipe: UpGateSwigluGemm's operands and epilogue
// under the block-scaled policy (e4m3 rows scaled per 1 x 128, e4m3 weights per 128 x 128, fp32
// accumulators promoted per 128-wide K block, 128 x 256 tiles): gate_up and the activation stored
// as the bf16 GEMM stores them, each where asked for, and the activation in e4m3 with its 1 x 128
// scales (UpGateSwigluFp8Epilogue). Run by src/gemm/up_gate_swiglu_fp8.cu.
#include "device/gemm/gemm_policy.cuh"
#include "device/gemm/operand_loads.cuh"
#include "device/gemm/swiglu_fp8_epilogue.cuh"

namespace caracal::gemm {

struct Fp8UpGateSwigluGemm {
  using Policy = Fp8BlockScaledWideGemmPolicy;
  using OperandA = KMajorRows;
  using OperandB = KMajorWeights;
  using Epilogue = UpGateSwigluFp8Epilogue;
};

}  // namespace caracal::gemm
