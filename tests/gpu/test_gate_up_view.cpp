// The gate/up weights' 5-D view (gemm/tensor_map.hpp, make_gate_up_view_map) on its own: the
// up/gate GEMM's B stage loaded through the view lands in shared memory byte for byte as today's
// 3-D map lands it, whether memory holds the rows interleaved (Caracal's layout) or as [gate; up]
// halves (Hugging Face's gate_up_proj): the layout the kernels could then read in place. Fresh
// random weights every run; the halves read as if interleaved must differ (the check can fail).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/gemm/grouped_gemm.hpp"
#include "gate_up_view_test_kernels.hpp"
#include "gpu_test_util.hpp"

namespace caracal::test {
namespace {

size_t differing(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

TEST(GateUpView, LandsAsTheInterleavedStageFromEitherLayout) {
  CARACAL_REQUIRE_GPU();
  constexpr int kExperts = 3, kI = 256, kD = 192;
  const size_t rows = size_t(2 * kI), count = size_t(kExperts) * rows * kD;
  std::mt19937 rng(std::random_device{}());
  std::vector<uint16_t> interleaved(count), halves(count);
  for (uint16_t& v : interleaved) v = static_cast<uint16_t>(rng() & 0x7f7fu);  // finite bf16 bits
  for (int e = 0; e < kExperts; ++e) {
    for (int j = 0; j < kI; ++j) {
      for (int up = 0; up < 2; ++up) {
        const size_t from = (size_t(e) * rows + size_t(gemm::gate_up_row(j, up != 0))) * kD;
        const size_t to = (size_t(e) * rows + size_t(up * kI + j)) * kD;
        std::copy_n(interleaved.begin() + std::ptrdiff_t(from), kD, halves.begin() + std::ptrdiff_t(to));
      }
    }
  }
  __nv_bfloat16 *d_interleaved = nullptr, *d_halves = nullptr;
  check_cuda(cudaMalloc(&d_interleaved, count * 2), "cudaMalloc(interleaved)");
  check_cuda(cudaMalloc(&d_halves, count * 2), "cudaMalloc(halves)");
  check_cuda(cudaMemcpy(d_interleaved, interleaved.data(), count * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
  check_cuda(cudaMemcpy(d_halves, halves.data(), count * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
  for (int e : {0, kExperts - 1}) {
    for (int k : {0, kD - 64}) {
      for (int n0 : {0, 256}) {
        SCOPED_TRACE(testing::Message() << "expert " << e << ", k " << k << ", first row " << n0);
        const GateUpStages s = load_gate_up_stages(d_interleaved, d_halves, kExperts, kI, kD, k, n0, e);
        for (int i = 0; i < 3; ++i) EXPECT_TRUE(s.done[size_t(i)]) << "stage " << i << "'s barrier did not complete";
        EXPECT_EQ(differing(s.bytes[0], s.bytes[1]), 0u) << "the view over interleaved rows against the 3-D map";
        EXPECT_EQ(differing(s.bytes[0], s.bytes[2]), 0u) << "the view over [gate; up] halves against the 3-D map";
      }
    }
  }
  // The halves read as interleaved rows by the 3-D map: another stage.
  const GateUpStages swapped = load_gate_up_stages(d_halves, d_interleaved, kExperts, kI, kD, 0, 0, 0);
  EXPECT_GT(differing(swapped.bytes[0], swapped.bytes[2]), 0u) << "the layouts must differ for the check to mean anything";
  cudaFree(d_interleaved);
  cudaFree(d_halves);
}

}  // namespace
}  // namespace caracal::test
