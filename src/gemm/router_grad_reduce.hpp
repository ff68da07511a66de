#pragma once
// The fixed-order pass that finishes the router-score gradient: dg[r] = sum over n of
// partials[r][n] (the SwiGLU backward epilogue's per-N-tile dot products), n = 0, 1, ... in that
// order, for every schedule row of `rows`'s window [first_row, end_row) below expert_offset[L]
// (both arrays are per schedule row, whatever the ring); other rows are untouched.
#include <cuda_runtime.h>

#include <cstdint>

#include "caracal/schedule_view.hpp"

namespace caracal::gemm {

void reduce_router_grad(const float* partials, int n_blocks, const ScheduleView& rows, float* dg,
                        cudaStream_t stream, const char* fn);

}  // namespace caracal::gemm
