#pragma once
// The forward's up/gate GEMM: gate_up = x · W_gate_up[e]^T over an expert's rows, A the rows
// [rows][D] and B the weights [L][2I][D] (rows interleaved or in [gate; up] halves, read through
// their view in the interleaved order), both K-major (K = D); the SwiGLU epilogue
// stores gate/up where the backward needs them and activation = SiLU(gate) * up, in bf16
// (swiglu_epilogue.cuh). The standalone kernel (src/gemm/up_gate_swiglu.cu) and the
// fused forward run this one definition, hence the same bits.
#include "device/gemm/gemm_policy.cuh"
#include "device/gemm/operand_loads.cuh"
#include "device/gemm/swiglu_epilogue.cuh"

namespace caracal::gemm {

struct UpGateSwigluGemm {
  using Policy = Bf16GemmPolicy;
  using OperandA = KMajorRows;
  using OperandB = KMajorGateUpWeights;
  using Epilogue = UpGateSwigluEpilogue;
};

}  // namespace caracal::gemm
