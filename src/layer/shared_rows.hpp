#pragma once
// Small kernels around the shared expert's per-token output scale c_t. Each enqueues one kernel
// on `stream` and throws caracal::Error if the launch fails.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace caracal::layer {

// gates[t] = scale[t], or 1 where scale is null, for t < tokens: the shared expert's route weight.
void write_shared_gates(const float* scale, int tokens, float* gates, cudaStream_t stream);

// out[t][:] = bf16(scale[t] * in[t][:]) for t < tokens; rows of `hidden` bf16 values, a multiple
// of 8, both buffers 16-byte aligned.
void scale_rows(const __nv_bfloat16* in, const float* scale, int tokens, int hidden, __nv_bfloat16* out,
                cudaStream_t stream);

}  // namespace caracal::layer
