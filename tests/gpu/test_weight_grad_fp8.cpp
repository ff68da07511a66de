// Tests of the weight gradients in FP8 (caracal/gemm/grouped_gemm_backward_fp8.hpp,
// grouped_weight_grads(Fp8WeightGradArgs)).
//   GPU: fresh random normal rows (x, dy, d_gate_up, the scaled activation; zeros on padding rows),
//        each quantized down its columns on the host by the recipe's contract (caracal/block_fp8.hpp:
//        quantize_rows of the transposed rows, one scale per column and 128-row block), against the
//        fp64 sums of the dequantized operands' products per expert. Outputs poisoned first; experts
//        of 0, 1, 127-129 rows, tiny and odd counts, every row on one expert, several K blocks and N
//        tiles; an expert without rows gets exact zeros, a schedule without rows zeros everywhere;
//        bf16 gradients the fp32 ones rounded once, bit for bit; bitwise determinism across runs,
//        grid sizes and counts; a deliberate error caught.
//   Host: argument validation (no GPU needed).
#include <cmath>
#include <cstdint>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "caracal/bf16.hpp"
#include "caracal/block_fp8.hpp"
#include "caracal/gemm/grouped_gemm_backward_fp8.hpp"
#include "float_bits.hpp"
#include "gpu/fp8_test_support.hpp"
#include "gpu/gpu_test_util.hpp"
#include "gpu/grouped_gemm_test_support.hpp"

namespace {

using namespace caracal::test::gemm;
using caracal::gemm::Fp8ColumnOperand;
using caracal::gemm::Fp8WeightGradArgs;

// One expert's gradient against the fp64 sums of the dequantized operands (relative Frobenius):
// what is left is the tensor cores' accumulation within a 128-row block and the fp32 promotion
// across blocks. ~3x the largest measured on an H100 (2026-12-06, every case: 1.18-1.29e-4); an
// expert 0.5% off fails (CatchDeliberateErrors).
constexpr double kFp8WeightGradBound = 4e-4;

// Rows [capacity][K] quantized down their columns, in the kernel's layout: the row quantization
// of their transpose (fp8_test_support.hpp), codes_t [K][capacity], scales [capacity / 128][K],
// values [K][capacity] dequantized.
QuantizedRows quantize_columns_for_gemm(const std::vector<uint16_t>& rows_bits, size_t capacity, size_t k) {
  return quantize_rows_for_gemm(transposed(floats_of(rows_bits), 1, capacity, k), k, capacity);
}

// One case's operands (quantized on the host, uploaded), the reference and the outputs.
struct Problem : ExpertInputs {
  QuantizedRows x_q, dy_q, d_gate_up_q, activation_q;  // codes_t [K][capacity]
  DeviceQuantized d_x_q, d_dy_q, d_d_gate_up_q, d_activation_q;
  std::vector<double> ref_gate_up, ref_down;  // [L][2I][D] interleaved, [L][D][I]
  DeviceBuffer<float> d_w_gate_up, d_w_down;
  DeviceBuffer<uint16_t> d_w_gate_up_bf16, d_w_down_bf16;

