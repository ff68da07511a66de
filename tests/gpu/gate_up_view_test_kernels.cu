#include "gate_up_view_test_kernels.hpp"

#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>

#include "caracal/comm/cuda_check.hpp"
#include "device/gemm/expert_gemms/up_gate_swiglu.cuh"
#include "gemm/operand_maps.hpp"
#include "gemm/tensor_map.hpp"

namespace caracal::test {
namespace {

using Tile = gemm::UpGateSwigluGemm::Policy::B;  // the up/gate GEMM's weights: 256 rows x 64 columns
constexpr int kElements = Tile::kRows * Tile::kBlockK;
constexpr uint64_t kHint = uint64_t(cute::TMA::CacheHintSm90::EVICT_NORMAL);

struct Stages {
  alignas(1024) Tile::Element stage[3][kElements];
  alignas(8) uint64_t full[3];
};

__device__ bool bounded_wait(uint64_t* bar) {
  const long long start = clock64();
  while (!cutlass::arch::ClusterBarrier::test_wait(bar, 0, 1u)) {
    if (clock64() - start > (1ll << 31)) return false;
  }
  return true;
}

__global__ void load_stages_kernel(CUTE_GRID_CONSTANT const CUtensorMap map_3d,
                                   CUTE_GRID_CONSTANT const CUtensorMap view_interleaved,
                                   CUTE_GRID_CONSTANT const CUtensorMap view_halves, int k, int n0, int expert,
                                   uint16_t* out, int* done) {
  extern __shared__ uint8_t raw[];
  Stages& s = *reinterpret_cast<Stages*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  if (threadIdx.x == 0) {
    for (int i = 0; i < 3; ++i) cutlass::arch::ClusterTransactionBarrier::init(&s.full[i], 1);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int i = 0; i < 3; ++i) cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&s.full[i], Tile::kBytes);
    gemm::KMajorWeights::load<Tile>(&map_3d, &s.full[0], s.stage[0], n0, 0, k, expert);
    const int group = n0 / int(2 * gemm::kGateUpInterleave);
    cute::SM90_TMA_LOAD_5D::copy(&view_interleaved, &s.full[1], kHint, s.stage[1], k, 0, 0, group, expert);
    cute::SM90_TMA_LOAD_5D::copy(&view_halves, &s.full[2], kHint, s.stage[2], k, 0, 0, group, expert);
  }
  for (int i = 0; i < 3; ++i) {
    const bool ok = bounded_wait(&s.full[i]);
    if (threadIdx.x == 0) done[i] = ok;
  }
  __syncthreads();
  for (int i = 0; i < 3; ++i) {
    const uint16_t* from = reinterpret_cast<const uint16_t*>(s.stage[i]);
    for (int j = int(threadIdx.x); j < kElements; j += int(blockDim.x)) out[i * kElements + j] = from[j];
  }
}

}  // namespace

GateUpStages load_gate_up_stages(const __nv_bfloat16* interleaved, const __nv_bfloat16* halves, int experts,
                                 int intermediate, int hidden, int k, int n0, int expert) {
  const uint64_t L = uint64_t(experts), I = uint64_t(intermediate), D = uint64_t(hidden);
  constexpr uint32_t kGroups = Tile::kRows / (2 * gemm::kGateUpInterleave);
  const CUtensorMap map_3d = gemm::OperandMaps<gemm::KMajorWeights>::make_map<Tile>(interleaved, L, 2 * I, D, "3-D");
  const CUtensorMap view_interleaved = gemm::make_gate_up_view_map(interleaved, L, I, D, gemm::GateUpLayout::kInterleaved,
                                                                   kGroups, Tile::kBlockK, "view of interleaved rows");
  const CUtensorMap view_halves = gemm::make_gate_up_view_map(halves, L, I, D, gemm::GateUpLayout::kHalves, kGroups,
                                                              Tile::kBlockK, "view of halves");
  uint16_t* d_out = nullptr;
  int* d_done = nullptr;
  check_cuda(cudaMalloc(&d_out, 3 * kElements * 2), "cudaMalloc(out)");
  check_cuda(cudaMalloc(&d_done, 3 * sizeof(int)), "cudaMalloc(done)");
  check_cuda(cudaMemset(d_done, 0, 3 * sizeof(int)), "cudaMemset(done)");
  const int smem = int(sizeof(Stages)) + 1024;
  check_cuda(cudaFuncSetAttribute(load_stages_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "attribute");
  load_stages_kernel<<<1, 128, smem>>>(map_3d, view_interleaved, view_halves, k, n0, expert, d_out, d_done);
  check_cuda(cudaGetLastError(), "load_stages_kernel launch");
  check_cuda(cudaDeviceSynchronize(), "load_stages_kernel");
  GateUpStages out;
  std::vector<uint16_t> all(3 * size_t(kElements));
  int done[3] = {0, 0, 0};
  check_cuda(cudaMemcpy(all.data(), d_out, all.size() * 2, cudaMemcpyDeviceToHost), "cudaMemcpy(out)");
  check_cuda(cudaMemcpy(done, d_done, sizeof(done), cudaMemcpyDeviceToHost), "cudaMemcpy(done)");
  for (int i = 0; i < 3; ++i) {
    out.bytes[size_t(i)].assign(all.begin() + i * kElements, all.begin() + (i + 1) * kElements);
    out.done[size_t(i)] = done[i] != 0;
  }
  cudaFree(d_out);
  cudaFree(d_done);
  return out;
}

}  // namespace caracal::test
