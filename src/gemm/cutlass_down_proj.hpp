#pragma once
// The down projection on CUTLASS's SM90 grouped GEMM (down_proj_cutlass.cu): the kernel of
// grouped_down_proj's default engine (GemmEngine::kCutlass).
#include <cuda_runtime.h>

#include <cstddef>

#include "caracal/gemm/grouped_gemm.hpp"

namespace caracal::gemm {

// Device bytes the CUTLASS engine needs per call for `num_experts` experts: the per-expert problem
// shapes, operand pointers and strides it reads on the device, and CUTLASS's own workspace (TMA
// descriptors per SM, sized for up to kCutlassMaxSms SMs).
size_t cutlass_down_proj_workspace_bytes(int num_experts);

// Enqueues the down projection (arguments already checked, row_capacity > 0).
void cutlass_down_proj(const DownProjArgs& args, cudaStream_t stream);

}  // namespace caracal::gemm
