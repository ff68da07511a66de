#pragma once
// The FP8 dx GEMM of gate_up_dgrad_fp8.cuh (the same operands), each dx row stored into its route's
// slot on its home rank instead (home_slots_epilogue.cuh), as gate_up_dgrad_to_home.cuh does in
// bf16: the fused FP8 backward's routed experts (src/fused/backward_fp8.cu) run it.
#include "device/gemm/expert_gemms/gate_up_dgrad_fp8.cuh"
#include "device/gemm/home_slots_epilogue.cuh"

namespace caracal::gemm {

struct Fp8GateUpDgradToHomeGemm : Fp8GateUpDgradGemm {
  using Epilogue = HomeSlotsEpilogue;
};

}  // namespace caracal::gemm
