#pragma once
// The experts' weight gradients in DeepSeek-V3's FP8 recipe: dW[e] = sum over e's rows r of
// lhs[r]^T rhs[r] with both operands rows quantized down their columns (quant::quantize_columns:
// e4m3 codes stored transposed, [MN][buffer rows], so K-major, the one majorness 8-bit wgmma reads;
// one scale per column and 128-row block), promoted every 128 rows with both operands' scales; dW
// stored in fp32 as WeightGradGemm stores it, or rounded once to bf16 (Fp8WeightGradBf16Gemm). Run
// by src/gemm/weight_grad_fp8.cu and weight_grad_fp8_bf16.cu.
#include "device/gemm/gemm_policy.cuh"
#include "device/gemm/operand_loads.cuh"
#include "device/gemm/weight_grad_epilogue.cuh"

namespace caracal::gemm {

struct Fp8WeightGradGemm {
  using Policy = Fp8WeightGradPolicy;
  // Transposed codes [MN][buffer rows] with scales [buffer rows / 128][MN]: KMajorRows' loads, the
  // buffer's rows being this GEMM's K.
  using OperandA = KMajorRows;
  using OperandB = KMajorRows;
  using Epilogue = WeightGradEpilogue;
};

struct Fp8WeightGradBf16Gemm : Fp8WeightGradGemm {
  using Epilogue = WeightGradBf16Epilogue;
};

}  // namespace caracal::gemm
