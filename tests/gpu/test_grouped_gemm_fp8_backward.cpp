// Tests of the backward's row GEMMs in FP8 (caracal/gemm/grouped_gemm_backward_fp8.hpp).
//   GPU: fresh random normal x, weights and dy; gate_up and the activation saved by the bf16
//        up/gate kernel (as training saves them); dy and the transposed weights quantized on the
//        host by the recipe's contract (caracal/block_fp8.hpp: dy per 1 x 128 along D, W_down^T
//        [I][D] and W_gate_up^T [D][2I] per 128 x 128 block), against the fp64 GEMMs of the
//        dequantized operands with the bf16-rounding contract (B1-B3): d_gate, d_up,
//        scaled_activation, dL/dg; the dgrad's e4m3 d_gate_up is the host quantization of its
//        own bf16 d_gate_up bit for bit; the dx GEMM takes the reference's d_gate_up quantized
//        the same way, so each GEMM is checked on its own. Outputs poisoned first; experts of 0, 1,
//        63-65, 127-129 rows, tiny and odd counts, every row on one expert, all experts empty;
//        rows with g = 0 and 1; bitwise determinism across runs, grid sizes, counts, a tile queue
//        and d_gate_up written over gate_up, the dx GEMM fed by the dgrad's own e4m3 output;
//        deliberate errors caught.
//   Host: argument validation and a launch without rows (no GPU needed).
#include "caracal/gemm/grouped_gemm_backward_fp8.hpp"

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "caracal/bf16.hpp"
#include "caracal/block_fp8.hpp"
#include "caracal/gemm/grouped_gemm.hpp"
#include "gpu/backward_test_support.hpp"
#include "gpu/fp8_test_support.hpp"
#include "gpu/gpu_test_util.hpp"
#include "gpu/grouped_gemm_test_support.hpp"

