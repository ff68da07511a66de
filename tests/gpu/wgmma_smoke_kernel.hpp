#pragma once
// The toolchain's bring-up test (test_gpu_wgmma_smoke): a deliberately small Hopper GEMM that proves the CUTLASS/CuTe toolchain end to end: TMA loads
// into 128B-swizzled shared memory, wgmma through CuTe's SM90 GMMA atoms, fp32 accumulators
// written straight to global memory. It is the seed of the grouped-GEMM engine, not a fast path.
//
// This header stays free of CuTe so plain host code (tests, tools) can include it.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace caracal::test {

// CTA tile of wgmma_smoke_gemm; M, N and K must be positive multiples of these.
inline constexpr int kWgmmaSmokeTileM = 128;
inline constexpr int kWgmmaSmokeTileN = 128;
inline constexpr int kWgmmaSmokeTileK = 64;

// C = A * B^T on the device, in fp32 with fp32 accumulation:
//   A: [M, K] bf16 row-major (A[m * K + k]),
//   B: [N, K] bf16 row-major (B[n * K + k]), i.e. both operands K-major,
//   C: [M, N] fp32 row-major (C[m * N + n]), fully overwritten.
// All three pointers must be device memory aligned to 16 bytes (TMA needs it of A and B).
// Returns cudaErrorInvalidValue, without launching, when a size is not a positive multiple of its
// tile (or N / 128 exceeds the grid's y limit, 65535) or a pointer is null or misaligned;
// otherwise enqueues one kernel on `stream` (no synchronisation) and returns cudaGetLastError().
// Needs an sm_90 device.
cudaError_t wgmma_smoke_gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, float* C, int M, int N,
                             int K, cudaStream_t stream);

}  // namespace caracal::test
