// GPU tests of the CuTe/wgmma smoke GEMM: accuracy against an fp64 host product of the same
// bf16 inputs, run-to-run bitwise determinism, and argument validation.
#include "gpu/wgmma_smoke_kernel.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "gpu/gpu_test_util.hpp"

namespace {

using caracal::test::wgmma_smoke_gemm;
using caracal::test::DeviceBuffer;
using caracal::test::TracedSeed;

struct GemmShape {
  int m, n, k;
};

std::string shape_name(const GemmShape& s) {
  return "m" + std::to_string(s.m) + "_n" + std::to_string(s.n) + "_k" + std::to_string(s.k);
}

void PrintTo(const GemmShape& s, std::ostream* os) { *os << shape_name(s); }

// Uniform values in [-1, 1], rounded to bf16.
std::vector<__nv_bfloat16> random_bf16(size_t count, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<__nv_bfloat16> v(count);
  for (auto& x : v) x = __float2bfloat16_rn(dist(rng));
  return v;
}

// C[m, n] = sum_k A[m, k] * B[n, k] in fp64: exact products of the bf16 inputs, accumulated in
// far more precision than the kernel's fp32.
std::vector<double> reference_gemm(const std::vector<__nv_bfloat16>& a,
                                   const std::vector<__nv_bfloat16>& b, const GemmShape& s) {
  const size_t M = size_t(s.m), N = size_t(s.n), K = size_t(s.k);
  std::vector<double> af(a.size()), bf(b.size());
  for (size_t i = 0; i < a.size(); ++i) af[i] = double(__bfloat162float(a[i]));
  for (size_t i = 0; i < b.size(); ++i) bf[i] = double(__bfloat162float(b[i]));
  std::vector<double> c(M * N);
  for (size_t m = 0; m < M; ++m) {
    const double* arow = &af[m * K];
    for (size_t n = 0; n < N; ++n) {
      const double* brow = &bf[n * K];
      double acc = 0.0;
      for (size_t k = 0; k < K; ++k) acc += arow[k] * brow[k];
      c[m * N + n] = acc;
    }
  }
  return c;
}

// Device copies of A and B and a C buffer for one problem.
struct Problem {
  GemmShape shape{};
  std::vector<__nv_bfloat16> a, b;
  DeviceBuffer<__nv_bfloat16> d_a, d_b;
  DeviceBuffer<float> d_c;
};

// Fills `p` with random bf16 operands for `shape` and uploads them.
void make_problem(Problem& p, const GemmShape& shape, uint64_t seed) {
  std::mt19937_64 rng(seed);
  p.shape = shape;
  const size_t M = size_t(shape.m), N = size_t(shape.n), K = size_t(shape.k);
  p.a = random_bf16(M * K, rng);
  p.b = random_bf16(N * K, rng);
  ASSERT_NO_FATAL_FAILURE(p.d_a.upload(p.a));
  ASSERT_NO_FATAL_FAILURE(p.d_b.upload(p.b));
  ASSERT_NO_FATAL_FAILURE(p.d_c.allocate(M * N));
}

// Poisons C with NaN (all-ones bytes), runs the kernel and downloads C.
void run_gemm(Problem& p, std::vector<float>& c) {
  ASSERT_NO_FATAL_FAILURE(p.d_c.poison());
  CARACAL_ASSERT_CUDA(wgmma_smoke_gemm(p.d_a.get(), p.d_b.get(), p.d_c.get(), p.shape.m, p.shape.n,
                                       p.shape.k, /*stream=*/nullptr));
  CARACAL_ASSERT_CUDA(cudaDeviceSynchronize());
  ASSERT_NO_FATAL_FAILURE(p.d_c.download(c));
}

// Every test of a shape runs on the GPU, on random operands from a fresh seed that its failures
// name.
class WgmmaSmoke : public ::testing::TestWithParam<GemmShape> {
 protected:
  void SetUp() override {
    CARACAL_REQUIRE_GPU();
    ASSERT_NO_FATAL_FAILURE(make_problem(p_, GetParam(), seed_.value()));
  }