namespace {

using namespace caracal::test::gemm;
using caracal::gemm::Fp8DownDgradSwigluArgs;
using caracal::gemm::Fp8GateUpDgradArgs;
using caracal::gemm::gate_up_row;

// The GEMMs' bounds: fp8_test_support.hpp's. scaled_activation meets the bf16 kernel's bound: no
// FP8 operand reaches it.
constexpr RouterGradBound kFp8RouterGradBound{2e-3, 1.6e-3, 4e-4};

constexpr uint8_t kPoisonCode = 0xFF;  // what poison() leaves in a code buffer (an e4m3 NaN)

// ---- Problems -----------------------------------------------------------------------------------

// The fp64 backward of the real rows from the dequantized operands, with the bf16-rounding
// contract: d_gate, d_up, scaled_activation rounded where the kernels store bf16 (B2, B5), dg and
// its scale not (B1), dx (B3) from the reference's d_gate_up quantized as the kernels' input.
// Row arrays are indexed like the row buffers; padding rows stay 0.
struct Reference {
  std::vector<double> d_gate, d_up, scaled_activation;  // [capacity][I]
  std::vector<double> d_gate_up;                         // [capacity][2I] interleaved: d_gate, d_up
  std::vector<double> dg, dg_scale;                      // [capacity]
  std::vector<double> dx;                                // [capacity][D]
};

// One case's inputs, the forward's saved activations, the quantized operands, the reference and
// the device buffers.
struct Problem : ExpertInputs {
  std::vector<uint16_t> dy;       // [capacity][D]
  std::vector<float> gates;       // [capacity]
  std::vector<uint16_t> gate_up;  // [capacity][2I], the bf16 forward kernel's
  std::vector<uint16_t> hidden;   // [capacity][I], its activation
  QuantizedRows dy_q, d_gate_up_q;
  QuantizedWeights w_down_t_q, w_gate_up_t_q;  // [L][I][D], [L][D][2I]
  Reference ref;
  DeviceQuantized d_dy_q, d_d_gate_up_q, d_w_down_t_q, d_w_gate_up_t_q;
  DeviceBuffer<uint16_t> d_gate_up, d_activation;
  DeviceBuffer<float> d_gates;
  // Outputs.
  DeviceBuffer<uint16_t> d_d_gate_up, d_scaled_activation, d_dx;
  DeviceBuffer<uint8_t> d_d_gate_up_codes;
  DeviceBuffer<float> d_d_gate_up_scales, d_dg, d_workspace;
};


void reference_backward(Problem& p) {
  const size_t D = size_t(p.c.hidden), I = size_t(p.c.intermediate), cap = size_t(p.rows.capacity);
  const std::vector<double> gu = widen(p.gate_up), hidden = widen(p.hidden);
  Reference& r = p.ref;
  r.d_gate = r.d_up = r.scaled_activation = std::vector<double>(cap * I, 0.0);
  r.d_gate_up.assign(cap * 2 * I, 0.0);
  r.dg = r.dg_scale = std::vector<double>(cap, 0.0);
  r.dx.assign(cap * D, 0.0);
  std::vector<double> d_h(I);
  for (size_t e = 0; e < size_t(p.num_experts); ++e) {
    const size_t begin = size_t(p.rows.offset[e]);
    for (size_t row = begin; row < begin + size_t(p.c.counts[e]); ++row) {
      const double g = double(p.gates[row]);
      const double* dy_row = &p.dy_q.values[row * D];
      const double* h = &hidden[row * I];
      double dg = 0.0, scale2 = 0.0;
      for (size_t j = 0; j < I; ++j) {  // d_h = W_down^T dy, before g
        const double* w_row = &p.w_down_t_q.values[(e * I + j) * D];
        double acc = 0.0;
        for (size_t d = 0; d < D; ++d) acc += dy_row[d] * w_row[d];
        d_h[j] = acc;
        dg += acc * h[j];
        scale2 += acc * h[j] * acc * h[j];
      }
      r.dg[row] = dg;
      r.dg_scale[row] = std::sqrt(scale2);
      for (size_t j = 0; j < I; ++j) {
        const size_t gate_col = size_t(gate_up_row(int64_t(j), false)), up_col = size_t(gate_up_row(int64_t(j), true));
        const double gate = gu[row * 2 * I + gate_col], up = gu[row * 2 * I + up_col];
        const double d_activation = g * d_h[j];
        r.d_gate[row * I + j] = r.d_gate_up[row * 2 * I + gate_col] =
            caracal::round_to_bf16(d_activation * up * silu_grad(gate));
        r.d_up[row * I + j] = r.d_gate_up[row * 2 * I + up_col] = caracal::round_to_bf16(d_activation * silu(gate));
        r.scaled_activation[row * I + j] = caracal::round_to_bf16(g * h[j]);
      }
    }
  }
  p.d_gate_up_q = quantize_rows_for_gemm(std::vector<float>(r.d_gate_up.begin(), r.d_gate_up.end()), cap, 2 * I);
  for (size_t e = 0; e < size_t(p.num_experts); ++e) {
    const size_t begin = size_t(p.rows.offset[e]);
    for (size_t row = begin; row < begin + size_t(p.c.counts[e]); ++row) {
      const double* dgu = &p.d_gate_up_q.values[row * 2 * I];
      for (size_t d = 0; d < D; ++d) {
        const double* w_row = &p.w_gate_up_t_q.values[(e * D + d) * 2 * I];
        double acc = 0.0;
        for (size_t k = 0; k < 2 * I; ++k) acc += dgu[k] * w_row[k];
        r.dx[row * D + d] = caracal::round_to_bf16(acc);
      }
    }
  }
}

// Fills the inputs, runs the bf16 up/gate kernel for gate_up and the activation, quantizes the
// operands on the host, computes the reference and allocates the outputs.
void make_problem(Problem& p, const Case& c) {
  std::mt19937_64 rng(p.seed.value());
  ASSERT_NO_FATAL_FAILURE(make_inputs(p, c, rng, Draw::kNormal));
  const size_t D = size_t(c.hidden), I = size_t(c.intermediate), L = size_t(p.num_experts);
  const size_t cap = size_t(p.rows.capacity);
  p.dy = random_rows(c.counts, p.rows, D, rng, Draw::kNormal);
  p.gates = row_gates(p, rng);
  ASSERT_NO_FATAL_FAILURE(p.d_gates.upload(p.gates));
  ASSERT_NO_FATAL_FAILURE(p.d_gate_up.allocate(cap * 2 * I));
  ASSERT_NO_FATAL_FAILURE(p.d_gate_up.poison());  // rows past expert_offset[L] stay NaN
  ASSERT_NO_FATAL_FAILURE(p.d_activation.allocate(cap * I));
  ASSERT_NO_THROW(caracal::gemm::grouped_up_gate_swiglu(
      up_gate_args(p, p.schedule(true), p.d_activation.get(), p.d_gate_up.get()), nullptr));
  CARACAL_ASSERT_CUDA(cudaDeviceSynchronize());
  ASSERT_NO_FATAL_FAILURE(p.d_gate_up.download(p.gate_up));
  ASSERT_NO_FATAL_FAILURE(p.d_activation.download(p.hidden));

  std::vector<uint16_t> w_gate_up(L * 2 * I * D);
  caracal::gemm::interleave_gate_up_weights_host(p.w_gate.data(), p.w_up.data(), w_gate_up.data(), int64_t(L),
                                                 int64_t(I), int64_t(D));
  p.dy_q = quantize_rows_for_gemm(floats_of(p.dy), cap, D);
  p.w_down_t_q = quantize_weights_for_gemm(transposed(floats_of(p.w_down), L, D, I), L, I, D);
  p.w_gate_up_t_q = quantize_weights_for_gemm(transposed(floats_of(w_gate_up), L, 2 * I, D), L, D, 2 * I);
  reference_backward(p);
  ASSERT_NO_FATAL_FAILURE(p.d_dy_q.upload(p.dy_q.codes, p.dy_q.scales));
  ASSERT_NO_FATAL_FAILURE(p.d_d_gate_up_q.upload(p.d_gate_up_q.codes, p.d_gate_up_q.scales));
  ASSERT_NO_FATAL_FAILURE(p.d_w_down_t_q.upload(p.w_down_t_q.codes, p.w_down_t_q.scales));
  ASSERT_NO_FATAL_FAILURE(p.d_w_gate_up_t_q.upload(p.w_gate_up_t_q.codes, p.w_gate_up_t_q.scales));
  ASSERT_NO_FATAL_FAILURE(p.d_d_gate_up.allocate(cap * 2 * I));
  ASSERT_NO_FATAL_FAILURE(p.d_scaled_activation.allocate(cap * I));
  ASSERT_NO_FATAL_FAILURE(p.d_dx.allocate(cap * D));
  ASSERT_NO_FATAL_FAILURE(p.d_d_gate_up_codes.allocate(cap * 2 * I));
  ASSERT_NO_FATAL_FAILURE(p.d_d_gate_up_scales.allocate(2 * I / 128 * cap));
  ASSERT_NO_FATAL_FAILURE(p.d_dg.allocate(cap));
  ASSERT_NO_FATAL_FAILURE(
      p.d_workspace.allocate(caracal::gemm::fp8_down_dgrad_workspace_floats(p.rows.capacity, c.intermediate)));
}

struct RunOptions {
  int num_ctas = 0;
  bool pass_counts = true;
  bool tile_queue = false;
  bool in_place = false;  // d_gate_up written over (a copy of) gate_up, as the layer runs it
  bool chained = false;   // the dx GEMM on the dgrad's e4m3 d_gate_up, not the reference's
};

struct Outputs {
  std::vector<uint16_t> d_gate_up, scaled_activation, dx;
  std::vector<uint8_t> codes;
  std::vector<float> scales, dg;
};

// Poisons every output (and the workspace), runs the dgrad and the dx GEMM, downloads the outputs.
void run_backward(Problem& p, const RunOptions& o, Outputs& out) {
  for (auto* b : {&p.d_d_gate_up, &p.d_scaled_activation, &p.d_dx}) ASSERT_NO_FATAL_FAILURE(b->poison());
  for (auto* b : {&p.d_d_gate_up_scales, &p.d_dg, &p.d_workspace}) ASSERT_NO_FATAL_FAILURE(b->poison());
  ASSERT_NO_FATAL_FAILURE(p.d_d_gate_up_codes.poison());
  if (o.in_place) {
    CARACAL_ASSERT_CUDA(
        cudaMemcpy(p.d_d_gate_up.get(), p.d_gate_up.get(), p.d_gate_up.bytes(), cudaMemcpyDeviceToDevice));
  }
  const ScheduleView rows = p.schedule(o.pass_counts);
  DeviceBuffer<uint32_t> queue;
  if (o.tile_queue) {
    ASSERT_NO_FATAL_FAILURE(allocate_tile_queue(queue));
  }
  auto dgrad = kernel_args<Fp8DownDgradSwigluArgs>(rows, p.c.hidden, p.c.intermediate, o.num_ctas);
  dgrad.dy = {p.d_dy_q.fp8(), p.d_dy_q.scales.get()};
  dgrad.w_down_t = {p.d_w_down_t_q.fp8(), p.d_w_down_t_q.scales.get()};
  dgrad.gate_up = as_bf16(o.in_place ? p.d_d_gate_up.get() : p.d_gate_up.get());
  dgrad.gates = p.d_gates.get();
  dgrad.d_gate_up_out = as_bf16(p.d_d_gate_up.get());
  dgrad.d_gate_up_fp8_out = {reinterpret_cast<__nv_fp8_e4m3*>(p.d_d_gate_up_codes.get()), p.d_d_gate_up_scales.get()};
  dgrad.scaled_activation_out = as_bf16(p.d_scaled_activation.get());
  dgrad.d_gates_out = p.d_dg.get();
  dgrad.workspace = p.d_workspace.get();
  dgrad.tile_queue = o.tile_queue ? queue.get() : nullptr;
  ASSERT_NO_THROW(caracal::gemm::grouped_down_dgrad_swiglu(dgrad, nullptr));
  auto dx = kernel_args<Fp8GateUpDgradArgs>(rows, p.c.hidden, p.c.intermediate, o.num_ctas);
  dx.d_gate_up = o.chained ? caracal::gemm::Fp8RowOperand{dgrad.d_gate_up_fp8_out.codes, dgrad.d_gate_up_fp8_out.scales}
                           : caracal::gemm::Fp8RowOperand{p.d_d_gate_up_q.fp8(), p.d_d_gate_up_q.scales.get()};
  dx.w_gate_up_t = {p.d_w_gate_up_t_q.fp8(), p.d_w_gate_up_t_q.scales.get()};
  dx.dx_out = as_bf16(p.d_dx.get());
  dx.tile_queue = dgrad.tile_queue;  // one after the other on one stream
  ASSERT_NO_THROW(caracal::gemm::grouped_gate_up_dgrad(dx, nullptr));
  CARACAL_ASSERT_CUDA(cudaDeviceSynchronize());
  ASSERT_NO_FATAL_FAILURE(p.d_d_gate_up.download(out.d_gate_up));
  ASSERT_NO_FATAL_FAILURE(p.d_scaled_activation.download(out.scaled_activation));
  ASSERT_NO_FATAL_FAILURE(p.d_dx.download(out.dx));
  ASSERT_NO_FATAL_FAILURE(p.d_d_gate_up_codes.download(out.codes));
  ASSERT_NO_FATAL_FAILURE(p.d_d_gate_up_scales.download(out.scales));
  ASSERT_NO_FATAL_FAILURE(p.d_dg.download(out.dg));
}

// ---- Checks -------------------------------------------------------------------------------------

// The dgrad's e4m3 d_gate_up against caracal::quantize_rows of its bf16 d_gate_up (exact scales),
// bit for bit on every row below expert_offset[L] (padding rows too: the dx GEMM reads their
// scales); rows past it keep the poison. What differs (empty: nothing).
std::vector<std::string> fp8_copy_failures(const Problem& p, const Outputs& out) {
  const size_t cols = 2 * size_t(p.c.intermediate), cap = size_t(p.rows.capacity);
  const size_t rows = size_t(p.rows.offset.back()), blocks = cols / 128;
  const std::vector<uint16_t> written(out.d_gate_up.begin(), out.d_gate_up.begin() + ptrdiff_t(rows * cols));
  const caracal::Fp8Matrix q = caracal::quantize_rows(floats_of(written), int64_t(rows), int64_t(cols));
  size_t codes = 0, scales = 0, touched_codes = 0, touched_scales = 0;
  for (size_t i = 0; i < rows * cols; ++i) codes += out.codes[i] != q.codes[i];
  for (size_t i = rows * cols; i < cap * cols; ++i) touched_codes += out.codes[i] != kPoisonCode;
  for (size_t r = 0; r < cap; ++r) {
    for (size_t b = 0; b < blocks; ++b) {
      const uint32_t got = float_bits(out.scales[b * cap + r]);
      if (r < rows) {
        scales += got != float_bits(q.scales[r * blocks + b]);
      } else {
        touched_scales += got != kPoisonF32;
      }
    }
  }
  std::vector<std::string> failures;
  if (codes != 0) failures.push_back("d_gate_up codes: " + std::to_string(codes) + " differ from quantize_rows'");
  if (scales != 0) failures.push_back("d_gate_up scales: " + std::to_string(scales) + " differ from quantize_rows'");
  if (touched_codes + touched_scales != 0) {
    failures.push_back("d_gate_up codes and scales past expert_offset[L]: " +
                       std::to_string(touched_codes + touched_scales) + " written");
  }
  return failures;
}

// A fresh problem of case `c`, run once with `o`.
void run_case(Problem& p, const Case& c, const RunOptions& o, Outputs& out) {
  ASSERT_NO_FATAL_FAILURE(make_problem(p, c));
  ASSERT_NO_FATAL_FAILURE(run_backward(p, o, out));
}

// A fresh problem of case `c` run with `o`, every output against the reference.
void check_against_reference(const Case& c, const RunOptions& o) {
  Problem p;
  Outputs out;
  ASSERT_NO_FATAL_FAILURE(run_case(p, c, o, out));
  const size_t D = size_t(c.hidden), I = size_t(c.intermediate);
  expect_half_close("d_gate", false, p.rows, c.counts, I, p.ref.d_gate, out.d_gate_up, kFp8DgradBound);
  expect_half_close("d_up", true, p.rows, c.counts, I, p.ref.d_up, out.d_gate_up, kFp8DgradBound);
  expect_padding("d_gate_up", p.rows, c.counts, 2 * I, out.d_gate_up);
  expect_close("scaled_activation", p.rows, c.counts, I, p.ref.scaled_activation, out.scaled_activation,
               kScaledHiddenBound);
  expect_padding("scaled_activation", p.rows, c.counts, I, out.scaled_activation);
  expect_router_grad(p, p.gates, p.ref.dg, p.ref.dg_scale, out.dg, kFp8RouterGradBound);
  expect_gate_edge_rows(p, p.gates, p.hidden, out.d_gate_up, out.scaled_activation);
  for (const std::string& f : fp8_copy_failures(p, out)) ADD_FAILURE() << f;
  expect_close("dx", p.rows, c.counts, D, p.ref.dx, out.dx, kFp8DxBound);
  expect_padding("dx", p.rows, c.counts, D, out.dx);
}

std::vector<Case> reference_cases() {
  return {
      {"edge_counts", 256, 128, kEdgeCounts},
      {"tiny_and_odd", 256, 128, {1, 2, 3, 0, 5, 131}},
      {"all_to_one", 256, 256, {0, 0, 517, 0, 0}},
      // D = 384, I = 256: three K blocks and two N tiles of the dgrad; 2I = 512: four K blocks of
      // dx, three N tiles.
      {"three_blocks", 384, 256, {200, 0, 77, 129}},
      // D = 640, I = 384: W_down^T's scale rows padded from 3 blocks to 32, W_gate_up^T's from 5;
      // 2I = 768: six K blocks of dx.
      {"odd_blocks", 640, 384, {130, 60, 1}},
      {"routed", 512, 256, routed_counts(caracal::RoutingKind::kUniform, 2, 333, 4, 16, 1, 11)},
      {"long_k", 2048, 128, {130, 60}},
      // D = 4096: the dgrad in 128 x 256 tiles (fp8_dgrad_wide_tiles); I = 384: its second tile ends
      // past I (the epilogue skips those chunks), one dL/dg partial per 256 columns.
      {"wide_dgrad", 4096, 384, {130, 0, 65}},
  };
}

// ---- GPU tests ----------------------------------------------------------------------------------

class GroupedGemmFp8BackwardReference : public ::testing::TestWithParam<Case> {};

TEST_P(GroupedGemmFp8BackwardReference, MatchesFp64OfTheDequantizedOperands) {
  CARACAL_REQUIRE_GPU();
  ASSERT_NO_FATAL_FAILURE(check_against_reference(GetParam(), RunOptions{}));
}

TEST_P(GroupedGemmFp8BackwardReference, MatchesWithoutCountsAndWithATileQueue) {
  CARACAL_REQUIRE_GPU();
  RunOptions o;
  o.pass_counts = false;
  o.tile_queue = true;
  ASSERT_NO_FATAL_FAILURE(check_against_reference(GetParam(), o));
}

INSTANTIATE_TEST_SUITE_P(Cases, GroupedGemmFp8BackwardReference, ::testing::ValuesIn(reference_cases()),
                         case_name);

// The bounds catch an expert's dx or d_gate_up 0.5% off, and the bit-for-bit check of the e4m3
// copy one code or one scale off.
TEST(GroupedGemmFp8BackwardChecks, CatchDeliberateErrors) {
  CARACAL_REQUIRE_GPU();
  Problem p;
  Outputs out;
  ASSERT_NO_FATAL_FAILURE(run_case(p, kChecksCase, RunOptions{}, out));
  const size_t D = size_t(p.c.hidden), I = size_t(p.c.intermediate);
  ASSERT_NO_FATAL_FAILURE(expect_catches_expert_off("dx", p.rows, D, p.ref.dx, out.dx, kFp8DxBound));
  ASSERT_NO_FATAL_FAILURE(
      expect_catches_expert_off("d_gate_up", p.rows, 2 * I, p.ref.d_gate_up, out.d_gate_up, kFp8DgradBound));
  ASSERT_EQ(fp8_copy_failures(p, out), std::vector<std::string>{}) << "the real e4m3 d_gate_up passes";
  const size_t row = size_t(p.rows.offset[7]) + 17;  // a real row of expert 7
  Outputs bad_code = out;
  bad_code.codes[row * 2 * I + 5] ^= 1;
  EXPECT_NE(fp8_copy_failures(p, bad_code), std::vector<std::string>{}) << "a code off by one passed";
  Outputs bad_scale = out;
  bad_scale.scales[size_t(p.rows.capacity) + row] *= 1.0f + 0x1p-20f;
  EXPECT_NE(fp8_copy_failures(p, bad_scale), std::vector<std::string>{}) << "a scale a few ulps off passed";
}

// Each output tile and dg partial has one owner and a fixed K order: nothing may depend on the
// run, the grid size, the counts, a tile queue, or on d_gate_up being written over gate_up.
TEST(GroupedGemmFp8BackwardDeterminism, BitwiseAcrossRunsGridSizesCountsQueuesAndInPlace) {
  CARACAL_REQUIRE_GPU();
  Problem p;
  RunOptions chained;
  chained.chained = true;
  Outputs first;
  ASSERT_NO_FATAL_FAILURE(run_case(p, kDeterminismCase, chained, first));
  for (int num_ctas : {1, 7, 0}) {
    for (int variant = 0; variant < 4; ++variant) {
      SCOPED_TRACE("num_ctas " + std::to_string(num_ctas) + ", variant " + std::to_string(variant));
      RunOptions o = chained;
      o.num_ctas = num_ctas;
      o.pass_counts = variant != 1;
      o.tile_queue = variant == 2;
      o.in_place = variant == 3;
      Outputs again;
      ASSERT_NO_FATAL_FAILURE(run_backward(p, o, again));
      EXPECT_TRUE(same_bits(first.d_gate_up, again.d_gate_up)) << "d_gate_up differs";
      EXPECT_TRUE(same_bits(first.codes, again.codes)) << "d_gate_up codes differ";
      EXPECT_TRUE(same_bits(first.scales, again.scales)) << "d_gate_up scales differ";
      EXPECT_TRUE(same_bits(first.scaled_activation, again.scaled_activation)) << "scaled_activation differs";
      EXPECT_TRUE(same_bits(first.dg, again.dg)) << "dg differs";
      EXPECT_TRUE(same_bits(first.dx, again.dx)) << "dx differs";
    }
  }
}

// All experts empty: the kernels write nothing.
TEST(GroupedGemmFp8BackwardEmpty, EmptyExpertsWriteNothing) {
  CARACAL_REQUIRE_GPU();
  Problem p;
  Outputs out;
  ASSERT_NO_FATAL_FAILURE(run_case(p, kEmptyCase, RunOptions{}, out));
  for (const auto* v : {&out.d_gate_up, &out.scaled_activation, &out.dx}) EXPECT_EQ(touched(*v), 0u);
  EXPECT_EQ(fp8_copy_failures(p, out), std::vector<std::string>{});
  size_t dg_written = 0;
  for (float v : out.dg) dg_written += float_bits(v) != kPoisonF32;
  EXPECT_EQ(dg_written, 0u) << "dg was written";
}

// ---- Host: argument checks and a launch without rows ----------------------------------------------

Fp8DownDgradSwigluArgs valid_dgrad_args() {
  auto a = kernel_args<Fp8DownDgradSwigluArgs>(fake_rows(), 256, 128);
  a.dy = {fake_ptr<const __nv_fp8_e4m3>(), fake_ptr<const float>(1 << 12)};
  a.w_down_t = {fake_ptr<const __nv_fp8_e4m3>(1 << 13), fake_ptr<const float>(1 << 14)};
  a.gate_up = fake_ptr<const __nv_bfloat16>(1 << 15);
  a.gates = fake_ptr<const float>(1 << 16);
  a.d_gate_up_out = fake_ptr(1 << 17);
  a.d_gate_up_fp8_out = {fake_ptr<__nv_fp8_e4m3>(1 << 18), fake_ptr<float>(1 << 19)};
  a.scaled_activation_out = fake_ptr(1 << 20);
  a.d_gates_out = a.workspace = fake_ptr<float>(1 << 21);
  return a;
}

Fp8GateUpDgradArgs valid_dx_args() {
  auto a = kernel_args<Fp8GateUpDgradArgs>(fake_rows(), 256, 128);
  a.d_gate_up = {fake_ptr<const __nv_fp8_e4m3>(), fake_ptr<const float>(1 << 12)};
  a.w_gate_up_t = {fake_ptr<const __nv_fp8_e4m3>(1 << 13), fake_ptr<const float>(1 << 14)};
  a.dx_out = fake_ptr(1 << 15);
  return a;
}

TEST(GroupedGemmFp8BackwardArgs, DgradRejectsBadArguments) {
  const auto with = calls_with(valid_dgrad_args(), &caracal::gemm::grouped_down_dgrad_swiglu);
  expect_error(with([](auto& a) { a.hidden = 192; }),
               {"grouped_down_dgrad_swiglu (fp8)", "hidden (D)", "multiple of 128", "192"});
  expect_error(with([](auto& a) { a.intermediate = 64; }), {"intermediate (I)", "multiple of 128", "64"});
  expect_error(with([](auto& a) { a.rows.row_capacity = 100; }), {"rows.row_capacity", "100"});
  expect_error(with([](auto& a) { a.dy.scales = nullptr; }), {"dy.scales", "null"});
  expect_error(with([](auto& a) { a.dy.codes = fake_ptr<const __nv_fp8_e4m3>(8); }), {"dy.codes", "16-byte"});
  expect_error(with([](auto& a) { a.w_down_t.codes = nullptr; }), {"w_down_t.codes", "null"});
  expect_error(with([](auto& a) { a.w_down_t.scales = fake_ptr<const float>(4); }), {"w_down_t.scales", "16-byte"});
  expect_error(with([](auto& a) { a.gate_up = nullptr; }), {"gate_up must be", "null"});
  expect_error(with([](auto& a) { a.gates = nullptr; }), {"gates"});
  expect_error(with([](auto& a) { a.d_gate_up_out = fake_ptr(8); }), {"d_gate_up_out", "16-byte"});
  expect_error(with([](auto& a) { a.d_gate_up_fp8_out.codes = nullptr; }), {"d_gate_up_fp8_out.codes", "null"});
  expect_error(with([](auto& a) { a.d_gate_up_fp8_out.scales = fake_ptr<float>(4); }),
               {"d_gate_up_fp8_out.scales", "16-byte"});
  expect_error(with([](auto& a) { a.scaled_activation_out = nullptr; }), {"scaled_activation_out"});
  expect_error(with([](auto& a) { a.d_gates_out = nullptr; }), {"d_gates_out"});
  expect_error(with([](auto& a) { a.workspace = nullptr; }), {"workspace"});
  expect_error(with([](auto& a) { a.num_ctas = -1; }), {"num_ctas", "-1"});
  expect_tile_queue_cap(with, "grouped_down_dgrad_swiglu (fp8)", 300);
}

TEST(GroupedGemmFp8BackwardArgs, DxRejectsBadArguments) {
  const auto with = calls_with(valid_dx_args(), &caracal::gemm::grouped_gate_up_dgrad);
  expect_error(with([](auto& a) { a.hidden = 320; }),
               {"grouped_gate_up_dgrad (fp8)", "hidden (D)", "multiple of 128", "320"});
  expect_error(with([](auto& a) { a.intermediate = 0; }), {"intermediate (I)", "got 0"});
  expect_error(with([](auto& a) { a.rows.num_experts = 0; }), {"rows.num_experts"});
  expect_error(with([](auto& a) { a.d_gate_up.codes = nullptr; }), {"d_gate_up.codes", "null"});
  expect_error(with([](auto& a) { a.d_gate_up.scales = fake_ptr<const float>(8); }), {"d_gate_up.scales", "16-byte"});
  expect_error(with([](auto& a) { a.w_gate_up_t.scales = nullptr; }), {"w_gate_up_t.scales", "null"});
  expect_error(with([](auto& a) { a.dx_out = fake_ptr(2); }), {"dx_out", "16-byte"});
  expect_error(with([](auto& a) { a.tile_queue = fake_ptr<uint32_t>(4); }), {"tile_queue must be 16-byte aligned"});
}

// No row buffers at all: both launchers return before any CUDA call (row pointers may be null).
TEST(GroupedGemmFp8BackwardArgs, ZeroCapacityLaunchesNothing) {
  const ScheduleView rows{fake_ptr<const int32_t>(), nullptr, 2, 0};
  auto dgrad = kernel_args<Fp8DownDgradSwigluArgs>(rows, 256, 128);
  dgrad.w_down_t = valid_dgrad_args().w_down_t;
  EXPECT_NO_THROW(caracal::gemm::grouped_down_dgrad_swiglu(dgrad, nullptr));
  auto dx = kernel_args<Fp8GateUpDgradArgs>(rows, 256, 128);
  dx.w_gate_up_t = valid_dx_args().w_gate_up_t;
  EXPECT_NO_THROW(caracal::gemm::grouped_gate_up_dgrad(dx, nullptr));
}

}  // namespace
