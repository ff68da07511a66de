#pragma once
// The FP8 up/gate of up_gate_swiglu_fp8.cuh with x read where the tokens are (a world of one rank:
// no dispatch_fp8 first): its A gathered by the producer warpgroup (gathered_fp8_rows.cuh), which
// needs more registers than a TMA producer: producer 72, consumers 216 (within the launch's pool,
// checked_register_split). Run by src/gemm/up_gate_swiglu_fp8_gathered.cu.
#include "device/gemm/expert_gemms/up_gate_swiglu_fp8.cuh"
#include "device/gemm/gathered_fp8_rows.cuh"

namespace caracal::gemm {

struct Fp8UpGateSwigluGatheredGemm : Fp8UpGateSwigluGemm {
  using OperandA = GatheredKMajorFp8Rows;
  static constexpr RegisterSplit kRegisterSplit{72, 216};
};

}  // namespace caracal::gemm