  static Fp8ColumnOperand operand(const DeviceQuantized& q) { return {q.fp8(), q.scales.get()}; }
};

// grad[e][m][n] = sum over e's rows r of lhs[m][r] rhs[n][r] (both dequantized, [K][capacity]).
void reference_gradient(const Problem& p, const std::vector<double>& lhs, size_t m, const std::vector<double>& rhs,
                        size_t n, std::vector<double>& grad) {
  const size_t cap = size_t(p.rows.capacity);
  grad.assign(size_t(p.num_experts) * m * n, 0.0);
  for (size_t e = 0; e < size_t(p.num_experts); ++e) {
    const size_t begin = size_t(p.rows.offset[e]), end = begin + size_t(p.c.counts[e]);
    for (size_t i = 0; i < m; ++i) {
      const double* a = &lhs[i * cap];
      for (size_t j = 0; j < n; ++j) {
        const double* b = &rhs[j * cap];
        double acc = 0.0;
        for (size_t r = begin; r < end; ++r) acc += a[r] * b[r];
        grad[(e * m + i) * n + j] = acc;
      }
    }
  }
}

void make_problem(Problem& p, const Case& c) {
  std::mt19937_64 rng(p.seed.value());
  ASSERT_NO_FATAL_FAILURE(make_inputs(p, c, rng, Draw::kNormal));
  const size_t D = size_t(c.hidden), I = size_t(c.intermediate), L = size_t(p.num_experts);
  const size_t cap = size_t(p.rows.capacity);
  p.x_q = quantize_columns_for_gemm(p.x, cap, D);
  p.dy_q = quantize_columns_for_gemm(random_rows(c.counts, p.rows, D, rng, Draw::kNormal), cap, D);
  p.d_gate_up_q = quantize_columns_for_gemm(random_rows(c.counts, p.rows, 2 * I, rng, Draw::kNormal), cap, 2 * I);
  p.activation_q = quantize_columns_for_gemm(random_rows(c.counts, p.rows, I, rng, Draw::kNormal), cap, I);
  reference_gradient(p, p.d_gate_up_q.values, 2 * I, p.x_q.values, D, p.ref_gate_up);
  reference_gradient(p, p.dy_q.values, D, p.activation_q.values, I, p.ref_down);
  ASSERT_NO_FATAL_FAILURE(p.d_x_q.upload(p.x_q.codes, p.x_q.scales));
  ASSERT_NO_FATAL_FAILURE(p.d_dy_q.upload(p.dy_q.codes, p.dy_q.scales));
  ASSERT_NO_FATAL_FAILURE(p.d_d_gate_up_q.upload(p.d_gate_up_q.codes, p.d_gate_up_q.scales));
  ASSERT_NO_FATAL_FAILURE(p.d_activation_q.upload(p.activation_q.codes, p.activation_q.scales));
  ASSERT_NO_FATAL_FAILURE(p.d_w_gate_up.allocate(L * 2 * I * D));
  ASSERT_NO_FATAL_FAILURE(p.d_w_down.allocate(L * D * I));
  ASSERT_NO_FATAL_FAILURE(p.d_w_gate_up_bf16.allocate(L * 2 * I * D));
  ASSERT_NO_FATAL_FAILURE(p.d_w_down_bf16.allocate(L * D * I));
}

struct RunOptions {
  int num_ctas = 0;
  bool pass_counts = true;
  bool bf16 = false;  // bf16 gradients (d_w_*_bf16) instead of fp32
};

struct Outputs {
  std::vector<float> gate_up, down;        // fp32 gradients
  std::vector<uint16_t> gate_up_bf16, down_bf16;  // bf16 ones (RunOptions::bf16)
};

Fp8WeightGradArgs weight_grad_args(const Problem& p, const RunOptions& o) {
  auto a = kernel_args<Fp8WeightGradArgs>(p.schedule(o.pass_counts), p.c.hidden, p.c.intermediate, o.num_ctas);
  a.x = Problem::operand(p.d_x_q);
  a.dy = Problem::operand(p.d_dy_q);
  a.d_gate_up = Problem::operand(p.d_d_gate_up_q);
  a.scaled_activation = Problem::operand(p.d_activation_q);
  if (o.bf16) {
    a.d_w_gate_up_bf16 = as_bf16(p.d_w_gate_up_bf16.get());
    a.d_w_down_bf16 = as_bf16(p.d_w_down_bf16.get());
  } else {
    a.d_w_gate_up = p.d_w_gate_up.get();
    a.d_w_down = p.d_w_down.get();
  }
  return a;
}

// Poisons both gradients of the asked dtype, runs, downloads them.
void run_weight_grads(Problem& p, const RunOptions& o, Outputs& out) {
  if (o.bf16) {
    ASSERT_NO_FATAL_FAILURE(p.d_w_gate_up_bf16.poison());
    ASSERT_NO_FATAL_FAILURE(p.d_w_down_bf16.poison());
  } else {
    ASSERT_NO_FATAL_FAILURE(p.d_w_gate_up.poison());
    ASSERT_NO_FATAL_FAILURE(p.d_w_down.poison());
  }
  ASSERT_NO_THROW(caracal::gemm::grouped_weight_grads(weight_grad_args(p, o), nullptr));
  CARACAL_ASSERT_CUDA(cudaDeviceSynchronize());
  if (o.bf16) {
    ASSERT_NO_FATAL_FAILURE(p.d_w_gate_up_bf16.download(out.gate_up_bf16));
    ASSERT_NO_FATAL_FAILURE(p.d_w_down_bf16.download(out.down_bf16));
  } else {
    ASSERT_NO_FATAL_FAILURE(p.d_w_gate_up.download(out.gate_up));
    ASSERT_NO_FATAL_FAILURE(p.d_w_down.download(out.down));
  }
}

// Both gradients against the reference, an expert a row (test::OutputError: relative Frobenius of
// each expert within kFp8WeightGradBound, every element written, an expert without rows exactly
// zero). What is out of bounds (empty: nothing); `report` prints the measured errors.
std::vector<std::string> all_failures(const Problem& p, const Outputs& out, bool report) {
  const size_t D = size_t(p.c.hidden), I = size_t(p.c.intermediate), L = size_t(p.num_experts);
  constexpr caracal::test::ErrorBound kBound{kFp8WeightGradBound, kFp8WeightGradBound};
  std::vector<std::string> f = caracal::test::compare_rows(
      "dW_gate_up", [&](size_t i) { return double(out.gate_up[i]); }, p.ref_gate_up, L, 2 * I * D, kBound, report);
  caracal::test::append(f, caracal::test::compare_rows("dW_down", [&](size_t i) { return double(out.down[i]); },
                                                       p.ref_down, L, D * I, kBound, report));
  return f;
}

std::vector<Case> reference_cases() {
  return {
      {"edge_counts", 256, 128, kEdgeCounts},
      {"tiny_and_odd", 256, 128, {1, 2, 3, 0, 5, 131}},
      {"all_to_one", 256, 256, {0, 0, 517, 0, 0}},
      // D = 384, I = 256: three M and N blocks of the gradients, 2I = 512 four.
      {"three_blocks", 384, 256, {200, 0, 77, 129}},
      {"odd_blocks", 640, 384, {130, 60, 1}},
      {"routed", 512, 256, routed_counts(caracal::RoutingKind::kUniform, 2, 333, 4, 16, 1, 11)},
      // 1,100 rows of one expert: nine 128-row K blocks, each promoted with its own scales.
      {"long_k", 256, 128, {1100, 40}},
  };
}

// ---- GPU tests ----------------------------------------------------------------------------------

class Fp8WeightGradReference : public ::testing::TestWithParam<Case> {};

TEST_P(Fp8WeightGradReference, MatchesFp64OfTheDequantizedOperands) {
  CARACAL_REQUIRE_GPU();
  Problem p;
  ASSERT_NO_FATAL_FAILURE(make_problem(p, GetParam()));
  for (bool counts : {true, false}) {
    SCOPED_TRACE(counts ? "with counts" : "without counts");
    Outputs out;
    RunOptions o;
    o.pass_counts = counts;
    ASSERT_NO_FATAL_FAILURE(run_weight_grads(p, o, out));
    for (const std::string& f : all_failures(p, out, counts)) ADD_FAILURE() << f;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, Fp8WeightGradReference, ::testing::ValuesIn(reference_cases()), case_name);

// The bound catches one expert's gradient 0.5% off (of either gradient).
TEST(Fp8WeightGradChecks, CatchDeliberateErrors) {
  CARACAL_REQUIRE_GPU();
  Problem p;
  ASSERT_NO_FATAL_FAILURE(make_problem(p, kChecksCase));
  Outputs out;
  ASSERT_NO_FATAL_FAILURE(run_weight_grads(p, RunOptions{}, out));
  ASSERT_EQ(all_failures(p, out, false), std::vector<std::string>{}) << "the real gradients pass";
  const size_t D = size_t(p.c.hidden), I = size_t(p.c.intermediate), e = 7;  // 300 rows
  Outputs bad_gate_up = out;
  for (size_t i = e * 2 * I * D; i < (e + 1) * 2 * I * D; ++i) bad_gate_up.gate_up[i] *= 1.005f;
  EXPECT_NE(all_failures(p, bad_gate_up, false), std::vector<std::string>{}) << "dW_gate_up 0.5% off passed";
  Outputs bad_down = out;
  for (size_t i = e * D * I; i < (e + 1) * D * I; ++i) bad_down.down[i] *= 0.995f;
  EXPECT_NE(all_failures(p, bad_down, false), std::vector<std::string>{}) << "dW_down 0.5% off passed";
  Outputs nonzero = out;
  nonzero.down[0] = 1e-30f;  // expert 0 has no rows
  EXPECT_NE(all_failures(p, nonzero, false), std::vector<std::string>{}) << "a row-less expert's nonzero passed";
}

// bf16 gradients are the fp32 sums rounded once to nearest even, bit for bit (zeros for experts
// without rows, as in fp32).
TEST(Fp8WeightGradBf16, TheFp32SumsRoundedOnce) {
  CARACAL_REQUIRE_GPU();
  Problem p;
  ASSERT_NO_FATAL_FAILURE(make_problem(p, kChecksCase));
  Outputs f32, bf16;
  ASSERT_NO_FATAL_FAILURE(run_weight_grads(p, RunOptions{}, f32));
  RunOptions o;
  o.bf16 = true;
  ASSERT_NO_FATAL_FAILURE(run_weight_grads(p, o, bf16));
  const auto rounded = [](const std::vector<float>& v) {
    std::vector<uint16_t> bits(v.size());
    for (size_t i = 0; i < v.size(); ++i) bits[i] = caracal::bf16_bits(v[i]);
    return bits;
  };
  EXPECT_TRUE(same_bits(rounded(f32.gate_up), bf16.gate_up_bf16)) << "dW_gate_up in bf16 is not the fp32 one rounded";
  EXPECT_TRUE(same_bits(rounded(f32.down), bf16.down_bf16)) << "dW_down in bf16 is not the fp32 one rounded";
}

// Each gradient tile has one owner and a fixed K order: nothing may depend on the run, the grid
// size or the counts.
TEST(Fp8WeightGradDeterminism, BitwiseAcrossRunsGridSizesAndCounts) {
  CARACAL_REQUIRE_GPU();
  Problem p;
  ASSERT_NO_FATAL_FAILURE(make_problem(p, kDeterminismCase));
  Outputs first;
  ASSERT_NO_FATAL_FAILURE(run_weight_grads(p, RunOptions{}, first));
  for (int num_ctas : {1, 7, 0}) {
    for (bool counts : {true, false}) {
      SCOPED_TRACE("num_ctas " + std::to_string(num_ctas) + (counts ? ", counts" : ", no counts"));
      RunOptions o;
      o.num_ctas = num_ctas;
      o.pass_counts = counts;
      Outputs again;
      ASSERT_NO_FATAL_FAILURE(run_weight_grads(p, o, again));
      EXPECT_TRUE(same_bits(first.gate_up, again.gate_up)) << "dW_gate_up differs";
      EXPECT_TRUE(same_bits(first.down, again.down)) << "dW_down differs";
    }
  }
}

// All experts empty, and a schedule without row buffers: every gradient is exactly +0.
TEST(Fp8WeightGradEmpty, GradientsOfNoRowsAreZero) {
  CARACAL_REQUIRE_GPU();
  Problem p;
  ASSERT_NO_FATAL_FAILURE(make_problem(p, kEmptyCase));
  Outputs out;
  ASSERT_NO_FATAL_FAILURE(run_weight_grads(p, RunOptions{}, out));
  const auto not_plus_zero = [](const Outputs& o) {
    size_t n = 0;
    for (const auto* v : {&o.gate_up, &o.down}) {
      for (float x : *v) n += caracal::float_bits(x) != 0;
    }
    return n;
  };
  EXPECT_EQ(not_plus_zero(out), 0u) << "gradients of empty experts must be +0";

  Fp8WeightGradArgs a = weight_grad_args(p, RunOptions{});
  a.rows.row_capacity = 0;
  a.x = a.dy = a.d_gate_up = a.scaled_activation = Fp8ColumnOperand{};
  ASSERT_NO_FATAL_FAILURE(p.d_w_gate_up.poison());
  ASSERT_NO_FATAL_FAILURE(p.d_w_down.poison());
  ASSERT_NO_THROW(caracal::gemm::grouped_weight_grads(a, nullptr));
  CARACAL_ASSERT_CUDA(cudaDeviceSynchronize());
  ASSERT_NO_FATAL_FAILURE(p.d_w_gate_up.download(out.gate_up));
  ASSERT_NO_FATAL_FAILURE(p.d_w_down.download(out.down));
  EXPECT_EQ(not_plus_zero(out), 0u) << "gradients without row buffers must be +0";
}

// ---- Host: argument checks ------------------------------------------------------------------------

Fp8WeightGradArgs valid_args() {
  auto a = kernel_args<Fp8WeightGradArgs>(fake_rows(), 256, 128);
  a.x = {fake_ptr<const __nv_fp8_e4m3>(), fake_ptr<const float>(1 << 12)};
  a.dy = {fake_ptr<const __nv_fp8_e4m3>(1 << 13), fake_ptr<const float>(1 << 14)};
  a.d_gate_up = {fake_ptr<const __nv_fp8_e4m3>(1 << 15), fake_ptr<const float>(1 << 16)};
  a.scaled_activation = {fake_ptr<const __nv_fp8_e4m3>(1 << 17), fake_ptr<const float>(1 << 18)};
  a.d_w_gate_up = fake_ptr<float>(1 << 19);
  a.d_w_down = fake_ptr<float>(1 << 20);
  return a;
}

TEST(Fp8WeightGradArgs, RejectBadArguments) {
  const auto with = calls_with(valid_args(), &caracal::gemm::grouped_weight_grads);
  expect_error(with([](auto& a) { a.hidden = 192; }),
               {"grouped_weight_grads (fp8)", "hidden (D)", "multiple of 128", "192"});
  expect_error(with([](auto& a) { a.intermediate = 64; }), {"intermediate (I)", "multiple of 128", "64"});
  expect_error(with([](auto& a) { a.rows.row_capacity = 100; }), {"rows.row_capacity", "100"});
  expect_error(with([](auto& a) { a.rows.first_row = 128; }),
               {"whole schedule", "rows.ring_rows, rows.first_row and rows.end_row must be 0", "128"});
  expect_error(with([](auto& a) { a.rows.end_row = 512; }), {"rows.end_row must be 0", "512"});
  expect_error(with([](auto& a) {
                 a.rows.ring_rows = 512;
                 a.rows.end_row = 512;  // a valid window of a ring: still not the whole schedule
               }),
               {"whole schedule", "rows.ring_rows", "512"});
  expect_error(with([](auto& a) { a.x.codes_t = nullptr; }), {"x.codes_t", "null"});
  expect_error(with([](auto& a) { a.dy.scales = fake_ptr<const float>(4); }), {"dy.scales", "16-byte"});
  expect_error(with([](auto& a) { a.d_gate_up.scales = nullptr; }), {"d_gate_up.scales", "null"});
  expect_error(with([](auto& a) { a.scaled_activation.codes_t = fake_ptr<const __nv_fp8_e4m3>(8); }),
               {"scaled_activation.codes_t", "16-byte"});
  expect_error(with([](auto& a) { a.d_w_gate_up = nullptr; }), {"exactly one of d_w_gate_up", "null for both"});
  expect_error(with([](auto& a) { a.d_w_down_bf16 = fake_ptr(1 << 21); }), {"exactly one of d_w_down", "both"});
  expect_error(with([](auto& a) { a.d_w_down = fake_ptr<float>(4); }), {"d_w_down", "16-byte"});
  expect_error(with([](auto& a) { a.num_ctas = -1; }), {"num_ctas", "-1"});
}

}  // namespace
