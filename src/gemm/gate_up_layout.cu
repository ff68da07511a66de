// Builds the interleaved up/gate weights [L][2I][D] from W_gate and W_up [L][I][D] on the device
// (layout: gate_up_row in caracal/gemm/grouped_gemm.hpp). A plain copy kernel, 16 bytes a
// thread; no CuTe.
#include <cuda_runtime.h>

#include <cstdint>

#include "caracal/error.hpp"
#include "caracal/gemm/grouped_gemm.hpp"

namespace caracal::gemm {
namespace {

// One thread per 16-byte vector of the output.
__global__ void interleave_gate_up_kernel(const uint4* gate, const uint4* up, uint4* out,
                                          int64_t total_vectors, int vectors_per_row,
                                          int intermediate) {
  int64_t const stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < total_vectors; v += stride) {
    int64_t const out_row = v / vectors_per_row;  // over L * 2I
    int const col = int(v % vectors_per_row);
    int64_t const expert = out_row / (2 * intermediate);
    int const q = int(out_row % (2 * intermediate));
    int const group = q / (2 * kGateUpInterleave);
    int const within = q % (2 * kGateUpInterleave);
    bool const is_up = within >= kGateUpInterleave;
    int const j = group * kGateUpInterleave + within % kGateUpInterleave;
    const uint4* src = is_up ? up : gate;
    out[v] = src[(expert * intermediate + j) * vectors_per_row + col];
  }
}

}  // namespace

void interleave_gate_up_weights(const __nv_bfloat16* w_gate, const __nv_bfloat16* w_up,
                                __nv_bfloat16* w_gate_up, int num_experts, int intermediate,
                                int hidden, cudaStream_t stream) {
  const char* fn = "interleave_gate_up_weights";
  CARACAL_CHECK(num_experts >= 1, fn, ": num_experts must be >= 1, got ", num_experts);
  CARACAL_CHECK(intermediate > 0 && intermediate % kGateUpInterleave == 0, fn,
                ": intermediate (I) must be a positive multiple of ", kGateUpInterleave, ", got ",
                intermediate);
  CARACAL_CHECK(hidden > 0 && hidden % 8 == 0, fn,
                ": hidden (D) must be a positive multiple of 8, got ", hidden);
  const void* ptrs[3] = {w_gate, w_up, w_gate_up};
  const char* names[3] = {"w_gate", "w_up", "w_gate_up"};
  for (int k = 0; k < 3; ++k) {
    CARACAL_CHECK(ptrs[k] != nullptr && reinterpret_cast<uintptr_t>(ptrs[k]) % 16 == 0, fn, ": ",
                  names[k], " must be a non-null 16-byte aligned device pointer, got ", ptrs[k]);
  }

  int const vectors_per_row = hidden / 8;
  int64_t const total = int64_t(num_experts) * 2 * intermediate * vectors_per_row;
  int const threads = 256;
  int64_t const blocks = (total + threads - 1) / threads;
  interleave_gate_up_kernel<<<unsigned(blocks < 65535 * 32 ? blocks : 65535 * 32), threads, 0,
                              stream>>>(
      reinterpret_cast<const uint4*>(w_gate), reinterpret_cast<const uint4*>(w_up),
      reinterpret_cast<uint4*>(w_gate_up), total, vectors_per_row, intermediate);
  cudaError_t const err = cudaGetLastError();
  CARACAL_CHECK(err == cudaSuccess, fn, ": launch failed: ", cudaGetErrorString(err));
}

}  // namespace caracal::gemm
