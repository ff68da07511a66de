#pragma once
// Host launch of one grouped-GEMM kernel instantiation.
#include <cuda_runtime.h>

#include <cstdint>

#include "caracal/error.hpp"
#include "device/gemm/gemm_config.cuh"
#include "device/gemm/grouped_gemm_kernel.cuh"
#include "device/gemm/tile_queue.cuh"
#include "gemm/host_checks.hpp"

namespace caracal::gemm {

// Enqueues grouped_gemm_kernel<Gemm> with num_ctas persistent CTAs (0: one per SM), never more
// than the most tiles p can hold; zeroes the tile queue's counter first where there is one. Throws
// caracal::Error naming `fn` if CUDA refuses.
template <class Gemm>
void launch_grouped_gemm(GemmParams<Gemm> const& p, int num_ctas, cudaStream_t stream, const char* fn) {
  auto* kernel = &grouped_gemm_kernel<Gemm>;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  CARACAL_CHECK(err == cudaSuccess, fn, ": cannot raise the shared-memory limit to ", kSmemBytes,
                " bytes: ", cudaGetErrorString(err));
  int const grid = persistent_grid_size(num_ctas, Gemm::Scheduler::max_tiles(p.scheduler), fn);
  if constexpr (kTakesTileQueue<Gemm>) {
    uint32_t* const queue = p.scheduler.tile_queue;
    if (queue != nullptr) {
      CARACAL_CHECK(grid <= kTileQueueMaxCtas, fn, ": a tile_queue serves at most ", kTileQueueMaxCtas,
                    " CTAs, the launch has ", grid, " (num_ctas 0: one per SM)");
      err = cudaMemsetAsync(queue, 0, sizeof(uint32_t), stream);  // the counter; slots are written first
      CARACAL_CHECK(err == cudaSuccess, fn, ": cannot zero tile_queue: ", cudaGetErrorString(err));
    }
  }
  kernel<<<grid, kThreads, kSmemBytes, stream>>>(p);
  err = cudaGetLastError();
  CARACAL_CHECK(err == cudaSuccess, fn, ": launch failed: ", cudaGetErrorString(err));
}

}  // namespace caracal::gemm
