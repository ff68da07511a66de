#include "gather_test_kernels.hpp"

#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>

#include "caracal/comm/cuda_check.hpp"
#include "device/gemm/expert_gemms/up_gate_swiglu.cuh"
#include "device/gemm/expert_gemms/weight_grad.cuh"
#include "device/gemm/gathered_rows.cuh"
#include "gemm/operand_maps.hpp"

namespace caracal::test {
namespace {

// The fused forward's gathered A (K-major rows), the weight gradients' gatherable B (MN-major rows).
using KMajorTile = gemm::UpGateSwigluGemm::Policy::A;
using MnMajorTile = gemm::WeightGradGemm::Policy::B;
static_assert(std::is_same_v<gemm::WeightGradGemm::OperandB, gemm::MNMajorRows>);

template <class Tile>
struct Stages {
  static constexpr int kElements = Tile::kRows * Tile::kBlockK;
  alignas(1024) typename Tile::Element tma[kElements];
  alignas(1024) typename Tile::Element gathered[kElements];
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

// Threads [0, kGatherThreads) gather as a producer warpgroup does, the next warp's lane 0 loads by
// TMA. K-major: the k tile at column `at` of rows [0, 128); MN-major: columns [at, + kRows) of rows
// [0, 64) (the k tile), `cols` wide.
template <class Tile, bool kMnMajor>
__global__ void gather_stage_kernel(CUTE_GRID_CONSTANT const CUtensorMap expected_map, const __nv_bfloat16* matrix,
                                    const int* source, int cols, int at, uint16_t* tma_out, uint16_t* gathered_out,
                                    int* done) {
  using S = Stages<Tile>;
  extern __shared__ uint8_t raw[];
  S& s = *reinterpret_cast<S*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  const int thread = static_cast<int>(threadIdx.x);
  if (thread == 0) {
    cutlass::arch::ClusterTransactionBarrier::init(&s.tma_full, 1);
    cutlass::arch::ClusterTransactionBarrier::init(&s.gather_full, 1 + gemm::kGatherArrivals);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  if (thread == gemm::kGatherThreads) {
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&s.tma_full, Tile::kBytes);
    if constexpr (kMnMajor) {
      gemm::MNMajorRows::load<Tile>(&expected_map, &s.tma_full, s.tma, at, cols, 0, 0);
    } else {
      gemm::KMajorRows::load<Tile>(&expected_map, &s.tma_full, s.tma, 0, 0, at, 0);
    }
  }
  if (thread < gemm::kGatherThreads) {
    const auto row = [&](int r) { return source[r] >= 0 ? matrix + static_cast<int64_t>(source[r]) * cols : nullptr; };
    if constexpr (kMnMajor) {
      gemm::GatherMnRows rows;
      for (int i = 0; i < gemm::kGatherMnRowsPerThread; ++i) rows.src[i] = row(gemm::gather_mn_row(thread, i));
      gemm::gather_mn_k_tile<Tile>(rows, matrix, at, cols, s.gathered, &s.gather_full, thread);
    } else {
      gemm::GatherRows rows;
      for (int j = 0; j < gemm::kGatherRowsPerThread; ++j) rows.src[j] = row(gemm::gather_row(thread, j));
      gemm::gather_k_tile<Tile>(rows, matrix, at, s.gathered, &s.gather_full, thread);
    }
    if (thread == 0) cutlass::arch::ClusterBarrier::arrive(&s.gather_full);  // the producer's own arrival
  }
  const bool tma_done = bounded_wait(&s.tma_full);
  const bool gather_done = bounded_wait(&s.gather_full);
  gemm::gathered_stage_fence();
  __syncthreads();
  if (thread == 0) {
    done[0] = tma_done;
    done[1] = gather_done;
  }
  const uint16_t* t = reinterpret_cast<const uint16_t*>(s.tma);
  const uint16_t* g = reinterpret_cast<const uint16_t*>(s.gathered);
  for (int i = thread; i < S::kElements; i += static_cast<int>(blockDim.x)) {
    tma_out[i] = t[i];
    gathered_out[i] = g[i];
  }
}

template <class Tile, bool kMnMajor>
GatheredStage run_one_stage(const CUtensorMap& map, const __nv_bfloat16* matrix, const std::vector<int>& source,
                            int cols, int at) {
  constexpr int kElements = Stages<Tile>::kElements;
  int* d_source = nullptr;
  uint16_t *d_tma = nullptr, *d_gathered = nullptr;
  int* d_done = nullptr;
  check_cuda(cudaMalloc(&d_source, source.size() * sizeof(int)), "cudaMalloc(source)");
  check_cuda(cudaMalloc(&d_tma, kElements * 2), "cudaMalloc(tma)");
  check_cuda(cudaMalloc(&d_gathered, kElements * 2), "cudaMalloc(gathered)");
  check_cuda(cudaMalloc(&d_done, 2 * sizeof(int)), "cudaMalloc(done)");
  check_cuda(cudaMemcpy(d_source, source.data(), source.size() * sizeof(int), cudaMemcpyHostToDevice), "cudaMemcpy(source)");
  check_cuda(cudaMemset(d_done, 0, 2 * sizeof(int)), "cudaMemset(done)");
  const int smem = static_cast<int>(sizeof(Stages<Tile>)) + 1024;
  const auto kernel = gather_stage_kernel<Tile, kMnMajor>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "attribute");
  kernel<<<1, gemm::kGatherThreads + 32, smem>>>(map, matrix, d_source, cols, at, d_tma, d_gathered, d_done);
  check_cuda(cudaGetLastError(), "gather_stage_kernel launch");
  check_cuda(cudaDeviceSynchronize(), "gather_stage_kernel");
  GatheredStage out;
  out.tma.resize(kElements);
  out.gathered.resize(kElements);
  int done[2] = {0, 0};
  check_cuda(cudaMemcpy(out.tma.data(), d_tma, kElements * 2, cudaMemcpyDeviceToHost), "cudaMemcpy(tma)");
  check_cuda(cudaMemcpy(out.gathered.data(), d_gathered, kElements * 2, cudaMemcpyDeviceToHost), "cudaMemcpy(gathered)");
  check_cuda(cudaMemcpy(done, d_done, sizeof(done), cudaMemcpyDeviceToHost), "cudaMemcpy(done)");
  out.tma_done = done[0] != 0;
  out.gather_done = done[1] != 0;
  cudaFree(d_source);
  cudaFree(d_tma);
  cudaFree(d_gathered);
  cudaFree(d_done);
  return out;
}

}  // namespace

GatheredStage gather_one_stage(const __nv_bfloat16* matrix, const __nv_bfloat16* expected,
                               const std::vector<int>& source, int hidden, int k_index) {
  const CUtensorMap map = gemm::OperandMaps<gemm::KMajorRows>::make_map<KMajorTile>(
      expected, gemm::kBlockM, static_cast<uint64_t>(hidden), "expected");
  return run_one_stage<KMajorTile, false>(map, matrix, source, hidden, k_index);
}

GatheredStage gather_one_mn_stage(const __nv_bfloat16* matrix, const __nv_bfloat16* expected,
                                  const std::vector<int>& source, int cols, int mn) {
  const CUtensorMap map = gemm::OperandMaps<gemm::MNMajorRows>::make_map<MnMajorTile>(
      expected, MnMajorTile::kBlockK, static_cast<uint64_t>(cols), "expected");
  return run_one_stage<MnMajorTile, true>(map, matrix, source, cols, mn);
}

}  // namespace caracal::test
