#include "gather_test_kernels.hpp"

#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>

#include "caracal/comm/cuda_check.hpp"
#include "device/gemm/expert_gemms/up_gate_swiglu.cuh"
#include "device/gemm/gathered_rows.cuh"
#include "gemm/tensor_map.hpp"

namespace caracal::test {
namespace {

// The A operand the fused forward gathers: its up/gate GEMM's.
using Tile = gemm::UpGateSwigluGemm::Policy::A;
using Element = Tile::Element;
constexpr int kTileElements = Tile::kRows * Tile::kBlockK;

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

__global__ void gather_stage_kernel(CUTE_GRID_CONSTANT const CUtensorMap expected_map, const __nv_bfloat16* matrix,
                                    const int* source, int hidden, int k_index, uint16_t* tma_out,
                                    uint16_t* gathered_out, int* done) {
  extern __shared__ uint8_t raw[];
  Stages& s = *reinterpret_cast<Stages*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  if (threadIdx.x == 0) {
    cutlass::arch::ClusterTransactionBarrier::init(&s.tma_full, 1);
    cutlass::arch::ClusterTransactionBarrier::init(&s.gather_full, 1 + gemm::kGatherArrivals);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  if (warp == 4 && lane == 0) {
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&s.tma_full, kTileElements * 2);
    cute::SM90_TMA_LOAD_2D::copy(&expected_map, &s.tma_full, uint64_t(cute::TMA::CacheHintSm90::EVICT_NORMAL),
                                 s.tma, k_index, 0);
  }
  const int thread = static_cast<int>(threadIdx.x);
  if (thread < gemm::kGatherThreads) {  // as the fused forward's producer warpgroup does it
    gemm::GatherRows rows;
    for (int j = 0; j < gemm::kGatherRowsPerThread; ++j) {
      const int r = gemm::gather_row(thread, j);
      rows.src[j] = source[r] >= 0 ? matrix + static_cast<int64_t>(source[r]) * hidden : nullptr;
    }
    gemm::gather_k_tile<Tile>(rows, matrix, k_index, s.gathered, &s.gather_full, thread);
    if (thread == 0) cutlass::arch::ClusterBarrier::arrive(&s.gather_full);  // the producer's own arrival
  }
  const bool tma_done = bounded_wait(&s.tma_full);
  const bool gather_done = bounded_wait(&s.gather_full);
  gemm::gathered_stage_fence();
  __syncthreads();
  if (threadIdx.x == 0) {
    done[0] = tma_done;
    done[1] = gather_done;
  }
  const uint16_t* t = reinterpret_cast<const uint16_t*>(s.tma);
  const uint16_t* g = reinterpret_cast<const uint16_t*>(s.gathered);
  for (int i = static_cast<int>(threadIdx.x); i < kTileElements; i += static_cast<int>(blockDim.x)) {
    tma_out[i] = t[i];
    gathered_out[i] = g[i];
  }
}

}  // namespace

GatheredStage gather_one_stage(const __nv_bfloat16* matrix, const __nv_bfloat16* expected,
                               const std::vector<int>& source, int hidden, int k_index) {
  const CUtensorMap map = gemm::make_tensor_map_2d(expected, gemm::kBlockM, static_cast<uint64_t>(hidden),
                                                   Tile::kRows, Tile::kBlockK, "expected");
  int* d_source = nullptr;
  uint16_t *d_tma = nullptr, *d_gathered = nullptr;
  int* d_done = nullptr;
  check_cuda(cudaMalloc(&d_source, source.size() * sizeof(int)), "cudaMalloc(source)");
  check_cuda(cudaMalloc(&d_tma, kTileElements * 2), "cudaMalloc(tma)");
  check_cuda(cudaMalloc(&d_gathered, kTileElements * 2), "cudaMalloc(gathered)");
  check_cuda(cudaMalloc(&d_done, 2 * sizeof(int)), "cudaMalloc(done)");
  check_cuda(cudaMemcpy(d_source, source.data(), source.size() * sizeof(int), cudaMemcpyHostToDevice), "cudaMemcpy(source)");
  check_cuda(cudaMemset(d_done, 0, 2 * sizeof(int)), "cudaMemset(done)");
  const int smem = static_cast<int>(sizeof(Stages)) + 1024;
  check_cuda(cudaFuncSetAttribute(gather_stage_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "attribute");
  gather_stage_kernel<<<1, gemm::kGatherThreads + 32, smem>>>(map, matrix, d_source, hidden, k_index, d_tma, d_gathered, d_done);
  check_cuda(cudaGetLastError(), "gather_stage_kernel launch");
  check_cuda(cudaDeviceSynchronize(), "gather_stage_kernel");
  GatheredStage out;
  out.tma.resize(kTileElements);
  out.gathered.resize(kTileElements);
  int done[2] = {0, 0};
  check_cuda(cudaMemcpy(out.tma.data(), d_tma, kTileElements * 2, cudaMemcpyDeviceToHost), "cudaMemcpy(tma)");
  check_cuda(cudaMemcpy(out.gathered.data(), d_gathered, kTileElements * 2, cudaMemcpyDeviceToHost), "cudaMemcpy(gathered)");
  check_cuda(cudaMemcpy(done, d_done, sizeof(done), cudaMemcpyDeviceToHost), "cudaMemcpy(done)");
  out.tma_done = done[0] != 0;
  out.gather_done = done[1] != 0;
  cudaFree(d_source);
  cudaFree(d_tma);
  cudaFree(d_gathered);
  cudaFree(d_done);
  return out;
}

}  // namespace caracal::test
