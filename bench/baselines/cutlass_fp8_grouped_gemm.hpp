#pragma once
// CUTLASS's own SM90 FP8 grouped GEMM with blockwise scaling (its example 68's
// KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise: 128 x 128 x 128 tiles, clusters of 1 x 2,
// scales of 1 x 128 blocks of A and 128 x 128 blocks of B, promoted per K block), as the baseline
// of Caracal's FP8 grouped GEMMs: per group g, D_g = A_g · B_g^T with
//   A_g = rows [row_begin[g], row_begin[g] + rows[g]) of a   ([*][K] e4m3, K contiguous),
//   B_g = b + g * N * K                                      ([N][K] e4m3, an expert's weights),
//   D_g = the same rows of d                                 ([*][N] bf16),
// and CUTLASS's scale layouts, which are per group (so the scales are given as its own copies):
//   sfa_g = sfa + sfa_offset[g]:  [ceil(K/128)][rows[g]]     (MN-major, the group's rows only)
//   sfb_g = sfb + g * ceil(K/128) * ceil(N/128):  [ceil(K/128)][ceil(N/128)]
// fp32 accumulation, rounded once to bf16. One kernel instantiation (cutlass_fp8_grouped_gemm.cu).
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "cutlass_grouped_gemm_runner.hpp"

namespace caracal::bench {

struct CutlassFp8GroupedProblem {
  std::vector<int64_t> row_begin;   // [groups]
  std::vector<int64_t> rows;        // [groups] (0: the group is skipped)
  std::vector<int64_t> sfa_offset;  // [groups] floats into sfa
  int n = 0;
  int k = 0;
  const __nv_fp8_e4m3* a = nullptr;
  const __nv_fp8_e4m3* b = nullptr;
  const float* sfa = nullptr;
  const float* sfb = nullptr;
  __nv_bfloat16* d = nullptr;
};

// Sets up the arguments and workspace (allocates, copies to the device, synchronizes). Throws
// caracal::Error if CUTLASS cannot implement the problem.
std::unique_ptr<CutlassGroupedGemm> make_cutlass_fp8_blockwise(const CutlassFp8GroupedProblem& problem);

}  // namespace caracal::bench
