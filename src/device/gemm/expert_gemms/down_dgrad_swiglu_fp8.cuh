#pragma once
// The backward's first GEMM in DeepSeek-V3's FP8 recipe: d_h = dy · W_down[e] under the
// block-scaled policy (dy's e4m3 rows scaled per 1 x 128 along D; W_down transposed to [L][I][D],
// e4m3 per 128 x 128 block: FP8 wgmma reads K-major operands only), with DownDgradSwigluGemm's
// SwiGLU backward + router-score epilogue over the policy's 128-column tiles (d_gate_up, g ·
// activation and the dL/dg partials as the bf16 GEMM stores them). Run by
// src/gemm/down_dgrad_swiglu_fp8.cu.
#include "device/gemm/gemm_policy.cuh"
#include "device/gemm/operand_loads.cuh"
#include "device/gemm/swiglu_backward_epilogue.cuh"

namespace caracal::gemm {

struct Fp8DownDgradSwigluGemm {
  using Policy = Fp8BlockScaledGemmPolicy;
  using OperandA = KMajorRows;
  using OperandB = KMajorWeights;
  using Epilogue = SwigluBackwardEpilogueOf<Policy::kBlockN>;
};

}  // namespace caracal::gemm
