#include "gather_test_kernels.hpp"

#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>

#include "caracal/comm/cuda_check.hpp"
#include "device/gemm/gathered_rows.cuh"
#include "gemm/tensor_map.hpp"

namespace caracal::test {
namespace {

using gemm::Element;
constexpr int kTileElements = gemm::kBlockM * gemm::kBlockK;
constexpr uint32_t kTileBytes = kTileElements * sizeof(Element);

struct Stages {
  alignas(1024) Element tma[kTileElements];
  alignas(1024) Element gathered[kTileElements];
  alignas(8) uint64_t tma_full;
  alignas(8) uint64_t gather_full;
};

// Waits for phase 0 of `bar` for at most ~2^31 clocks; false if it did not complete.
__device__ bool bounded_wait(uint64_t* bar) {
  const long long start = clock64();
  while (!cutlass::arch::ClusterBarrier::test_wait(bar, 0, 1u)) {
    if (clock64() - start > (1ll << 31)) return false;
  }
  return true;
}

__global__ void gather_stage_kernel(CUTE_GRID_CONSTANT const CUtensorMap expected_map,
                                    CUTE_GRID_CONSTANT const gemm::GatherMaps maps, const gemm::GatherRow* rows,
                                    int k_index, uint16_t* tma_out, uint16_t* gathered_out, int* done) {
  extern __shared__ uint8_t raw[];
  Stages& s = *reinterpret_cast<Stages*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  const int thread = static_cast<int>(threadIdx.x);
  if (thread == 0) {
    cutlass::arch::ClusterTransactionBarrier::init(&s.tma_full, 1);
    cutlass::arch::ClusterTransactionBarrier::init(&s.gather_full, 1 + gemm::kGatherArrivals);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  if (thread == gemm::kGatherThreads) {
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&s.tma_full, kTileBytes);
    cute::SM90_TMA_LOAD_2D::copy(&expected_map, &s.tma_full, gemm::kLoadCacheHint, s.tma, k_index, 0);
  }
  if (thread < gemm::kGatherThreads) {  // as the fused forward's producer warpgroup does it
    if (thread == 0) cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&s.gather_full, kTileBytes);
    gemm::gather_k_tile(maps, rows[thread], k_index, s.gathered, &s.gather_full, thread);
  }
  const bool tma_done = bounded_wait(&s.tma_full);
  const bool gather_done = bounded_wait(&s.gather_full);
  __syncthreads();
  if (thread == 0) {
    done[0] = tma_done;
    done[1] = gather_done;
  }
  const uint16_t* t = reinterpret_cast<const uint16_t*>(s.tma);
  const uint16_t* g = reinterpret_cast<const uint16_t*>(s.gathered);
  for (int i = thread; i < kTileElements; i += static_cast<int>(blockDim.x)) {
    tma_out[i] = t[i];
    gathered_out[i] = g[i];
  }
}

}  // namespace

GatheredStage gather_one_stage(const GatherTensors& tensors, const __nv_bfloat16* expected,
                               const std::vector<GatherSource>& sources, int k_index) {
  const uint64_t hidden = static_cast<uint64_t>(tensors.hidden);
  const uint64_t spacing_bytes = static_cast<uint64_t>(tensors.spacing) * sizeof(Element);
  const CUtensorMap map = gemm::make_tensor_map_2d(expected, gemm::kBlockM, hidden, gemm::kBlockM, gemm::kBlockK, "expected");
  gemm::GatherMaps maps{};
  maps.home_rows = gemm::make_tensor_map_3d(tensors.home, static_cast<uint64_t>(tensors.ranks),
                                            static_cast<uint64_t>(tensors.home_rows), hidden, 1, gemm::kBlockK,
                                            "home", spacing_bytes);
  maps.pulled_rows = gemm::make_tensor_map_3d(tensors.pulled, static_cast<uint64_t>(tensors.ranks),
                                              static_cast<uint64_t>(tensors.pulled_rows), hidden, 1, gemm::kBlockK,
                                              "pulled", spacing_bytes);
  maps.padding_row = tensors.home_rows;
  std::vector<gemm::GatherRow> rows(sources.size());
  for (size_t r = 0; r < sources.size(); ++r) {
    const GatherSource& src = sources[r];
    rows[r] = src.kind == GatherSource::kPadding ? gemm::GatherRow{false, maps.padding_row, 0}
                                                 : gemm::GatherRow{src.kind == GatherSource::kPulled, src.row, src.rank};
  }
  gemm::GatherRow* d_rows = nullptr;
  uint16_t *d_tma = nullptr, *d_gathered = nullptr;
  int* d_done = nullptr;
  check_cuda(cudaMalloc(&d_rows, rows.size() * sizeof(gemm::GatherRow)), "cudaMalloc(rows)");
  check_cuda(cudaMalloc(&d_tma, kTileBytes), "cudaMalloc(tma)");
  check_cuda(cudaMalloc(&d_gathered, kTileBytes), "cudaMalloc(gathered)");
  check_cuda(cudaMalloc(&d_done, 2 * sizeof(int)), "cudaMalloc(done)");
  check_cuda(cudaMemcpy(d_rows, rows.data(), rows.size() * sizeof(gemm::GatherRow), cudaMemcpyHostToDevice),
             "cudaMemcpy(rows)");
  check_cuda(cudaMemset(d_done, 0, 2 * sizeof(int)), "cudaMemset(done)");
  const int smem = static_cast<int>(sizeof(Stages)) + 1024;
  check_cuda(cudaFuncSetAttribute(gather_stage_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "attribute");
  gather_stage_kernel<<<1, gemm::kGatherThreads + 32, smem>>>(map, maps, d_rows, k_index, d_tma, d_gathered, d_done);
  check_cuda(cudaGetLastError(), "gather_stage_kernel launch");
  check_cuda(cudaDeviceSynchronize(), "gather_stage_kernel");
  GatheredStage out;
  out.tma.resize(kTileElements);
  out.gathered.resize(kTileElements);
  int done[2] = {0, 0};
  check_cuda(cudaMemcpy(out.tma.data(), d_tma, kTileBytes, cudaMemcpyDeviceToHost), "cudaMemcpy(tma)");
  check_cuda(cudaMemcpy(out.gathered.data(), d_gathered, kTileBytes, cudaMemcpyDeviceToHost), "cudaMemcpy(gathered)");
  check_cuda(cudaMemcpy(done, d_done, sizeof(done), cudaMemcpyDeviceToHost), "cudaMemcpy(done)");
  out.tma_done = done[0] != 0;
  out.gather_done = done[1] != 0;
  cudaFree(d_rows);
  cudaFree(d_tma);
  cudaFree(d_gathered);
  cudaFree(d_done);
  return out;
}

}  // namespace caracal::test
