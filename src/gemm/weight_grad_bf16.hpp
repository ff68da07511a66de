#pragma once
// The bf16 weight-gradient kernel (weight_grad_bf16.cu), launched by grouped_weight_grads
// (weight_grad.cu) with its parameters built: p.epilogue.grad the bf16
// [num_experts * grad_rows][grad_cols] gradient map. Both weight-gradient kernels take the same
// parameters.
#include <cuda_runtime.h>

#include <cstdint>

#include "device/gemm/grouped_gemm_kernel.cuh"
#include "device/gemm/weight_grad_epilogue.cuh"
#include "device/gemm/weight_tile_scheduler.cuh"

namespace caracal::gemm {

using WeightGradParams = KernelParams<WeightTileScheduler::Params, WeightGradEpilogueParams>;

void launch_weight_grad_bf16(WeightGradParams const& p, int num_ctas, cudaStream_t stream);

}  // namespace caracal::gemm
