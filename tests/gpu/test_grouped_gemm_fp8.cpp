// Tests of the forward grouped GEMMs in FP8 (caracal/gemm/grouped_gemm_fp8.hpp).
//   GPU: fresh random bf16 inputs quantized on the host by the recipe's contract
//        (caracal/block_fp8.hpp: x per 1 x 128 block, weights per 128 x 128 block of the
//        interleaved [2I][D] and of [D][I]), against the fp64 GEMMs of the dequantized operands with
//        the bf16-rounding contract of the outputs (F1-F3); the down GEMM takes the reference's
//        activation quantized the same way, so each GEMM is checked on its own. Outputs poisoned
//        first; the e4m3 activation the up/gate epilogue stores is quantize_rows of its bf16 one,
//        bit for bit; experts of 0, 1, 63-65, 127-129 rows, partial N tiles, routed counts; bitwise
//        determinism across runs, grid sizes, counts and a tile queue; a deliberate error caught.
//   Host: argument validation (no GPU needed).
#include "caracal/gemm/grouped_gemm_fp8.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "caracal/bf16.hpp"
#include "caracal/block_fp8.hpp"
#include "gpu/fp8_test_support.hpp"
#include "gpu/gpu_test_util.hpp"
#include "gpu/grouped_gemm_test_support.hpp"

