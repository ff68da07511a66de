#pragma once
// The weight-gradient launches of grouped_weight_grads (weight_grad.cu: the fp32 kernel,
// weight_grad_bf16.cu: the bf16 one), built apart from their kernels so that a fused unit may run
// the same tiles with work of its own on the idle warps (src/fused/weight_grad_dx_sums.cuh).
#include <cuda_runtime.h>

#include <array>
#include <cstdint>

#include "caracal/gemm/grouped_gemm_backward.hpp"
#include "device/gemm/grouped_gemm_kernel.cuh"
#include "device/gemm/weight_grad_epilogue.cuh"
#include "device/gemm/weight_tile_scheduler.cuh"

namespace caracal::gemm {

using WeightGradParams = KernelParams<WeightTileParams, WeightGradEpilogueParams>;

// One weight-gradient launch: p.epilogue.grad is the [num_experts * grad_rows][grad_cols] gradient
// map, fp32 or (bf16) bf16 (dW_gate_up in [gate; up] halves: its gate/up view).
struct WeightGradLaunch {
  WeightGradParams params{};
  bool bf16 = false;
  int num_ctas = 0;
};

// grouped_weight_grads(args)'s launches, dW_gate_up's then dW_down's, for checked `args` with rows
// (rows.row_capacity > 0: without any, grouped_weight_grads zeroes the gradients instead).
std::array<WeightGradLaunch, 2> weight_grad_launches(const WeightGradArgs& args);

void launch_weight_grad(const WeightGradLaunch& launch, cudaStream_t stream);
void launch_weight_grad_bf16(WeightGradParams const& p, int num_ctas, cudaStream_t stream);

}  // namespace caracal::gemm