  const TracedSeed seed_{"shape " + shape_name(GetParam()) + ", "};
  Problem p_;
};

TEST_P(WgmmaSmoke, MatchesFp64Reference) {
  const GemmShape shape = GetParam();
  std::vector<float> c;
  ASSERT_NO_FATAL_FAILURE(run_gemm(p_, c));
  const std::vector<double> ref = reference_gemm(p_.a, p_.b, shape);

  size_t nan_count = 0;
  size_t first_nan = 0;
  double err2 = 0.0, ref2 = 0.0;
  for (size_t i = 0; i < c.size(); ++i) {
    if (std::isnan(c[i])) {
      if (nan_count++ == 0) first_nan = i;
      continue;
    }
    const double d = double(c[i]) - ref[i];
    err2 += d * d;
    ref2 += ref[i] * ref[i];
  }
  ASSERT_EQ(nan_count, 0u) << "C still holds NaN (e.g. row " << first_nan / size_t(shape.n)
                           << ", col " << first_nan % size_t(shape.n) << ")";
  ASSERT_GT(ref2, 0.0);
  const double rel_err = std::sqrt(err2 / ref2);
  // Exact bf16 products accumulated in fp32: ~1e-7 at small K. Hopper's tensor cores round the
  // accumulator toward zero, a bias that grows with K (models of it give 3e-6 to 6e-6 at
  // K = 4096); a layout or synchronisation bug gives errors near 1.
  EXPECT_LE(rel_err, 1e-5) << "relative Frobenius error " << rel_err;
  std::cout << "relative Frobenius error (" << shape_name(shape) << "): " << rel_err << "\n";
}

TEST_P(WgmmaSmoke, BitwiseDeterministic) {
  std::vector<float> first, second;
  ASSERT_NO_FATAL_FAILURE(run_gemm(p_, first));
  ASSERT_NO_FATAL_FAILURE(run_gemm(p_, second));
  ASSERT_EQ(first.size(), second.size());
  EXPECT_EQ(std::memcmp(first.data(), second.data(), first.size() * sizeof(float)), 0)
      << "two runs on the same inputs differ";
}

INSTANTIATE_TEST_SUITE_P(Shapes, WgmmaSmoke,
                         ::testing::Values(GemmShape{128, 128, 64}, GemmShape{256, 384, 512},
                                           GemmShape{128, 256, 4096}),
                         [](const ::testing::TestParamInfo<GemmShape>& param_info) {
                           return shape_name(param_info.param);
                         });

TEST(WgmmaSmokeArgs, RejectsInvalidArguments) {
  CARACAL_REQUIRE_GPU();
  // Buffers big enough for every call below, so a launch that should not have happened would
  // write into C instead of faulting.
  constexpr int kMax = 512;
  DeviceBuffer<__nv_bfloat16> a, b;
  DeviceBuffer<float> c;
  ASSERT_NO_FATAL_FAILURE(a.allocate(size_t(kMax) * kMax));
  ASSERT_NO_FATAL_FAILURE(b.allocate(size_t(kMax) * kMax));
  ASSERT_NO_FATAL_FAILURE(c.allocate(size_t(kMax) * kMax));
  CARACAL_ASSERT_CUDA(cudaMemset(a.get(), 0, a.bytes()));
  CARACAL_ASSERT_CUDA(cudaMemset(b.get(), 0, b.bytes()));
  ASSERT_NO_FATAL_FAILURE(c.poison());

  const GemmShape bad_shapes[] = {
      {0, 128, 64},    {128, 0, 64},    {128, 128, 0},  {-128, 128, 64},
      {128, -128, 64}, {128, 128, -64}, {64, 128, 64},  {192, 128, 64},
      {128, 64, 64},   {128, 200, 64},  {128, 128, 32}, {128, 128, 96},
  };
  for (const GemmShape& s : bad_shapes) {
    SCOPED_TRACE("shape " + shape_name(s));
    EXPECT_EQ(wgmma_smoke_gemm(a.get(), b.get(), c.get(), s.m, s.n, s.k, nullptr),
              cudaErrorInvalidValue);
  }

  // Null or not 16-byte-aligned pointers (TMA needs 16-byte-aligned operands).
  EXPECT_EQ(wgmma_smoke_gemm(nullptr, b.get(), c.get(), 128, 128, 64, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(wgmma_smoke_gemm(a.get(), nullptr, c.get(), 128, 128, 64, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(wgmma_smoke_gemm(a.get(), b.get(), nullptr, 128, 128, 64, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(wgmma_smoke_gemm(a.get() + 1, b.get(), c.get(), 128, 128, 64, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(wgmma_smoke_gemm(a.get(), b.get() + 4, c.get(), 128, 128, 64, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(wgmma_smoke_gemm(a.get(), b.get(), c.get() + 1, 128, 128, 64, nullptr),
            cudaErrorInvalidValue);

  // Nothing was launched: no pending error, and C still holds its poison bytes.
  CARACAL_ASSERT_CUDA(cudaDeviceSynchronize());
  CARACAL_ASSERT_CUDA(cudaGetLastError());
  std::vector<uint32_t> host(size_t(kMax) * kMax);
  CARACAL_ASSERT_CUDA(cudaMemcpy(host.data(), c.get(), c.bytes(), cudaMemcpyDeviceToHost));
  size_t touched = 0;
  for (uint32_t bits : host) touched += bits != 0xFFFFFFFFu;
  EXPECT_EQ(touched, 0u) << "a rejected call wrote to C";
}

}  // namespace
