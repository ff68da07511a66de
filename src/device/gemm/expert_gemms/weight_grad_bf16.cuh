#pragma once
// The weight gradients of weight_grad.cuh (the same operands), dW rounded once to bf16 as it is
// stored (weight_grad_epilogue.cuh). Run by src/gemm/weight_grad_bf16.cu and, with
// the dx sums on its idle warps, src/fused/weight_grad_bf16_dx_sums.cu
// (src/gemm/weight_grad_kernels.cuh schedules both).
#include "device/gemm/expert_gemms/weight_grad.cuh"
#include "device/gemm/weight_grad_epilogue.cuh"

namespace caracal::gemm {

struct WeightGradBf16Gemm : WeightGradGemm {
  using Epilogue = WeightGradBf16Epilogue;
};

}  // namespace caracal::gemm
