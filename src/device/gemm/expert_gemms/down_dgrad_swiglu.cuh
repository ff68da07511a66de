#pragma once
// The backward's first GEMM: d_h = dy · W_down[e] over an expert's rows, A the dy rows [rows][D]
// K-major, B W_down [L][D][I] as stored (K = D rows of N = I columns: MN-major); the SwiGLU
// backward + router-score epilogue stores d_gate_up over gate_up, g · activation and the dL/dg
// partials (swiglu_backward_epilogue.cuh). The standalone kernel
// (src/gemm/down_dgrad_swiglu.cu) and the fused backward run this one definition.
#include "device/gemm/gemm_policy.cuh"
#include "device/gemm/operand_loads.cuh"
#include "device/gemm/swiglu_backward_epilogue.cuh"

namespace caracal::gemm {

struct DownDgradSwigluGemm {
  using Policy = Bf16GemmPolicy;
  using OperandA = KMajorRows;
  using OperandB = MNMajorWeights;
  using Epilogue = SwigluBackwardEpilogue;
};

}  // namespace caracal::gemm
