#pragma once
// The FP8 dx GEMM of gate_up_dgrad_fp8.cuh in the dgrad's 128 x 128 tiles (the same operands and
// bits), each dx row stored into its route's slot on its home rank instead (home_slots_epilogue.cuh),
// as gate_up_dgrad_to_home.cuh does in bf16: the fused FP8 backward's routed experts
// (src/fused/backward_fp8.cu) run it.
#include "device/gemm/expert_gemms/gate_up_dgrad_fp8.cuh"
#include "device/gemm/home_slots_epilogue.cuh"

namespace caracal::gemm {

struct Fp8GateUpDgradNarrowToHomeGemm : Fp8GateUpDgradNarrowGemm {
  using Epilogue = HomeSlotsEpilogue;
};

}  // namespace caracal::gemm
