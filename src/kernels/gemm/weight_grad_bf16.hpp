#pragma once
// The bf16 weight-gradient kernel (weight_grad_bf16.cu), launched by grouped_weight_grads
// (weight_grad.cu) with its parameters built: p.out the bf16 [num_experts * out_rows][out_cols]
// gradient map.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/gemm/gemm_config.cuh"

namespace caracal::kernels::gemm {

void launch_weight_grad_bf16(Params const& p, int64_t tiles, int num_ctas, cudaStream_t stream);

}  // namespace caracal::kernels::gemm
