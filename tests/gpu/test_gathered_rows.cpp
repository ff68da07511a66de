// The gathered A operand (src/device/gemm/gathered_rows.cuh) on its own: a k tile gathered from
// scattered rows (some zero-filled) lands in shared memory byte for byte as the TMA lays out the
// same rows, and its stage barrier completes (bounded wait: a barrier that never completes fails
// the test instead of hanging it). Fresh random rows every run.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "caracal/comm/cuda_check.hpp"
#include "gather_test_kernels.hpp"
#include "gpu_test_util.hpp"

namespace caracal::test {
namespace {

TEST(GatheredRows, KTilesMatchTheTmaLayout) {
  CARACAL_REQUIRE_GPU();
  constexpr int kRows = 300, kHidden = 256;
  std::mt19937 rng(std::random_device{}());
  std::vector<uint16_t> matrix(size_t(kRows) * kHidden);
  for (uint16_t& v : matrix) v = static_cast<uint16_t>(rng() & 0x7f7fu);  // finite bf16 bits
  std::vector<int> source(128);
  std::uniform_int_distribution<int> pick(0, kRows - 1);
  for (int r = 0; r < 128; ++r) source[size_t(r)] = (r % 9 == 4 || r >= 120) ? -1 : pick(rng);
  std::vector<uint16_t> expected(size_t(128) * kHidden, 0);
  for (int r = 0; r < 128; ++r) {
    if (source[size_t(r)] < 0) continue;
    for (int c = 0; c < kHidden; ++c) expected[size_t(r) * kHidden + c] = matrix[size_t(source[size_t(r)]) * kHidden + c];
  }
  __nv_bfloat16 *d_matrix = nullptr, *d_expected = nullptr;
  check_cuda(cudaMalloc(&d_matrix, matrix.size() * 2), "cudaMalloc(matrix)");
  check_cuda(cudaMalloc(&d_expected, expected.size() * 2), "cudaMalloc(expected)");
  check_cuda(cudaMemcpy(d_matrix, matrix.data(), matrix.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy(matrix)");
  check_cuda(cudaMemcpy(d_expected, expected.data(), expected.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy(expected)");
  for (int k_index = 0; k_index < kHidden; k_index += 64) {
    SCOPED_TRACE(k_index);
    const GatheredStage s = gather_one_stage(d_matrix, d_expected, source, kHidden, k_index);
    EXPECT_TRUE(s.tma_done) << "the TMA stage's barrier did not complete";
    EXPECT_TRUE(s.gather_done) << "the gathered stage's barrier did not complete";
    size_t differ = 0;
    for (size_t i = 0; i < s.tma.size(); ++i) differ += s.tma[i] != s.gathered[i];
    EXPECT_EQ(differ, 0u) << "elements where the gathered stage differs from the TMA's";
  }
  cudaFree(d_matrix);
  cudaFree(d_expected);
}

}  // namespace
}  // namespace caracal::test