namespace {

using namespace caracal::test::gemm;
using caracal::gemm::Fp8DownProjArgs;
using caracal::gemm::Fp8UpGateSwigluArgs;
using caracal::gemm::gate_up_row;


// One case's quantized operands, the reference and the output buffers.
struct Problem : ExpertInputs {
  QuantizedRows xq, activation_q;
  QuantizedWeights w_gate_up_q, w_down_q;
  DeviceQuantized d_xq, d_activation_q, d_w_gate_up_q, d_w_down_q;
  DeviceBuffer<uint16_t> d_activation, d_gate_up, d_y;
  DeviceQuantized d_activation8;  // the up/gate epilogue's e4m3 activation
  std::vector<double> gate, up, hidden, y;  // reference, [capacity][I] and [capacity][D]
};


// gate, up, hidden from the dequantized x and W_gate_up; the activation quantized from the
// reference hidden; y from it and the dequantized W_down.
void reference_forward(Problem& p) {
  const size_t D = size_t(p.c.hidden), I = size_t(p.c.intermediate), cap = size_t(p.rows.capacity);
  p.gate = p.up = p.hidden = std::vector<double>(cap * I, 0.0);
  p.y.assign(cap * D, 0.0);
  for (size_t e = 0; e < size_t(p.num_experts); ++e) {
    const size_t begin = size_t(p.rows.offset[e]);
    for (size_t row = begin; row < begin + size_t(p.c.counts[e]); ++row) {
      const double* xr = &p.xq.values[row * D];
      for (size_t j = 0; j < I; ++j) {
        const double* g_row = &p.w_gate_up_q.values[(e * 2 * I + size_t(gate_up_row(int64_t(j), false))) * D];
        const double* u_row = &p.w_gate_up_q.values[(e * 2 * I + size_t(gate_up_row(int64_t(j), true))) * D];
        double g = 0.0, u = 0.0;
        for (size_t d = 0; d < D; ++d) {
          g += xr[d] * g_row[d];
          u += xr[d] * u_row[d];
        }
        p.gate[row * I + j] = g = caracal::round_to_bf16(g);
        p.up[row * I + j] = u = caracal::round_to_bf16(u);
        p.hidden[row * I + j] = caracal::round_to_bf16(silu(g) * u);
      }
    }
  }
  std::vector<float> hidden(p.hidden.begin(), p.hidden.end());
  p.activation_q = quantize_rows_for_gemm(hidden, cap, I);
  for (size_t e = 0; e < size_t(p.num_experts); ++e) {
    const size_t begin = size_t(p.rows.offset[e]);
    for (size_t row = begin; row < begin + size_t(p.c.counts[e]); ++row) {
      for (size_t d = 0; d < D; ++d) {
        const double* w_row = &p.w_down_q.values[(e * D + d) * I];
        double acc = 0.0;
        for (size_t j = 0; j < I; ++j) acc += p.activation_q.values[row * I + j] * w_row[j];
        p.y[row * D + d] = caracal::round_to_bf16(acc);
      }
    }
  }
}

void make_problem(Problem& p, const Case& c) {
  std::mt19937_64 rng(p.seed.value());
  ASSERT_NO_FATAL_FAILURE(make_inputs(p, c, rng));
  const size_t D = size_t(c.hidden), I = size_t(c.intermediate), L = size_t(p.num_experts);
  const size_t cap = size_t(p.rows.capacity);
  std::vector<uint16_t> w_gate_up(L * 2 * I * D);
  caracal::gemm::interleave_gate_up_weights_host(p.w_gate.data(), p.w_up.data(), w_gate_up.data(), int64_t(L),
                                                 int64_t(I), int64_t(D));
  p.xq = quantize_rows_for_gemm(floats_of(p.x), cap, D);
  p.w_gate_up_q = quantize_weights_for_gemm(floats_of(w_gate_up), L, 2 * I, D);
  p.w_down_q = quantize_weights_for_gemm(floats_of(p.w_down), L, D, I);
  reference_forward(p);
  ASSERT_NO_FATAL_FAILURE(p.d_xq.upload(p.xq.codes, p.xq.scales));
  ASSERT_NO_FATAL_FAILURE(p.d_activation_q.upload(p.activation_q.codes, p.activation_q.scales));
  ASSERT_NO_FATAL_FAILURE(p.d_w_gate_up_q.upload(p.w_gate_up_q.codes, p.w_gate_up_q.scales));
  ASSERT_NO_FATAL_FAILURE(p.d_w_down_q.upload(p.w_down_q.codes, p.w_down_q.scales));
  ASSERT_NO_FATAL_FAILURE(p.d_activation.allocate(cap * I));
  ASSERT_NO_FATAL_FAILURE(p.d_gate_up.allocate(cap * 2 * I));
  ASSERT_NO_FATAL_FAILURE(p.d_y.allocate(cap * D));
  ASSERT_NO_FATAL_FAILURE(p.d_activation8.codes.allocate(cap * I));
  ASSERT_NO_FATAL_FAILURE(p.d_activation8.scales.allocate(I / 128 * cap));
}

// x's real rows as the tokens' rows (Fp8UpGateSwigluArgs::x_tokens): each row's codes and scales at
// a token of its own, the tokens shuffled, routes of k = kGatherTopK naming them.
constexpr int kGatherTopK = 3;
struct TokenRows {
  std::vector<uint8_t> codes;   // [T][D]
  std::vector<float> scales;    // [D / 128][T]
  std::vector<int2> routes;     // [capacity]: {0, token * k + slot}, padding {-1, -1}
  int tokens = 0;
  DeviceQuantized d_rows;
  DeviceBuffer<int2> d_routes;
};

void make_token_rows(const Problem& p, TokenRows& t) {
  const size_t D = size_t(p.c.hidden), cap = size_t(p.rows.capacity), blocks = D / 128;
  std::vector<int> real;
  for (size_t e = 0; e < p.c.counts.size(); ++e) {
    for (int r = 0; r < p.c.counts[e]; ++r) real.push_back(p.rows.offset[e] + r);
  }
  t.tokens = std::max<int>(int(real.size()), 1);
  std::vector<int> token_of(real.size());
  std::iota(token_of.begin(), token_of.end(), 0);
  std::mt19937_64 rng(p.seed.value() + 1);
  std::shuffle(token_of.begin(), token_of.end(), rng);
  t.codes.assign(size_t(t.tokens) * D, 0);
  t.scales.assign(blocks * size_t(t.tokens), 0.0f);
  t.routes.assign(cap, int2{-1, -1});
  for (size_t i = 0; i < real.size(); ++i) {
    const size_t row = size_t(real[i]), token = size_t(token_of[i]);
    t.routes[row] = int2{0, int(token) * kGatherTopK + int(i % kGatherTopK)};
    std::copy_n(p.xq.codes.begin() + ptrdiff_t(row * D), D, t.codes.begin() + ptrdiff_t(token * D));
    for (size_t b = 0; b < blocks; ++b) t.scales[b * size_t(t.tokens) + token] = p.xq.scales[b * cap + row];
  }
  ASSERT_NO_FATAL_FAILURE(t.d_rows.upload(t.codes, t.scales));
  ASSERT_NO_FATAL_FAILURE(t.d_routes.upload(t.routes));
}

struct RunOptions {
  int num_ctas = 0;
  bool pass_counts = true;
  bool tile_queue = false;
  bool bf16_activation = true;  // activation_out given (the e4m3 activation always is)
  const TokenRows* gathered = nullptr;  // x gathered from these tokens' rows instead of its rows
};

struct Outputs {
  std::vector<uint16_t> hidden, gate_up, y;
  std::vector<uint8_t> hidden8;  // e4m3 codes [capacity][I]
  std::vector<float> hidden8_scales;  // [I / 128][capacity]
};

// Poisons the outputs, runs the up/gate GEMM on the quantized x and the down GEMM on the
// quantized reference activation, downloads everything.
void run_forward(Problem& p, const RunOptions& o, Outputs& out) {
  for (auto* b : {&p.d_activation, &p.d_gate_up, &p.d_y}) ASSERT_NO_FATAL_FAILURE(b->poison());
  ASSERT_NO_FATAL_FAILURE(p.d_activation8.codes.poison());
  ASSERT_NO_FATAL_FAILURE(p.d_activation8.scales.poison());
  const ScheduleView rows = p.schedule(o.pass_counts);
  DeviceBuffer<uint32_t> queue;
  if (o.tile_queue) {
    ASSERT_NO_FATAL_FAILURE(allocate_tile_queue(queue));
  }
  auto up = kernel_args<Fp8UpGateSwigluArgs>(rows, p.c.hidden, p.c.intermediate, o.num_ctas);
  up.x = {p.d_xq.fp8(), p.d_xq.scales.get()};
  if (o.gathered != nullptr) {
    up.rows.rows = o.gathered->d_routes.get();
    up.x = {};
    up.x_tokens = {o.gathered->d_rows.fp8(), o.gathered->d_rows.scales.get(), o.gathered->tokens};
    up.top_k = kGatherTopK;
  }
  up.w_gate_up = {p.d_w_gate_up_q.fp8(), p.d_w_gate_up_q.scales.get()};
  up.activation_out = o.bf16_activation ? as_bf16(p.d_activation.get()) : nullptr;
  up.activation_fp8_out = {reinterpret_cast<__nv_fp8_e4m3*>(p.d_activation8.codes.get()), p.d_activation8.scales.get()};
  up.gate_up_out = as_bf16(p.d_gate_up.get());
  up.tile_queue = o.tile_queue ? queue.get() : nullptr;
  ASSERT_NO_THROW(caracal::gemm::grouped_up_gate_swiglu(up, nullptr));
  auto down = kernel_args<Fp8DownProjArgs>(rows, p.c.hidden, p.c.intermediate, o.num_ctas);
  down.activation = {p.d_activation_q.fp8(), p.d_activation_q.scales.get()};
  down.w_down = {p.d_w_down_q.fp8(), p.d_w_down_q.scales.get()};
  down.y_out = as_bf16(p.d_y.get());
  down.tile_queue = up.tile_queue;  // one after the other on one stream
  ASSERT_NO_THROW(caracal::gemm::grouped_down_proj(down, nullptr));
  CARACAL_ASSERT_CUDA(cudaDeviceSynchronize());
  ASSERT_NO_FATAL_FAILURE(p.d_activation.download(out.hidden));
  ASSERT_NO_FATAL_FAILURE(p.d_gate_up.download(out.gate_up));
  ASSERT_NO_FATAL_FAILURE(p.d_y.download(out.y));
  ASSERT_NO_FATAL_FAILURE(p.d_activation8.codes.download(out.hidden8));
  ASSERT_NO_FATAL_FAILURE(p.d_activation8.scales.download(out.hidden8_scales));
}

// The e4m3 activation is the host contract's quantization of the bf16 one, bit for bit, on the rows
// below expert_offset[L] (the GEMM's tiles; padding rows zero codes under a zero block's scale).
void expect_quantized_activation(const Problem& p, const Outputs& out) {
  const size_t I = size_t(p.c.intermediate), cap = size_t(p.rows.capacity), written = size_t(p.rows.offset.back());
  const QuantizedRows want = quantize_rows_for_gemm(floats_of(out.hidden), cap, I);
  size_t codes = 0, scales = 0;
  for (size_t i = 0; i < written * I; ++i) codes += out.hidden8[i] != want.codes[i];
  for (size_t b = 0; b < I / 128; ++b) {
    for (size_t r = 0; r < written; ++r) {
      scales += std::memcmp(&out.hidden8_scales[b * cap + r], &want.scales[b * cap + r], sizeof(float)) != 0;
    }
  }
  EXPECT_EQ(codes, 0u) << "activation codes differ from quantize_rows of the bf16 activation";
  EXPECT_EQ(scales, 0u) << "activation scales differ from quantize_rows of the bf16 activation";
}

void check_against_reference(const Case& c, const RunOptions& o) {
  Problem p;
  ASSERT_NO_FATAL_FAILURE(make_problem(p, c));
  Outputs out;
  ASSERT_NO_FATAL_FAILURE(run_forward(p, o, out));
  const size_t D = size_t(c.hidden), I = size_t(c.intermediate);
  expect_half_close("gate", false, p.rows, c.counts, I, p.gate, out.gate_up, kFp8GateUpBound);
  expect_half_close("up", true, p.rows, c.counts, I, p.up, out.gate_up, kFp8GateUpBound);
  expect_close("hidden", p.rows, c.counts, I, p.hidden, out.hidden, kFp8HiddenBound);
  expect_close("y", p.rows, c.counts, D, p.y, out.y, kFp8DownBound);
  expect_padding("gate_up", p.rows, c.counts, 2 * I, out.gate_up);
  expect_padding("hidden", p.rows, c.counts, I, out.hidden);
  expect_padding("y", p.rows, c.counts, D, out.y);
  expect_quantized_activation(p, out);
}

std::vector<Case> reference_cases() {
  return {
      {"edge_counts", 256, 128, kEdgeCounts},
      // D = 384: three K blocks of the up/gate GEMM; the down GEMM's second 256-column tile ends
      // past D.
      {"three_blocks", 384, 128, {200, 0, 77, 129}},
      // D = 640: five blocks (W_down's scale rows padded from 5 to 32; the last tile half past D);
      // 2I = 768: three N tiles.
      {"odd_blocks", 640, 384, {130, 60, 1}},
      {"routed", 512, 256, routed_counts(caracal::RoutingKind::kUniform, 2, 333, 4, 16, 1, 11)},
      {"long_k", 2048, 128, {130, 60}},
  };
}

class GroupedGemmFp8Reference : public ::testing::TestWithParam<Case> {};

TEST_P(GroupedGemmFp8Reference, MatchesFp64OfTheDequantizedOperands) {
  CARACAL_REQUIRE_GPU();
  ASSERT_NO_FATAL_FAILURE(check_against_reference(GetParam(), RunOptions{}));
}

TEST_P(GroupedGemmFp8Reference, MatchesWithoutCountsAndWithATileQueue) {
  CARACAL_REQUIRE_GPU();
  RunOptions o;
  o.pass_counts = false;
  o.tile_queue = true;
  ASSERT_NO_FATAL_FAILURE(check_against_reference(GetParam(), o));
}

INSTANTIATE_TEST_SUITE_P(Cases, GroupedGemmFp8Reference, ::testing::ValuesIn(reference_cases()), case_name);

// The bounds catch an expert's y 0.5% off.
TEST(GroupedGemmFp8Checks, CatchDeliberateErrors) {
  CARACAL_REQUIRE_GPU();
  Problem p;
  ASSERT_NO_FATAL_FAILURE(make_problem(p, kChecksCase));
  Outputs out;
  ASSERT_NO_FATAL_FAILURE(run_forward(p, RunOptions{}, out));
  ASSERT_NO_FATAL_FAILURE(expect_catches_expert_off("y", p.rows, size_t(p.c.hidden), p.y, out.y, kFp8DownBound));
}

TEST(GroupedGemmFp8Determinism, BitwiseAcrossRunsGridSizesCountsAndATileQueue) {
  CARACAL_REQUIRE_GPU();
  Problem p;
  ASSERT_NO_FATAL_FAILURE(make_problem(p, {"determinism", 512, 256, {300, 0, 1, 129, 64, 250, 65, 128}}));
  Outputs first;
  ASSERT_NO_FATAL_FAILURE(run_forward(p, RunOptions{}, first));
  for (int num_ctas : {1, 7, 0}) {
    for (int variant = 0; variant < 4; ++variant) {
      SCOPED_TRACE("num_ctas " + std::to_string(num_ctas) + ", variant " + std::to_string(variant));
      RunOptions o;
      o.num_ctas = num_ctas;
      o.pass_counts = variant != 1;
      o.tile_queue = variant == 2;
      o.bf16_activation = variant != 3;  // the e4m3 activation alone
      Outputs again;
      ASSERT_NO_FATAL_FAILURE(run_forward(p, o, again));
      EXPECT_TRUE(same_bits(first.hidden8, again.hidden8)) << "e4m3 hidden differs";
      EXPECT_TRUE(same_bits(first.hidden8_scales, again.hidden8_scales)) << "hidden scales differ";
      if (!o.bf16_activation) continue;
      EXPECT_TRUE(same_bits(first.hidden, again.hidden)) << "hidden differs";
      EXPECT_TRUE(same_bits(first.gate_up, again.gate_up)) << "gate_up differs";
      EXPECT_TRUE(same_bits(first.y, again.y)) << "y differs";
    }
  }
}

// x gathered from the tokens' rows (Fp8UpGateSwigluArgs::x_tokens, a world of one rank): the same
// bits as x's rows dispatched (padding rows gathered as zero codes under zero scales), with and
// without counts, on 7 CTAs and with a tile queue, over the reference cases; one code of one token
// changed must change the outputs (the comparison can fail).
TEST(GroupedGemmFp8GatheredX, TokenRowsGiveTheDispatchedBits) {
  CARACAL_REQUIRE_GPU();
  bool checked_failure = false;
  for (const Case& c : reference_cases()) {
    for (const int variant : {0, 1, 2, 3}) {
      SCOPED_TRACE("case " + c.name + ", variant " + std::to_string(variant));
      Problem p;
      ASSERT_NO_FATAL_FAILURE(make_problem(p, c));
      TokenRows tokens;
      ASSERT_NO_FATAL_FAILURE(make_token_rows(p, tokens));
      RunOptions o;
      o.pass_counts = variant != 1;
      o.num_ctas = variant == 2 ? 7 : 0;
      o.tile_queue = variant == 3;
      Outputs dispatched, gathered;
      ASSERT_NO_FATAL_FAILURE(run_forward(p, o, dispatched));
      o.gathered = &tokens;
      ASSERT_NO_FATAL_FAILURE(run_forward(p, o, gathered));
      EXPECT_TRUE(same_bits(dispatched.gate_up, gathered.gate_up)) << "gate_up differs";
      EXPECT_TRUE(same_bits(dispatched.hidden, gathered.hidden)) << "hidden differs";
      EXPECT_TRUE(same_bits(dispatched.hidden8, gathered.hidden8)) << "e4m3 hidden differs";
      EXPECT_TRUE(same_bits(dispatched.hidden8_scales, gathered.hidden8_scales)) << "hidden scales differ";
      if (!checked_failure && c.counts[0] > 0) {
        checked_failure = true;
        const int2 first = tokens.routes[size_t(p.rows.offset[0])];
        tokens.codes[size_t(first.y / kGatherTopK) * size_t(c.hidden) + 3] ^= 0x01;  // one ulp of one code
        ASSERT_NO_FATAL_FAILURE(tokens.d_rows.upload(tokens.codes, tokens.scales));
        Outputs changed;
        ASSERT_NO_FATAL_FAILURE(run_forward(p, o, changed));
        EXPECT_FALSE(same_bits(dispatched.gate_up, changed.gate_up)) << "a changed token code went unseen";
      }
    }
  }
  EXPECT_TRUE(checked_failure);
}

// ---- Host: argument checks ------------------------------------------------------------------------

Fp8UpGateSwigluArgs valid_fp8_up_args() {
  auto a = kernel_args<Fp8UpGateSwigluArgs>(fake_rows(), 256, 128);
  a.x = {fake_ptr<const __nv_fp8_e4m3>(), fake_ptr<const float>(1 << 12)};
  a.w_gate_up = {fake_ptr<const __nv_fp8_e4m3>(1 << 13), fake_ptr<const float>(1 << 14)};
  a.activation_out = fake_ptr(1 << 15);
  return a;
}

TEST(GroupedGemmFp8Args, UpGateRejectsBadArguments) {
  const auto with = calls_with(valid_fp8_up_args(), &caracal::gemm::grouped_up_gate_swiglu);
  expect_error(with([](auto& a) { a.hidden = 192; }),
               {"grouped_up_gate_swiglu (fp8)", "hidden (D)", "multiple of 128", "192"});
  expect_error(with([](auto& a) { a.intermediate = 64; }), {"intermediate (I)", "multiple of 128", "64"});
  expect_error(with([](auto& a) { a.x.scales = nullptr; }), {"x.scales", "null"});
  expect_error(with([](auto& a) { a.x.codes = fake_ptr<const __nv_fp8_e4m3>(8); }), {"x.codes", "16-byte"});
  expect_error(with([](auto& a) { a.w_gate_up.scales = fake_ptr<const float>(4); }), {"w_gate_up.scales", "16-byte"});
  expect_error(with([](auto& a) { a.w_gate_up.codes = nullptr; }), {"w_gate_up.codes", "null"});
  expect_error(with([](auto& a) { a.activation_out = nullptr; }), {"activation_out or activation_fp8_out", "both are null"});
  expect_error(with([](auto& a) { a.activation_fp8_out.codes = fake_ptr<__nv_fp8_e4m3>(1 << 16); }),
               {"activation_fp8_out.scales", "null"});
  expect_error(with([](auto& a) { a.rows.row_capacity = 100; }), {"rows.row_capacity", "100"});
  expect_error(with([](auto& a) { a.num_ctas = -1; }), {"num_ctas", "-1"});
  // x gathered from the tokens' rows instead.
  const auto gathered = [](Fp8UpGateSwigluArgs& a) {
    a.x = {};
    a.x_tokens = {fake_ptr<const __nv_fp8_e4m3>(1 << 17), fake_ptr<const float>(1 << 18), 64};
    a.rows.rows = fake_ptr<const int2>(1 << 19);
    a.top_k = 8;
  };
  expect_error(with([&](auto& a) {
                 gathered(a);
                 a.x.codes = fake_ptr<const __nv_fp8_e4m3>();
               }),
               {"x and x_tokens", "x must be null"});
  expect_error(with([&](auto& a) {
                 gathered(a);
                 a.x_tokens.scales = nullptr;
               }),
               {"x_tokens.scales", "null"});
  expect_error(with([&](auto& a) {
                 gathered(a);
                 a.rows.rows = nullptr;
               }),
               {"x_tokens needs rows.rows"});
  expect_error(with([&](auto& a) {
                 gathered(a);
                 a.top_k = 0;
               }),
               {"top_k must be >= 1 with x_tokens", "got 0"});
  expect_error(with([&](auto& a) {
                 gathered(a);
                 a.x_tokens.scale_block_stride = 0;
               }),
               {"x_tokens.scale_block_stride must be >= 1", "got 0"});
}

TEST(GroupedGemmFp8Args, DownRejectsBadArguments) {
  auto valid = kernel_args<Fp8DownProjArgs>(fake_rows(), 256, 128);
  valid.activation = {fake_ptr<const __nv_fp8_e4m3>(), fake_ptr<const float>(1 << 12)};
  valid.w_down = {fake_ptr<const __nv_fp8_e4m3>(1 << 13), fake_ptr<const float>(1 << 14)};
  valid.y_out = fake_ptr(1 << 15);
  const auto with = calls_with(valid, &caracal::gemm::grouped_down_proj);
  expect_error(with([](auto& a) { a.hidden = 320; }), {"grouped_down_proj (fp8)", "hidden (D)", "multiple of 128"});
  expect_error(with([](auto& a) { a.activation.scales = nullptr; }), {"activation.scales", "null"});
  expect_error(with([](auto& a) { a.w_down.codes = nullptr; }), {"w_down.codes"});
  expect_error(with([](auto& a) { a.y_out = fake_ptr(2); }), {"y_out", "16-byte"});
}

}  // namespace
