#pragma once
// The dx GEMM of gate_up_dgrad.cuh (the same operands), each dx row stored into its route's slot
// on its home rank instead (reverse dispatch's push, home_slots_epilogue.cuh). The standalone
// kernel (src/gemm/gate_up_dgrad_to_home.cu) and the fused backward's routed experts run this one
// definition, hence the same bits.
#include "device/gemm/expert_gemms/gate_up_dgrad.cuh"
#include "device/gemm/home_slots_epilogue.cuh"

namespace caracal::gemm {

struct GateUpDgradToHomeGemm : GateUpDgradGemm {
  using Epilogue = HomeSlotsEpilogue;
};

}  // namespace caracal::gemm
