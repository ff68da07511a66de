#include "layer/shared_rows.hpp"

#include <algorithm>
#include <cstdint>

#include "caracal/comm/cuda_check.hpp"

namespace caracal::layer {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;  // grid-stride loops beyond this
constexpr int kBf16PerVector = 8;

int blocks_for(int64_t items) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((items + kThreads - 1) / kThreads, kMaxBlocks)));
}

__global__ void shared_gates_kernel(const float* scale, int tokens, float* gates) {
  for (int t = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); t < tokens;
       t += static_cast<int>(gridDim.x * blockDim.x)) {
    gates[t] = scale != nullptr ? scale[t] : 1.0f;
  }
}

// One thread per 16-byte vector of 8 bf16.
__global__ void scale_rows_kernel(const uint4* in, const float* scale, int64_t vectors, int vectors_per_row,
                                  uint4* out) {
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < vectors;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float c = scale[v / vectors_per_row];
    uint4 packed = in[v];
    __nv_bfloat162* pairs = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
    for (int i = 0; i < kBf16PerVector / 2; ++i) {
      const float2 value = __bfloat1622float2(pairs[i]);
      pairs[i] = __floats2bfloat162_rn(__fmul_rn(c, value.x), __fmul_rn(c, value.y));
    }
    out[v] = packed;
  }
}

}  // namespace

void write_shared_gates(const float* scale, int tokens, float* gates, cudaStream_t stream) {
  shared_gates_kernel<<<blocks_for(tokens), kThreads, 0, stream>>>(scale, tokens, gates);
  check_cuda(cudaGetLastError(), "MoELayer: shared gates kernel launch");
}

void scale_rows(const __nv_bfloat16* in, const float* scale, int tokens, int hidden, __nv_bfloat16* out,
                cudaStream_t stream) {
  const int vectors_per_row = hidden / kBf16PerVector;
  const int64_t vectors = static_cast<int64_t>(tokens) * vectors_per_row;
  scale_rows_kernel<<<blocks_for(vectors), kThreads, 0, stream>>>(reinterpret_cast<const uint4*>(in), scale, vectors,
                                                                  vectors_per_row, reinterpret_cast<uint4*>(out));
  check_cuda(cudaGetLastError(), "MoELayer: shared output scale kernel launch");
}

}  // namespace caracal::layer
