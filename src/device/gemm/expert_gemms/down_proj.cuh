#pragma once
// The forward's down projection: y = activation · W_down[e]^T over an expert's rows, A the rows
// [rows][I] and B the weights [L][D][I], both K-major (K = I); y's rows stored in bf16
// (bf16_epilogue.cuh). The standalone kernel (src/gemm/down_proj.cu) and the fused
// forward run this one definition, hence the same bits.
#include "device/gemm/bf16_epilogue.cuh"
#include "device/gemm/gemm_policy.cuh"
#include "device/gemm/operand_loads.cuh"

namespace caracal::gemm {

struct DownProjGemm {
  using Policy = Bf16GemmPolicy;
  using OperandA = KMajorRows;
  using OperandB = KMajorWeights;
  using Epilogue = RowsBf16Epilogue;
};

}  // namespace caracal::gemm
