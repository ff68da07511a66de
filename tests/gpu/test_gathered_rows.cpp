// The gathered operands (src/device/gemm/gathered_rows.cuh) on their own: a k tile gathered from
// scattered rows (some zero-filled) lands in shared memory byte for byte as the TMA lays out the
// same rows, and its stage barrier completes (bounded wait: a barrier that never completes fails
// the test instead of hanging it). K-major (the fused forward's A) and MN-major (the weight
// gradients' x). Fresh random rows every run.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <vector>

#include "caracal/comm/cuda_check.hpp"
#include "gather_test_kernels.hpp"
#include "gpu_test_util.hpp"

namespace caracal::test {
namespace {

// `rows` random finite bf16 rows of `cols` and a tile's `tile_rows` sources among them (-1 where
// `empty(r)`: zero-filled), on the device, with the rows the tile should hold.
struct GatherCase {
  std::vector<int> source;
  __nv_bfloat16* matrix = nullptr;
  __nv_bfloat16* expected = nullptr;

  GatherCase(int rows, int cols, int tile_rows, const std::function<bool(int)>& empty) : source(size_t(tile_rows)) {
    std::mt19937 rng(std::random_device{}());
    std::vector<uint16_t> m(size_t(rows) * cols);
    for (uint16_t& v : m) v = static_cast<uint16_t>(rng() & 0x7f7fu);  // finite bf16 bits
    std::uniform_int_distribution<int> pick(0, rows - 1);
    std::vector<uint16_t> e(size_t(tile_rows) * cols, 0);
    for (int r = 0; r < tile_rows; ++r) {
      source[size_t(r)] = empty(r) ? -1 : pick(rng);
      if (source[size_t(r)] < 0) continue;
      for (int c = 0; c < cols; ++c) e[size_t(r) * cols + c] = m[size_t(source[size_t(r)]) * cols + c];
    }
    check_cuda(cudaMalloc(&matrix, m.size() * 2), "cudaMalloc(matrix)");
    check_cuda(cudaMalloc(&expected, e.size() * 2), "cudaMalloc(expected)");
    check_cuda(cudaMemcpy(matrix, m.data(), m.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy(matrix)");
    check_cuda(cudaMemcpy(expected, e.data(), e.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy(expected)");
  }
  ~GatherCase() {
    cudaFree(matrix);
    cudaFree(expected);
  }
};

void expect_same_stage(const GatheredStage& s) {
  EXPECT_TRUE(s.tma_done) << "the TMA stage's barrier did not complete";
  EXPECT_TRUE(s.gather_done) << "the gathered stage's barrier did not complete";
  size_t differ = 0;
  for (size_t i = 0; i < s.tma.size(); ++i) differ += s.tma[i] != s.gathered[i];
  EXPECT_EQ(differ, 0u) << "elements where the gathered stage differs from the TMA's";
}

TEST(GatheredRows, KTilesMatchTheTmaLayout) {
  CARACAL_REQUIRE_GPU();
  constexpr int kHidden = 256;
  const GatherCase c(300, kHidden, 128, [](int r) { return r % 9 == 4 || r >= 120; });
  for (int k_index = 0; k_index < kHidden; k_index += 64) {
    SCOPED_TRACE(k_index);
    expect_same_stage(gather_one_stage(c.matrix, c.expected, c.source, kHidden, k_index));
  }
}

// Every 256-column tile of 64 token rows, the last reaching past the columns (its boxes read the
// last 64 columns, as the TMA's loads do).
TEST(GatheredRows, MnMajorKTilesMatchTheTmaLayout) {
  CARACAL_REQUIRE_GPU();
  constexpr int kCols = 448;
  const GatherCase c(300, kCols, 64, [](int r) { return r % 7 == 3 || r >= 60; });
  for (int mn = 0; mn < kCols; mn += 256) {
    SCOPED_TRACE(mn);
    expect_same_stage(gather_one_mn_stage(c.matrix, c.expected, c.source, kCols, mn));
  }
}

}  // namespace
}  // namespace caracal::test
