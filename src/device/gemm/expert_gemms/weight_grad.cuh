#pragma once
// The experts' weight gradients: dW[e] = sum over e's rows r of lhs[r]^T rhs[r], both operands row
// buffers whose rows are this GEMM's K, so both MN-major (TMA loads 64 x 64 boxes as they lie,
// wgmma reads them transposed from shared memory: no transpose anywhere); dW stored in fp32, an
// expert cut by a window continued from and stored to its fp32 partial (weight_grad_epilogue.cuh).
// Run by src/gemm/weight_grad.cu and, with the dx sums on its idle warps,
// src/fused/weight_grad_dx_sums.cu (src/gemm/weight_grad_kernels.cuh schedules both).
#include "device/gemm/gemm_policy.cuh"
#include "device/gemm/operand_loads.cuh"
#include "device/gemm/weight_grad_epilogue.cuh"

namespace caracal::gemm {

struct WeightGradGemm {
  using Policy = Bf16GemmPolicy;
  using OperandA = MNMajorRows;
  using OperandB = MNMajorRows;
  using Epilogue = WeightGradEpilogue;
};

}  // namespace caracal::gemm
