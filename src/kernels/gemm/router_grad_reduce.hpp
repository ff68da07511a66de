#pragma once
// The fixed-order pass that finishes the router-score gradient: dg[r] = sum over n of
// partials[r][n] (the SwiGLU backward epilogue's per-N-tile dot products), n = 0, 1, ... in that
// order, for every row below min(expert_offset[L], row_capacity); rows past it are untouched.
#include <cuda_runtime.h>

#include <cstdint>

namespace caracal::kernels::gemm {

void reduce_router_grad(const float* partials, int n_blocks, const int32_t* expert_offset,
                        int num_experts, int row_capacity, float* dg, cudaStream_t stream,
                        const char* fn);

}  // namespace caracal::kernels::gemm
