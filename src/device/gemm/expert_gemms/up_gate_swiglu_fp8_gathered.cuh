#pragma once
// The FP8 up/gate of up_gate_swiglu_fp8.cuh with x read where the tokens are (a world of one rank:
// no dispatch_fp8 first): its A gathered by the producer warpgroup (gathered_fp8_rows.cuh), which
// takes the fused kernels' register split (producer 72, consumers 216: the wide FP8 mainloop ran as
// fast there, journal 2026-12-06). Run by src/gemm/up_gate_swiglu_fp8_gathered.cu.
#include "device/gemm/expert_gemms/up_gate_swiglu_fp8.cuh"
#include "device/gemm/gathered_fp8_rows.cuh"

namespace caracal::gemm {

struct Fp8UpGateSwigluGatheredGemm : Fp8UpGateSwigluGemm {
  using OperandA = GatheredKMajorFp8Rows;
  static constexpr RegisterSplit kRegisterSplit{72, 216};
};

}  // namespace caracal::gemm
