#pragma once
// Host launch of one grouped-GEMM kernel instantiation.
#include <cuda_runtime.h>

#include <cstdint>

#include "caracal/error.hpp"
#include "kernels/gemm/gemm_config.cuh"
#include "kernels/gemm/grouped_gemm_kernel.cuh"
#include "kernels/gemm/host_checks.hpp"

namespace caracal::kernels::gemm {

// Enqueues grouped_gemm_kernel<Gemm> with num_ctas persistent CTAs (0: one per SM), never more
// than `max_tiles`, the most tiles p can hold. Throws caracal::Error naming `fn` if CUDA refuses.
template <class Gemm>
void launch_grouped_gemm(Params const& p, int64_t max_tiles, int num_ctas, cudaStream_t stream,
                         const char* fn) {
  auto* kernel = &grouped_gemm_kernel<Gemm>;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  CARACAL_CHECK(err == cudaSuccess, fn, ": cannot raise the shared-memory limit to ", kSmemBytes,
                " bytes: ", cudaGetErrorString(err));
  int const grid = persistent_grid_size(num_ctas, max_tiles, fn);
  kernel<<<grid, kThreads, kSmemBytes, stream>>>(p);
  err = cudaGetLastError();
  CARACAL_CHECK(err == cudaSuccess, fn, ": launch failed: ", cudaGetErrorString(err));
}

// The Params fields every grouped GEMM takes from its ExpertRows: where each expert's rows start
// (and how many are real), how many experts, the row buffers' capacity in M blocks.
inline void set_expert_rows(Params& p, ExpertRows const& rows) {
  p.expert_offset = rows.expert_offset;
  p.expert_count = rows.expert_count;
  p.num_experts = rows.num_experts;
  p.capacity_blocks = rows.row_capacity / kBlockM;
}

// The row-tile count bound of a GEMM over the row buffers with N = p.n_blocks blocks.
inline int64_t max_row_tiles(Params const& p) { return int64_t(p.capacity_blocks) * p.n_blocks; }

}  // namespace caracal::kernels::gemm
