#pragma once
// The backward's dx GEMM: dx = d_gate · W_gate[e] + d_up · W_up[e] as one GEMM over K = 2I of the
// interleaved operands (the interleave permutes K in both, so the sum is unchanged): A d_gate_up
// [rows][2I] K-major, B W_gate_up [L][2I][D] MN-major through the gate/up view (either row order
// in memory, the same bits); dx's rows stored as they are in bf16 (bf16_epilogue.cuh). The standalone kernel (src/gemm/gate_up_dgrad.cu) and the
// fused backward's shared expert run this one definition; gate_up_dgrad_to_home.cuh stores the
// same rows home instead.
#include "device/gemm/bf16_epilogue.cuh"
#include "device/gemm/gemm_policy.cuh"
#include "device/gemm/operand_loads.cuh"

namespace caracal::gemm {

struct GateUpDgradGemm {
  using Policy = Bf16GemmPolicy;
  using OperandA = KMajorRows;
  using OperandB = MNMajorGateUpWeights;
  using Epilogue = RowsBf16Epilogue;
};

}  // namespace caracal::gemm
