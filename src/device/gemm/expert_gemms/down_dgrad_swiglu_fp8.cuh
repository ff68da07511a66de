#pragma once
// The backward's first GEMM in DeepSeek-V3's FP8 recipe: d_h = dy · W_down[e] over an expert's
// rows, A the dy rows in e4m3 [rows][D] scaled per 1 x 128 along D, B W_down's transposed e4m3 copy
// [L][I][D] scaled per 128 x 128 block (both K-major, the one majorness 8-bit wgmma reads), K = D;
// DownDgradSwigluGemm's outputs from the FP8 epilogue, which also stores d_gate_up in e4m3 for the
// dx GEMM (swiglu_backward_fp8_epilogue.cuh). In 128 x 128 tiles or, where K is long, 128 x 256
// (src/gemm/down_dgrad_swiglu_fp8.cu's rule); run by src/gemm/down_dgrad_swiglu_fp8{,_wide}.cu.
#include "device/gemm/gemm_policy.cuh"
#include "device/gemm/operand_loads.cuh"
#include "device/gemm/swiglu_backward_fp8_epilogue.cuh"

namespace caracal::gemm {

struct Fp8DownDgradSwigluGemm {
  using Policy = Fp8BlockScaledGemmPolicy;
  using OperandA = KMajorRows;
  using OperandB = KMajorWeights;
  using Epilogue = SwigluBackwardFp8Epilogue;
};

struct Fp8DownDgradSwigluWideGemm {
  using Policy = Fp8BlockScaledWideGemmPolicy;
  using OperandA = KMajorRows;
  using OperandB = KMajorWeights;
  using Epilogue = SwigluBackwardFp8WideEpilogue;
};

}  // namespace caracal::gemm
