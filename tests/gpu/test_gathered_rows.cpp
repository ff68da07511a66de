// The gathered A operand (src/device/gemm/gathered_rows.cuh) on its own: a k tile gathered row by
// row with one TMA box a row, from two ranks' home rows and pulled rows (3-D maps over ranks lying
// a heap's spacing apart) with padding rows among them, lands in shared memory byte for byte as one
// TMA box of the same rows laid contiguously, and its stage barrier completes (bounded wait: a
// barrier that never completes fails the test instead of hanging it). Fresh random rows every run.
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
  constexpr int kRanks = 2, kHomeRows = 300, kPulledRows = 200, kHidden = 256;
  constexpr int64_t kSpacing = int64_t(kHomeRows) * kHidden + 64;  // elements between ranks, as a heap's
  std::mt19937 rng(std::random_device{}());
  std::vector<uint16_t> home(size_t(kRanks * kSpacing)), pulled(size_t(kRanks * kSpacing));
  for (uint16_t& v : home) v = static_cast<uint16_t>(rng() & 0x7f7fu);  // finite bf16 bits
  for (uint16_t& v : pulled) v = static_cast<uint16_t>(rng() & 0x7f7fu);
  std::vector<GatherSource> sources(128);
  std::uniform_int_distribution<int> pick_rank(0, kRanks - 1), pick_home(0, kHomeRows - 1), pick_pulled(0, kPulledRows - 1);
  for (int r = 0; r < 128; ++r) {
    GatherSource& s = sources[size_t(r)];
    if (r % 9 == 4 || r >= 120) continue;  // padding
    s.rank = pick_rank(rng);
    s.kind = r % 3 == 0 ? GatherSource::kPulled : GatherSource::kHome;
    s.row = s.kind == GatherSource::kPulled ? pick_pulled(rng) : pick_home(rng);
  }
  std::vector<uint16_t> expected(size_t(128) * kHidden, 0);
  for (int r = 0; r < 128; ++r) {
    const GatherSource& s = sources[size_t(r)];
    if (s.kind == GatherSource::kPadding) continue;
    const std::vector<uint16_t>& from = s.kind == GatherSource::kPulled ? pulled : home;
    const size_t first = size_t(s.rank * kSpacing + int64_t(s.row) * kHidden);
    for (int c = 0; c < kHidden; ++c) expected[size_t(r) * kHidden + c] = from[first + size_t(c)];
  }
  __nv_bfloat16 *d_home = nullptr, *d_pulled = nullptr, *d_expected = nullptr;
  check_cuda(cudaMalloc(&d_home, home.size() * 2), "cudaMalloc(home)");
  check_cuda(cudaMalloc(&d_pulled, pulled.size() * 2), "cudaMalloc(pulled)");
  check_cuda(cudaMalloc(&d_expected, expected.size() * 2), "cudaMalloc(expected)");
  check_cuda(cudaMemcpy(d_home, home.data(), home.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy(home)");
  check_cuda(cudaMemcpy(d_pulled, pulled.data(), pulled.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy(pulled)");
  check_cuda(cudaMemcpy(d_expected, expected.data(), expected.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy(expected)");
  const GatherTensors tensors{d_home, kHomeRows, d_pulled, kPulledRows, kRanks, kSpacing, kHidden};
  for (int k_index = 0; k_index < kHidden; k_index += 64) {
    SCOPED_TRACE(k_index);
    const GatheredStage s = gather_one_stage(tensors, d_expected, sources, k_index);
    EXPECT_TRUE(s.tma_done) << "the TMA stage's barrier did not complete";
    EXPECT_TRUE(s.gather_done) << "the gathered stage's barrier did not complete";
    size_t differ = 0;
    for (size_t i = 0; i < s.tma.size(); ++i) differ += s.tma[i] != s.gathered[i];
    EXPECT_EQ(differ, 0u) << "elements where the gathered stage differs from the TMA's";
  }
  cudaFree(d_home);
  cudaFree(d_pulled);
  cudaFree(d_expected);
}

}  // namespace
}  // namespace caracal::test
