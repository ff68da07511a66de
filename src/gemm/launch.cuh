#pragma once
// Host launch of one grouped-GEMM kernel instantiation.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "caracal/error.hpp"
#include "device/gemm/gemm_config.cuh"
#include "device/gemm/grouped_gemm_kernel.cuh"
#include "device/gemm/paired_gemm_kernel.cuh"
#include "device/gemm/tile_queue.cuh"
#include "gemm/host_checks.hpp"

namespace caracal::gemm {

// The kernel a Gemm runs as (instantiating only that one).
template <class Gemm>
auto grouped_gemm_kernel_of() {
  if constexpr (kRunsAsPairs<Gemm>) {
    return &paired_gemm_kernel<Gemm>;
  } else {
    return &grouped_gemm_kernel<Gemm>;
  }
}

// A row GEMM's kernel parameters: its descriptors' mainloop and tiles (forward_descriptors.cuh,
// backward_descriptors.cuh) with `epilogue`.
template <class Gemm, class Descriptors>
GemmParams<Gemm> params_of(const Descriptors& g, const typename Gemm::Epilogue::Params& epilogue) {
  GemmParams<Gemm> p{};
  p.mainloop = g.mainloop;
  p.scheduler = g.tiles;
  p.epilogue = epilogue;
  return p;
}

// Enqueues grouped_gemm_kernel<Gemm> with num_ctas persistent CTAs (0: one per SM), never more
// than the most tiles p can hold, or, for a Gemm that runs as CTA pairs, paired_gemm_kernel<Gemm>
// with that count rounded up to even (0: as many pairs as run at once); zeroes the tile queue's
// counter first where there is one. Throws caracal::Error naming `fn` if CUDA refuses.
template <class Gemm>
void launch_grouped_gemm(GemmParams<Gemm> const& p, int num_ctas, cudaStream_t stream, const char* fn) {
  constexpr bool kPairs = kRunsAsPairs<Gemm>;
  constexpr int kSmemBytes = gemm::kSmemBytes<typename Gemm::Policy>;
  auto* kernel = grouped_gemm_kernel_of<Gemm>();
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  CARACAL_CHECK(err == cudaSuccess, fn, ": cannot raise the shared-memory limit to ", kSmemBytes,
                " bytes: ", cudaGetErrorString(err));
  int grid = persistent_grid_size(num_ctas, Gemm::Scheduler::max_tiles(p.scheduler), fn);
  if constexpr (kPairs) {
    static_assert(kPairCtas == 2, "pair_cluster_attribute() launches clusters of two");
    if (num_ctas == 0) grid = std::min(grid, kPairCtas * max_active_pairs(reinterpret_cast<const void*>(kernel), kThreads, kSmemBytes, fn));
    grid = (grid + kPairCtas - 1) / kPairCtas * kPairCtas;
  }
  if constexpr (kTakesTileQueue<Gemm>) {
    uint32_t* const queue = p.scheduler.tile_queue;
    if (queue != nullptr) {
      CARACAL_CHECK(grid <= kTileQueueMaxCtas, fn, ": a tile_queue serves at most ", kTileQueueMaxCtas,
                    " CTAs, the launch has ", grid, " (num_ctas 0: one per SM)");
      err = cudaMemsetAsync(queue, 0, sizeof(uint32_t), stream);  // the counter; slots are written first
      CARACAL_CHECK(err == cudaSuccess, fn, ": cannot zero tile_queue: ", cudaGetErrorString(err));
    }
  }
  if constexpr (kPairs) {
    cudaLaunchAttribute cluster = pair_cluster_attribute();
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(unsigned(grid));
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = kSmemBytes;
    config.stream = stream;
    config.attrs = &cluster;
    config.numAttrs = 1;
    err = cudaLaunchKernelEx(&config, kernel, p);
    CARACAL_CHECK(err == cudaSuccess, fn, ": launch failed: ", cudaGetErrorString(err));
  } else {
    kernel<<<grid, kThreads, kSmemBytes, stream>>>(p);
  }
  err = cudaGetLastError();
  CARACAL_CHECK(err == cudaSuccess, fn, ": launch failed: ", cudaGetErrorString(err));
}

}  // namespace caracal::gemm
