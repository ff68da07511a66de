// Tests of the grouped-GEMM engine's backward kernels (caracal/gemm/grouped_gemm_backward.hpp).
//   GPU: the forward up/gate kernel saves gate_up and hidden, then the three backward steps run.
//        Every output is checked against an fp64 host computation with the bf16-rounding contract
//        (B1-B5 of caracal/reference.hpp) on fresh random inputs, outputs poisoned (NaN) first:
//        d_gate/d_up, scaled_activation, dx, the router-score gradient per row (absolute + relative
//        tolerance, taken before g: right where g = 0) and the fp32 weight gradients per expert.
//        Experts with 0, 1, 64/65, 127/128/129 rows, partial tiles, odd totals, skewed routing,
//        rows with g = 0 and g = 1; bitwise determinism across runs and grid sizes; experts
//        without rows get exact zeros.
//   Host: argument validation (no GPU needed).
#include "caracal/gemm/grouped_gemm_backward.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "caracal/bf16.hpp"
#include "caracal/gemm/grouped_gemm.hpp"
#include "caracal/routing.hpp"
#include "gpu/backward_test_support.hpp"
#include "gpu/gpu_test_util.hpp"
#include "gpu/grouped_gemm_test_support.hpp"

namespace {

using namespace caracal::test::gemm;
using caracal::gemm::DownDgradSwigluArgs;
using caracal::gemm::gate_up_row;
using caracal::gemm::GateUpDgradArgs;
using caracal::gemm::WeightGradArgs;

// ---- Problems -----------------------------------------------------------------------------------

// The inputs of one case with dy and the row gates, the forward's saved activations, and the
// backward's output buffers.
struct Problem : ExpertInputs {
  std::vector<uint16_t> dy;       // [capacity][D]; padding and spare rows zero
  std::vector<float> gates;       // [capacity]; 0 on padding and spare rows
  std::vector<uint16_t> gate_up;  // [capacity][2I] interleaved, as the forward kernel saved it
  std::vector<uint16_t> hidden;   // [capacity][I], the forward kernel's hidden
  DeviceBuffer<uint16_t> d_dy, d_gate_up, d_activation;
  DeviceBuffer<float> d_gates;
  DeviceBuffer<uint16_t> d_d_gate_up, d_scaled_hidden, d_dx;
  DeviceBuffer<float> d_dg, d_workspace, d_dw_gate_up, d_dw_down;
  DeviceBuffer<uint16_t> d_dw_gate_up_bf16, d_dw_down_bf16;
  DeviceBuffer<uint16_t> d_w_gate_up_halves;  // W_gate_up in [gate; up] halves (GateUpLayout::kHalves)
};

// Fills the inputs, runs the forward up/gate kernel for gate_up and hidden (as training does).
void make_problem(Problem& p, const Case& c) {
  std::mt19937_64 rng(p.seed.value());
  ASSERT_NO_FATAL_FAILURE(make_inputs(p, c, rng));
  const size_t D = size_t(c.hidden), I = size_t(c.intermediate), L = size_t(p.num_experts);
  const size_t cap = size_t(p.rows.capacity);
  p.dy = random_rows(c.counts, p.rows, D, rng);
  p.gates = row_gates(p, rng);
  ASSERT_NO_FATAL_FAILURE(p.d_dy.upload(p.dy));
  ASSERT_NO_FATAL_FAILURE(p.d_gates.upload(p.gates));
  ASSERT_NO_FATAL_FAILURE(p.d_gate_up.allocate(cap * 2 * I));
  ASSERT_NO_FATAL_FAILURE(p.d_activation.allocate(cap * I));
  ASSERT_NO_FATAL_FAILURE(p.d_d_gate_up.allocate(cap * 2 * I));
  ASSERT_NO_FATAL_FAILURE(p.d_scaled_hidden.allocate(cap * I));
  ASSERT_NO_FATAL_FAILURE(p.d_dx.allocate(cap * D));
  ASSERT_NO_FATAL_FAILURE(p.d_dg.allocate(cap));
  ASSERT_NO_FATAL_FAILURE(p.d_workspace.allocate(
      caracal::gemm::down_dgrad_workspace_floats(p.rows.capacity, c.intermediate)));
  ASSERT_NO_FATAL_FAILURE(p.d_dw_gate_up.allocate(L * 2 * I * D));
  ASSERT_NO_FATAL_FAILURE(p.d_dw_down.allocate(L * D * I));
  ASSERT_NO_FATAL_FAILURE(p.d_dw_gate_up_bf16.allocate(L * 2 * I * D));
  ASSERT_NO_FATAL_FAILURE(p.d_dw_down_bf16.allocate(L * D * I));
  ASSERT_NO_FATAL_FAILURE(p.d_w_gate_up_halves.upload(gate_up_halves(p)));

  ASSERT_NO_THROW(caracal::gemm::grouped_up_gate_swiglu(
      up_gate_args(p, p.schedule(true), p.d_activation.get(), p.d_gate_up.get()), nullptr));
  CARACAL_ASSERT_CUDA(cudaDeviceSynchronize());
  ASSERT_NO_FATAL_FAILURE(p.d_gate_up.download(p.gate_up));
  ASSERT_NO_FATAL_FAILURE(p.d_activation.download(p.hidden));
}

struct RunOptions {
  int num_ctas = 0;
  bool pass_counts = true;
  bool bf16_weight_grads = false;  // the weight gradients in bf16 (dw_*_bf16) instead of fp32
  bool tile_queue = false;         // the dgrad and dx GEMMs' tiles from a tile queue, not at a fixed stride
  bool halves = false;  // dx reads W_gate_up as [gate; up] halves and dW_gate_up is stored so (in place)
};

struct Outputs {
  std::vector<uint16_t> d_gate_up, scaled_activation, dx;
  std::vector<float> dg, dw_gate_up, dw_down;
  std::vector<uint16_t> dw_gate_up_bf16, dw_down_bf16;
};

// The three backward steps' arguments over `rows`.
DownDgradSwigluArgs dgrad_args(Problem& p, const ScheduleView& rows, int num_ctas) {
  auto a = kernel_args<DownDgradSwigluArgs>(rows, p.c.hidden, p.c.intermediate, num_ctas);
  a.dy = as_bf16(p.d_dy.get());
  a.w_down = as_bf16(p.d_w_down.get());
  a.gate_up = as_bf16(p.d_gate_up.get());
  a.gates = p.d_gates.get();
  a.d_gate_up_out = as_bf16(p.d_d_gate_up.get());
  a.scaled_activation_out = as_bf16(p.d_scaled_hidden.get());
  a.d_gates_out = p.d_dg.get();
  a.workspace = p.d_workspace.get();
  return a;
}

GateUpDgradArgs dx_args(Problem& p, const ScheduleView& rows, int num_ctas, bool halves = false) {
  auto a = kernel_args<GateUpDgradArgs>(rows, p.c.hidden, p.c.intermediate, num_ctas);
  a.d_gate_up = as_bf16(p.d_d_gate_up.get());
  a.w_gate_up = as_bf16(halves ? p.d_w_gate_up_halves.get() : p.d_w_gate_up.get());
  a.w_gate_up_layout = halves ? caracal::gemm::GateUpLayout::kHalves : caracal::gemm::GateUpLayout::kInterleaved;
  a.dx_out = as_bf16(p.d_dx.get());
  return a;
}

WeightGradArgs weight_args(Problem& p, const ScheduleView& rows, const RunOptions& o) {
  auto a = kernel_args<WeightGradArgs>(rows, p.c.hidden, p.c.intermediate, o.num_ctas);
  a.x = as_bf16(p.d_x.get());
  a.dy = as_bf16(p.d_dy.get());
  a.d_gate_up = as_bf16(p.d_d_gate_up.get());
  a.scaled_activation = as_bf16(p.d_scaled_hidden.get());
  if (o.bf16_weight_grads) {
    a.d_w_gate_up_bf16 = as_bf16(p.d_dw_gate_up_bf16.get());
    a.d_w_down_bf16 = as_bf16(p.d_dw_down_bf16.get());
  } else {
    a.d_w_gate_up = p.d_dw_gate_up.get();
    a.d_w_down = p.d_dw_down.get();
  }
  if (o.halves) a.d_w_gate_up_layout = caracal::gemm::GateUpLayout::kHalves;
  return a;
}

// Poisons every output (and the workspace), runs the three backward steps, downloads the outputs.
void run_backward(Problem& p, const RunOptions& o, Outputs& out) {
  for (auto* b : {&p.d_d_gate_up, &p.d_scaled_hidden, &p.d_dx}) ASSERT_NO_FATAL_FAILURE(b->poison());
  for (auto* b : {&p.d_dg, &p.d_workspace, &p.d_dw_gate_up, &p.d_dw_down}) {
    ASSERT_NO_FATAL_FAILURE(b->poison());
  }
  for (auto* b : {&p.d_dw_gate_up_bf16, &p.d_dw_down_bf16}) ASSERT_NO_FATAL_FAILURE(b->poison());
  const ScheduleView rows = p.schedule(o.pass_counts);
  DeviceBuffer<uint32_t> queue;
  if (o.tile_queue) {
    ASSERT_NO_FATAL_FAILURE(allocate_tile_queue(queue));
  }
  DownDgradSwigluArgs dgrad = dgrad_args(p, rows, o.num_ctas);
  dgrad.tile_queue = o.tile_queue ? queue.get() : nullptr;
  ASSERT_NO_THROW(caracal::gemm::grouped_down_dgrad_swiglu(dgrad, nullptr));
  GateUpDgradArgs dx = dx_args(p, rows, o.num_ctas, o.halves);
  dx.tile_queue = o.tile_queue ? queue.get() : nullptr;
  ASSERT_NO_THROW(caracal::gemm::grouped_gate_up_dgrad(dx, nullptr));
  ASSERT_NO_THROW(caracal::gemm::grouped_weight_grads(weight_args(p, rows, o), nullptr));

  CARACAL_ASSERT_CUDA(cudaDeviceSynchronize());
  ASSERT_NO_FATAL_FAILURE(p.d_d_gate_up.download(out.d_gate_up));
  ASSERT_NO_FATAL_FAILURE(p.d_scaled_hidden.download(out.scaled_activation));
  ASSERT_NO_FATAL_FAILURE(p.d_dx.download(out.dx));
  ASSERT_NO_FATAL_FAILURE(p.d_dg.download(out.dg));
  ASSERT_NO_FATAL_FAILURE(p.d_dw_gate_up.download(out.dw_gate_up));
  ASSERT_NO_FATAL_FAILURE(p.d_dw_down.download(out.dw_down));
  ASSERT_NO_FATAL_FAILURE(p.d_dw_gate_up_bf16.download(out.dw_gate_up_bf16));
  ASSERT_NO_FATAL_FAILURE(p.d_dw_down_bf16.download(out.dw_down_bf16));
}

// A fresh problem of case `c`, run once with `o`.
void run_case(Problem& p, const Case& c, const RunOptions& o, Outputs& out) {
  ASSERT_NO_FATAL_FAILURE(make_problem(p, c));
  ASSERT_NO_FATAL_FAILURE(run_backward(p, o, out));
}

// ---- fp64 reference ------------------------------------------------------------------------------

// The backward of the real rows with the bf16-rounding contract, from the forward kernel's saved
// gate/up and hidden (what the contract's backward reads): d_gate, d_up (B2), dx (B3) rounded
// where the kernels store bf16; dg (B1) and the weight gradients (B5) not rounded. scaled_activation
// is bf16(g * hidden), the kernels' own operand for dW_down, and the reference's too (B5). Row arrays are indexed like the row
// buffers; padding rows stay 0.
struct Reference {
  std::vector<double> d_gate, d_up, scaled_activation;  // [capacity][I]
  std::vector<double> dx;                           // [capacity][D]
  std::vector<double> dg;                           // [capacity]
  std::vector<double> dg_scale;                     // [capacity]: sqrt(sum_j (d_h_j hidden_j)^2)
  std::vector<double> dw_gate, dw_up;               // [L][I][D]
  std::vector<double> dw_down;                      // [L][D][I]
};


Reference reference_backward(const Problem& p) {
  const size_t D = size_t(p.c.hidden), I = size_t(p.c.intermediate), L = size_t(p.num_experts);
  const size_t cap = size_t(p.rows.capacity);
  const std::vector<double> x = widen(p.x), dy = widen(p.dy), wg = widen(p.w_gate),
                            wu = widen(p.w_up), wd = widen(p.w_down), gu = widen(p.gate_up),
                            hidden = widen(p.hidden);
  Reference r;
  r.d_gate = r.d_up = r.scaled_activation = std::vector<double>(cap * I, 0.0);
  r.dx.assign(cap * D, 0.0);
  r.dg = r.dg_scale = std::vector<double>(cap, 0.0);
  r.dw_gate = r.dw_up = r.dw_down = std::vector<double>(L * I * D, 0.0);
  std::vector<double> d_h(I), dx_row(D);
  for (size_t e = 0; e < L; ++e) {
    const size_t begin = size_t(p.rows.offset[e]);
    for (size_t row = begin; row < begin + size_t(p.c.counts[e]); ++row) {
      const double g = double(p.gates[row]);
      const double* dy_row = &dy[row * D];
      const double* h = &hidden[row * I];
      std::fill(d_h.begin(), d_h.end(), 0.0);
      for (size_t d = 0; d < D; ++d) {  // d_h = W_down^T dy, before g
        const double* w_row = &wd[(e * D + d) * I];
        for (size_t j = 0; j < I; ++j) d_h[j] += dy_row[d] * w_row[j];
      }
      double dg = 0.0, scale2 = 0.0;
      for (size_t j = 0; j < I; ++j) {
        dg += d_h[j] * h[j];
        scale2 += d_h[j] * h[j] * d_h[j] * h[j];
      }
      r.dg[row] = dg;
      r.dg_scale[row] = std::sqrt(scale2);

      std::fill(dx_row.begin(), dx_row.end(), 0.0);
      for (size_t j = 0; j < I; ++j) {
        const double gate = gu[row * 2 * I + size_t(gate_up_row(int64_t(j), false))];
        const double up = gu[row * 2 * I + size_t(gate_up_row(int64_t(j), true))];
        const double d_activation = g * d_h[j];
        const double d_gate = caracal::round_to_bf16(d_activation * up * silu_grad(gate));
        const double d_up = caracal::round_to_bf16(d_activation * silu(gate));
        r.d_gate[row * I + j] = d_gate;
        r.d_up[row * I + j] = d_up;
        r.scaled_activation[row * I + j] = caracal::round_to_bf16(g * h[j]);
        const double* wg_row = &wg[(e * I + j) * D];
        const double* wu_row = &wu[(e * I + j) * D];
        double* dwg_row = &r.dw_gate[(e * I + j) * D];
        double* dwu_row = &r.dw_up[(e * I + j) * D];
        for (size_t d = 0; d < D; ++d) {
          dx_row[d] += d_gate * wg_row[d] + d_up * wu_row[d];
          dwg_row[d] += d_gate * x[row * D + d];
          dwu_row[d] += d_up * x[row * D + d];
        }
      }
      for (size_t d = 0; d < D; ++d) {
        r.dx[row * D + d] = caracal::round_to_bf16(dx_row[d]);
        double* dwd_row = &r.dw_down[(e * D + d) * I];
        // B5: dW_down from the weighted hidden as the kernels store it, bf16(g * hidden).
        for (size_t j = 0; j < I; ++j) dwd_row[j] += dy_row[d] * r.scaled_activation[row * I + j];
      }
    }
  }
  return r;
}

// ---- Checks --------------------------------------------------------------------------------------

// dL/dg: the tolerance per row and the relative Frobenius error over all rows (measured: 1.9e-6 at
// most).
constexpr RouterGradBound kRouterGradBound{1e-3, 1e-4, 1e-5};

// Bounds of one expert's fp32 weight gradient (relative Frobenius), about 3x the largest measured
// on an H200: dW_gate/dW_up 2.6e-4; dW_down 8e-7 (the reference takes bf16(g * hidden)
// as the kernels do, so only fp32 summation order differs).
constexpr double kGateUpGradBound = 1e-3;
constexpr double kDownGradBound = 3e-6;

// One expert's fp32 gradient against the reference: relative Frobenius error <= `bound`, no NaN;
// `value(i)` reads element i of the expert's [rows][cols] gradient in the reference's order.
void expect_gradient_close(const std::string& what, const double* ref, size_t count,
                           const std::function<float(size_t)>& value, double bound, double& worst) {
  size_t nan_count = 0;
  double err2 = 0.0, ref2 = 0.0;
  for (size_t i = 0; i < count; ++i) {
    const double v = double(value(i));
    if (std::isnan(v)) {
      ++nan_count;
      continue;
    }
    err2 += (v - ref[i]) * (v - ref[i]);
    ref2 += ref[i] * ref[i];
  }
  EXPECT_EQ(nan_count, 0u) << what << " still holds NaN";
  const double rel = ref2 > 0.0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  EXPECT_LE(rel, bound) << what << ": relative Frobenius error " << rel;
  worst = std::max(worst, rel);
}

// Per expert: dW_gate, dW_up (rows interleaved in the kernel's output) and dW_down against the
// reference; an expert without rows must get exact zeros.
void expect_weight_grads(const Problem& p, const Reference& ref, const Outputs& out) {
  const size_t D = size_t(p.c.hidden), I = size_t(p.c.intermediate);
  double worst_gate = 0.0, worst_up = 0.0, worst_down = 0.0;
  for (size_t e = 0; e < size_t(p.num_experts); ++e) {
    const float* gu = &out.dw_gate_up[e * 2 * I * D];
    const float* down = &out.dw_down[e * D * I];
    const std::string tag = " of expert " + std::to_string(e);
    if (p.c.counts[e] == 0) {
      size_t nonzero = 0;
      for (size_t i = 0; i < 2 * I * D; ++i) nonzero += gu[i] != 0.0f;  // NaN counts too
      for (size_t i = 0; i < D * I; ++i) nonzero += down[i] != 0.0f;
      EXPECT_EQ(nonzero, 0u) << "weight gradients" << tag << " (no rows) must be exactly zero";
      continue;
    }
    auto interleaved = [&](bool is_up) {
      return [=](size_t i) {
        const size_t j = i / D, d = i % D;
        return gu[size_t(gate_up_row(int64_t(j), is_up)) * D + d];
      };
    };
    expect_gradient_close("dW_gate" + tag, &ref.dw_gate[e * I * D], I * D, interleaved(false), kGateUpGradBound,
                          worst_gate);
    expect_gradient_close("dW_up" + tag, &ref.dw_up[e * I * D], I * D, interleaved(true), kGateUpGradBound, worst_up);
    expect_gradient_close("dW_down" + tag, &ref.dw_down[e * D * I], D * I, [&](size_t i) { return down[i]; },
                          kDownGradBound, worst_down);
  }
  std::cout << "  dW_gate: relative Frobenius error " << worst_gate << " (worst expert)\n"
            << "  dW_up: relative Frobenius error " << worst_up << " (worst expert)\n"
            << "  dW_down: relative Frobenius error " << worst_down << " (worst expert)\n";
}

// A fresh problem of case `c` run with `o`, every output against the reference.
void check_against_reference(const Case& c, const RunOptions& o) {
  Problem p;
  Outputs out;
  ASSERT_NO_FATAL_FAILURE(run_case(p, c, o, out));
  const Reference ref = reference_backward(p);
  const size_t D = size_t(c.hidden), I = size_t(c.intermediate);
  expect_half_close("d_gate", false, p.rows, c.counts, I, ref.d_gate, out.d_gate_up, kDgradBound);
  expect_half_close("d_up", true, p.rows, c.counts, I, ref.d_up, out.d_gate_up, kDgradBound);
  expect_padding("d_gate_up", p.rows, c.counts, 2 * I, out.d_gate_up);
  expect_close("scaled_activation", p.rows, c.counts, I, ref.scaled_activation, out.scaled_activation,
               kScaledHiddenBound);
  expect_padding("scaled_activation", p.rows, c.counts, I, out.scaled_activation);
  expect_close("dx", p.rows, c.counts, D, ref.dx, out.dx, kDxBound);
  expect_padding("dx", p.rows, c.counts, D, out.dx);
  expect_router_grad(p, p.gates, ref.dg, ref.dg_scale, out.dg, kRouterGradBound);
  expect_gate_edge_rows(p, p.gates, p.hidden, out.d_gate_up, out.scaled_activation);
  expect_weight_grads(p, ref, out);
}

// The bounds are tight enough to catch small systematic errors: one expert's dx rows or weight
// gradient 0.5% off.
TEST(GroupedGemmBackwardChecks, CatchDeliberateErrors) {
  CARACAL_REQUIRE_GPU();
  Problem p;
  Outputs out;
  ASSERT_NO_FATAL_FAILURE(run_case(p, kChecksCase, RunOptions{}, out));
  const Reference ref = reference_backward(p);
  const size_t D = size_t(p.c.hidden), I = size_t(p.c.intermediate);
  ASSERT_NO_FATAL_FAILURE(expect_catches_expert_off("dx", p.rows, D, ref.dx, out.dx, kDxBound));
  // One expert's dW_gate 0.5% off: relative error 5e-3 against a bound of kGateUpGradBound.
  double err2 = 0.0, ref2 = 0.0;
  for (size_t j = 0; j < I; ++j) {
    for (size_t d = 0; d < D; ++d) {
      const double want = ref.dw_gate[(4 * I + j) * D + d];
      const double got = 1.005 * double(out.dw_gate_up[4 * 2 * I * D + size_t(gate_up_row(int64_t(j), false)) * D + d]);
      err2 += (got - want) * (got - want);
      ref2 += want * want;
    }
  }
  EXPECT_GT(std::sqrt(err2 / ref2), kGateUpGradBound) << "an expert's dW_gate 0.5% off passed";
}

std::vector<Case> reference_cases() {
  return with_routed_cases({
      // kEdgeCounts' 64/65 rows also end an expert's K in the middle of a 64-row step (weight
      // gradients).
      {"edge_counts", 256, 128, kEdgeCounts},
      // D = 320, I = 192: partial N tiles in the row GEMMs (I and D), partial M and N tiles in both
      // weight gradients (2I = 384 and D = 320 rows; D and I columns).
      {"partial_tiles", 320, 192, {200, 0, 77, 129}},
      // 32 k tiles in the dgrad, 11 in the weight gradients of the larger expert.
      {"long_k", 2048, 128, {700, 60}},
  });
}

// ---- GPU tests ----------------------------------------------------------------------------------

class GroupedGemmBackwardReference : public ::testing::TestWithParam<Case> {};

TEST_P(GroupedGemmBackwardReference, MatchesFp64Reference) {
  CARACAL_REQUIRE_GPU();
  ASSERT_NO_FATAL_FAILURE(check_against_reference(GetParam(), RunOptions{}));
}

TEST_P(GroupedGemmBackwardReference, MatchesWithoutCounts) {
  CARACAL_REQUIRE_GPU();
  RunOptions o;
  o.pass_counts = false;
  ASSERT_NO_FATAL_FAILURE(check_against_reference(GetParam(), o));
}

TEST_P(GroupedGemmBackwardReference, MatchesWithATileQueue) {
  CARACAL_REQUIRE_GPU();
  RunOptions o;
  o.tile_queue = true;
  ASSERT_NO_FATAL_FAILURE(check_against_reference(GetParam(), o));
}

INSTANTIATE_TEST_SUITE_P(Cases, GroupedGemmBackwardReference, ::testing::ValuesIn(reference_cases()), case_name);

// Each output tile (and each dg partial) has one owner and a fixed K order, the partials are added
// in a fixed order: nothing may depend on the run, the grid size or a tile queue.
TEST(GroupedGemmBackwardDeterminism, BitwiseAcrossRunsAndGridSizes) {
  CARACAL_REQUIRE_GPU();
  Problem p;
  Outputs first;
  ASSERT_NO_FATAL_FAILURE(run_case(p, kDeterminismCase, RunOptions{}, first));
  for (int num_ctas : {1, 7, 0, 0}) {
    SCOPED_TRACE("num_ctas " + std::to_string(num_ctas));
    RunOptions o;
    o.num_ctas = num_ctas;
    o.tile_queue = num_ctas != 0;  // the dgrad and dx GEMMs both ways
    Outputs again;
    ASSERT_NO_FATAL_FAILURE(run_backward(p, o, again));
    EXPECT_TRUE(same_bits(first.d_gate_up, again.d_gate_up)) << "d_gate_up differs";
    EXPECT_TRUE(same_bits(first.scaled_activation, again.scaled_activation)) << "scaled_activation differs";
    EXPECT_TRUE(same_bits(first.dx, again.dx)) << "dx differs";
    EXPECT_TRUE(same_bits(first.dg, again.dg)) << "dg differs";
    EXPECT_TRUE(same_bits(first.dw_gate_up, again.dw_gate_up)) << "dW_gate_up differs";
    EXPECT_TRUE(same_bits(first.dw_down, again.dw_down)) << "dW_down differs";
  }
}

// bf16 weight gradients are the fp32 ones rounded once to nearest even, bit for bit: experts with
// 0, 1, tile±1 rows, partial tiles, and D = 320 (dW_down's second 64-row slice of its last M tile
// lies past the gradient and must not spill into the next expert).
TEST(GroupedGemmBackwardBf16Grads, AreTheFp32GradientsRoundedOnce) {
  CARACAL_REQUIRE_GPU();
  for (const Case& c : reference_cases()) {
    SCOPED_TRACE("case " + c.name);
    Problem p;
    Outputs f32, bf16;
    ASSERT_NO_FATAL_FAILURE(run_case(p, c, RunOptions{}, f32));
    RunOptions o;
    o.bf16_weight_grads = true;
    ASSERT_NO_FATAL_FAILURE(run_backward(p, o, bf16));
    const auto expect_rounded = [](const std::vector<float>& wide, const std::vector<uint16_t>& narrow,
                                   const char* what) {
      ASSERT_EQ(wide.size(), narrow.size());
      size_t differ = 0;
      for (size_t i = 0; i < wide.size(); ++i) differ += caracal::bf16_bits(wide[i]) != narrow[i];
      EXPECT_EQ(differ, 0u) << what << ": elements that are not bf16(fp32 gradient), of " << wide.size();
    };
    expect_rounded(f32.dw_gate_up, bf16.dw_gate_up_bf16, "dW_gate_up");
    expect_rounded(f32.dw_down, bf16.dw_down_bf16, "dW_down");
  }
}

// The backward over a ring, window by window (caracal/schedule_view.hpp: a macrobatch in buffer
// rows [0, R), as MoELayer walks it): each window's x rows copied into ring buffers, its up/gate
// tiles recomputed there, then the dgrad (d_gate_up over gate_up, as the layer runs it), dx and the
// weight gradients over the window, the weight gradients of experts cut by a window's edges
// continuing from fp32 partials (bf16 ones through two partial buffers in turn). Every output is
// bitwise the whole pass's: rings of 128 rows (expert 0's 300 rows over three windows, its sum
// continued twice) and 384, fp32 and bf16 weight gradients, W_gate_up interleaved and in halves
// (an fp32 dW_gate_up in halves continues from its own rows in that order).
TEST(GroupedGemmBackwardWindows, RingWindowsGiveTheWholePassBits) {
  CARACAL_REQUIRE_GPU();
  for (const bool bf16 : {false, true}) {
    for (const int ring : {128, 384}) {
      for (const bool halves : {false, true}) {
        SCOPED_TRACE(std::string(bf16 ? "bf16" : "fp32") + " weight gradients, a ring of " + std::to_string(ring) +
                     (halves ? ", W_gate_up in [gate; up] halves" : ""));
        Problem p;
        RunOptions o;
        o.bf16_weight_grads = bf16;
        o.halves = halves;
        Outputs whole;
        ASSERT_NO_FATAL_FAILURE(run_case(p, kDeterminismCase, o, whole));
        const size_t D = size_t(p.c.hidden), I = size_t(p.c.intermediate);
        const size_t rows = size_t(p.rows.offset.back());  // rows past the schedule's are not written
        DeviceBuffer<uint16_t> ring_x, ring_dy, ring_gate_up, ring_activation, ring_dx;
        ASSERT_NO_FATAL_FAILURE(ring_x.allocate(size_t(ring) * D));
        ASSERT_NO_FATAL_FAILURE(ring_dy.allocate(size_t(ring) * D));
        ASSERT_NO_FATAL_FAILURE(ring_gate_up.allocate(size_t(ring) * 2 * I));
        ASSERT_NO_FATAL_FAILURE(ring_activation.allocate(size_t(ring) * I));
        ASSERT_NO_FATAL_FAILURE(ring_dx.allocate(size_t(ring) * D));
        DeviceBuffer<float> partials[2];
        for (auto& b : partials) ASSERT_NO_FATAL_FAILURE(b.allocate(caracal::gemm::weight_grad_partial_floats(p.c.hidden, p.c.intermediate)));
        for (auto* b : {&p.d_dg, &p.d_workspace, &p.d_dw_gate_up, &p.d_dw_down}) ASSERT_NO_FATAL_FAILURE(b->poison());
        for (auto* b : {&p.d_dw_gate_up_bf16, &p.d_dw_down_bf16}) ASSERT_NO_FATAL_FAILURE(b->poison());
        // Each window's row outputs, gathered at their schedule rows.
        std::vector<uint16_t> gate_up(rows * 2 * I), activation(rows * I), d_gate_up(rows * 2 * I),
            scaled_activation(rows * I), dx(rows * D);
        const auto rows_of = [](const DeviceBuffer<uint16_t>& ring_buffer, std::vector<uint16_t>& out, size_t first,
                                size_t count, size_t cols) {
          ASSERT_EQ(cudaMemcpy(out.data() + first * cols, ring_buffer.get(), count * cols * 2, cudaMemcpyDeviceToHost),
                    cudaSuccess);
        };
        const int windows = (p.rows.capacity + ring - 1) / ring;
        for (int w = 0; w < windows; ++w) {
          const int first = w * ring, end = std::min(first + ring, p.rows.capacity);
          ScheduleView view = p.schedule(true);
          view.ring_rows = ring;
          view.first_row = first;
          view.end_row = end;
          for (auto* b : {&ring_gate_up, &ring_activation, &ring_dx}) ASSERT_NO_FATAL_FAILURE(b->poison());
          const size_t n = size_t(end - first);
          CARACAL_ASSERT_CUDA(cudaMemcpy(ring_x.get(), p.d_x.get() + size_t(first) * D, n * D * 2, cudaMemcpyDeviceToDevice));
          CARACAL_ASSERT_CUDA(cudaMemcpy(ring_dy.get(), p.d_dy.get() + size_t(first) * D, n * D * 2, cudaMemcpyDeviceToDevice));
          auto up = up_gate_args(p, view, ring_activation.get(), ring_gate_up.get());
          up.x = as_bf16(ring_x.get());
          ASSERT_NO_THROW(caracal::gemm::grouped_up_gate_swiglu(up, nullptr));
          CARACAL_ASSERT_CUDA(cudaDeviceSynchronize());
          const size_t real = std::min(n, rows > size_t(first) ? rows - size_t(first) : 0);
          ASSERT_NO_FATAL_FAILURE(rows_of(ring_gate_up, gate_up, size_t(first), real, 2 * I));
          ASSERT_NO_FATAL_FAILURE(rows_of(ring_activation, activation, size_t(first), real, I));

          auto dgrad = dgrad_args(p, view, 0);
          dgrad.dy = as_bf16(ring_dy.get());
          dgrad.gate_up = as_bf16(ring_gate_up.get());
          dgrad.d_gate_up_out = as_bf16(ring_gate_up.get());  // in place, as the layer runs it
          dgrad.scaled_activation_out = as_bf16(ring_activation.get());
          ASSERT_NO_THROW(caracal::gemm::grouped_down_dgrad_swiglu(dgrad, nullptr));
          auto grads = weight_args(p, view, o);
          grads.x = as_bf16(ring_x.get());
          grads.dy = as_bf16(ring_dy.get());
          grads.d_gate_up = as_bf16(ring_gate_up.get());
          grads.scaled_activation = as_bf16(ring_activation.get());
          grads.partial_in = w > 0 ? partials[(w + 1) % 2].get() : nullptr;
          grads.partial_out = partials[w % 2].get();
          ASSERT_NO_THROW(caracal::gemm::grouped_weight_grads(grads, nullptr));
          auto dx_window = dx_args(p, view, 0, o.halves);
          dx_window.d_gate_up = as_bf16(ring_gate_up.get());
          dx_window.dx_out = as_bf16(ring_dx.get());
          ASSERT_NO_THROW(caracal::gemm::grouped_gate_up_dgrad(dx_window, nullptr));
          CARACAL_ASSERT_CUDA(cudaDeviceSynchronize());
          ASSERT_NO_FATAL_FAILURE(rows_of(ring_gate_up, d_gate_up, size_t(first), real, 2 * I));
          ASSERT_NO_FATAL_FAILURE(rows_of(ring_activation, scaled_activation, size_t(first), real, I));
          ASSERT_NO_FATAL_FAILURE(rows_of(ring_dx, dx, size_t(first), real, D));
        }
        Outputs windowed;
        ASSERT_NO_FATAL_FAILURE(p.d_dg.download(windowed.dg));
        ASSERT_NO_FATAL_FAILURE(p.d_dw_gate_up.download(windowed.dw_gate_up));
        ASSERT_NO_FATAL_FAILURE(p.d_dw_down.download(windowed.dw_down));
        ASSERT_NO_FATAL_FAILURE(p.d_dw_gate_up_bf16.download(windowed.dw_gate_up_bf16));
        ASSERT_NO_FATAL_FAILURE(p.d_dw_down_bf16.download(windowed.dw_down_bf16));
        const auto first_rows = [](const std::vector<uint16_t>& v, size_t count) {
          return std::vector<uint16_t>(v.begin(), v.begin() + std::ptrdiff_t(count));
        };
        EXPECT_TRUE(same_bits(first_rows(p.gate_up, rows * 2 * I), gate_up)) << "the forward's gate_up differs";
        EXPECT_TRUE(same_bits(first_rows(p.hidden, rows * I), activation)) << "the forward's activation differs";
        EXPECT_TRUE(same_bits(first_rows(whole.d_gate_up, rows * 2 * I), d_gate_up)) << "d_gate_up differs";
        EXPECT_TRUE(same_bits(first_rows(whole.scaled_activation, rows * I), scaled_activation))
            << "scaled_activation differs";
        EXPECT_TRUE(same_bits(first_rows(whole.dx, rows * D), dx)) << "dx differs";
        EXPECT_TRUE(same_bits(whole.dg, windowed.dg)) << "dg differs";
        if (bf16) {
          EXPECT_TRUE(same_bits(whole.dw_gate_up_bf16, windowed.dw_gate_up_bf16)) << "dW_gate_up (bf16) differs";
          EXPECT_TRUE(same_bits(whole.dw_down_bf16, windowed.dw_down_bf16)) << "dW_down (bf16) differs";
        } else {
          EXPECT_TRUE(same_bits(whole.dw_gate_up, windowed.dw_gate_up)) << "dW_gate_up differs";
          EXPECT_TRUE(same_bits(whole.dw_down, windowed.dw_down)) << "dW_down differs";
        }
      }
    }
  }
}

// W_gate_up as Hugging Face's [gate; up] halves, read by dx and written by dW_gate_up in place
// through the gate/up view: dx bitwise the interleaved layout's, dW_gate_up its rows permuted bit
// for bit, fp32 and bf16 gradients, over the reference cases (0, 1, tile +- 1 rows an expert).
TEST(GroupedGemmBackwardLayout, HalvesReadAndWrittenInPlaceGiveTheInterleavedBits) {
  CARACAL_REQUIRE_GPU();
  for (const Case& c : reference_cases()) {
    for (const bool bf16 : {false, true}) {
      SCOPED_TRACE("case " + c.name + (bf16 ? ", bf16 weight gradients" : ", fp32 weight gradients"));
      Problem p;
      RunOptions o;
      o.bf16_weight_grads = bf16;
      Outputs interleaved, halves;
      ASSERT_NO_FATAL_FAILURE(run_case(p, c, o, interleaved));
      o.halves = true;
      ASSERT_NO_FATAL_FAILURE(run_backward(p, o, halves));
      const size_t L = size_t(p.num_experts), I = size_t(c.intermediate), D = size_t(c.hidden);
      EXPECT_TRUE(same_bits(interleaved.d_gate_up, halves.d_gate_up)) << "d_gate_up differs";
      EXPECT_TRUE(same_bits(interleaved.dx, halves.dx)) << "dx differs";
      if (bf16) {
        EXPECT_TRUE(same_bits(interleaved_to_halves(interleaved.dw_gate_up_bf16, L, I, D), halves.dw_gate_up_bf16))
            << "dW_gate_up (bf16) is not the interleaved one's rows in halves order";
        EXPECT_TRUE(same_bits(interleaved.dw_down_bf16, halves.dw_down_bf16)) << "dW_down (bf16) differs";
      } else {
        EXPECT_TRUE(same_bits(interleaved_to_halves(interleaved.dw_gate_up, L, I, D), halves.dw_gate_up))
            << "dW_gate_up is not the interleaved one's rows in halves order";
        EXPECT_TRUE(same_bits(interleaved.dw_down, halves.dw_down)) << "dW_down differs";
      }
    }
  }
}

// All experts empty: the row kernels write nothing, every weight gradient is exactly zero.
TEST(GroupedGemmBackwardEmpty, EmptyLayerZeroesOnlyTheGradients) {
  CARACAL_REQUIRE_GPU();
  Problem p;
  Outputs out;
  ASSERT_NO_FATAL_FAILURE(run_case(p, kEmptyCase, RunOptions{}, out));
  for (const auto* v : {&out.d_gate_up, &out.scaled_activation, &out.dx}) EXPECT_EQ(touched(*v), 0u);
  size_t dg_written = 0, nonzero = 0;
  for (float v : out.dg) dg_written += float_bits(v) != kPoisonF32;
  for (float v : out.dw_gate_up) nonzero += float_bits(v) != 0u;
  for (float v : out.dw_down) nonzero += float_bits(v) != 0u;
  EXPECT_EQ(dg_written, 0u) << "dg was written";
  EXPECT_EQ(nonzero, 0u) << "weight gradients must be +0";
}

// No row buffers at all: the row kernels launch nothing (row pointers may be null), the weight
// gradients are zeroed.
TEST(GroupedGemmBackwardEmpty, ZeroCapacityZeroesTheGradients) {
  CARACAL_REQUIRE_GPU();
  const int D = 128, I = 64, L = 2;
  DeviceBuffer<int32_t> offsets;
  ASSERT_NO_FATAL_FAILURE(offsets.upload({0, 0, 0}));
  DeviceBuffer<uint16_t> w;
  ASSERT_NO_FATAL_FAILURE(w.allocate(size_t(L) * 2 * I * D));
  DeviceBuffer<float> dw_gate_up, dw_down;
  ASSERT_NO_FATAL_FAILURE(dw_gate_up.allocate(size_t(L) * 2 * I * D));
  ASSERT_NO_FATAL_FAILURE(dw_down.allocate(size_t(L) * D * I));
  ASSERT_NO_FATAL_FAILURE(dw_gate_up.poison());
  ASSERT_NO_FATAL_FAILURE(dw_down.poison());
  const ScheduleView rows{offsets.get(), nullptr, L, 0};

  auto dgrad = kernel_args<DownDgradSwigluArgs>(rows, D, I);
  dgrad.w_down = as_bf16(w.get());
  EXPECT_NO_THROW(caracal::gemm::grouped_down_dgrad_swiglu(dgrad, nullptr));
  auto dx = kernel_args<GateUpDgradArgs>(rows, D, I);
  dx.w_gate_up = as_bf16(w.get());
  EXPECT_NO_THROW(caracal::gemm::grouped_gate_up_dgrad(dx, nullptr));
  auto wg = kernel_args<WeightGradArgs>(rows, D, I);
  wg.d_w_gate_up = dw_gate_up.get();
  wg.d_w_down = dw_down.get();
  EXPECT_NO_THROW(caracal::gemm::grouped_weight_grads(wg, nullptr));
  CARACAL_ASSERT_CUDA(cudaDeviceSynchronize());

  std::vector<float> a, b;
  ASSERT_NO_FATAL_FAILURE(dw_gate_up.download(a));
  ASSERT_NO_FATAL_FAILURE(dw_down.download(b));
  size_t nonzero = 0;
  for (float v : a) nonzero += float_bits(v) != 0u;
  for (float v : b) nonzero += float_bits(v) != 0u;
  EXPECT_EQ(nonzero, 0u);
}

// ---- Host-only tests ----------------------------------------------------------------------------

// Arguments that pass validation (the pointers fake, never read).
DownDgradSwigluArgs valid_dgrad_args() {
  auto a = kernel_args<DownDgradSwigluArgs>(fake_rows(), 256, 128);
  a.dy = a.w_down = a.gate_up = fake_ptr();
  a.gates = fake_ptr<const float>();
  a.d_gate_up_out = a.scaled_activation_out = fake_ptr();
  a.d_gates_out = a.workspace = fake_ptr<float>();
  return a;
}

GateUpDgradArgs valid_dx_args() {
  auto a = kernel_args<GateUpDgradArgs>(fake_rows(), 256, 128);
  a.d_gate_up = a.w_gate_up = fake_ptr();
  a.dx_out = fake_ptr();
  return a;
}

WeightGradArgs valid_weight_args() {
  auto a = kernel_args<WeightGradArgs>(fake_rows(), 256, 128);
  a.x = a.dy = a.d_gate_up = a.scaled_activation = fake_ptr();
  a.d_w_gate_up = a.d_w_down = fake_ptr<float>();
  return a;
}

TEST(GroupedGemmBackwardArgs, DgradRejectsBadArguments) {
  const auto with = calls_with(valid_dgrad_args(), &caracal::gemm::grouped_down_dgrad_swiglu);
  expect_error(with([](auto& a) { a.hidden = 100; }),
               {"grouped_down_dgrad_swiglu", "hidden (D)", "multiple of 64", "100"});
  expect_error(with([](auto& a) { a.intermediate = 96; }), {"intermediate (I)", "96"});
  expect_error(with([](auto& a) { a.rows.row_capacity = 100; }), {"rows.row_capacity", "100"});
  expect_error(with([](auto& a) { a.rows.expert_offset = nullptr; }), {"rows.expert_offset"});
  expect_error(with([](auto& a) { a.dy = nullptr; }), {"dy must be", "null"});
  expect_error(with([](auto& a) { a.w_down = fake_ptr(2); }), {"w_down", "16-byte"});
  expect_error(with([](auto& a) { a.gate_up = nullptr; }), {"gate_up"});
  expect_error(with([](auto& a) { a.gates = nullptr; }), {"gates"});
  expect_error(with([](auto& a) { a.d_gate_up_out = fake_ptr(8); }), {"d_gate_up_out", "16-byte"});
  expect_error(with([](auto& a) { a.scaled_activation_out = nullptr; }), {"scaled_activation_out"});
  expect_error(with([](auto& a) { a.d_gates_out = nullptr; }), {"d_gates_out"});
  expect_error(with([](auto& a) { a.workspace = nullptr; }), {"workspace"});
  expect_error(with([](auto& a) { a.num_ctas = -1; }), {"num_ctas", "-1"});
  expect_error(with([](auto& a) { a.tile_queue = fake_ptr<uint32_t>(4); }), {"tile_queue must be 16-byte aligned"});
  expect_tile_queue_cap(with, "grouped_down_dgrad_swiglu", 300);
}

TEST(GroupedGemmBackwardArgs, DxRejectsBadArguments) {
  const auto with = calls_with(valid_dx_args(), &caracal::gemm::grouped_gate_up_dgrad);
  expect_error(with([](auto& a) { a.hidden = 7000; }),
               {"grouped_gate_up_dgrad", "hidden (D)", "7000"});
  expect_error(with([](auto& a) { a.intermediate = 0; }), {"intermediate (I)", "got 0"});
  expect_error(with([](auto& a) { a.rows.num_experts = 0; }), {"rows.num_experts"});
  expect_error(with([](auto& a) { a.d_gate_up = fake_ptr(2); }), {"d_gate_up", "16-byte"});
  expect_error(with([](auto& a) { a.w_gate_up = nullptr; }), {"w_gate_up"});
  expect_error(with([](auto& a) { a.dx_out = nullptr; }), {"dx_out"});
  expect_error(with([](auto& a) { a.tile_queue = fake_ptr<uint32_t>(4); }), {"tile_queue must be 16-byte aligned"});
  expect_tile_queue_cap(with, "grouped_gate_up_dgrad", 257);
}

TEST(GroupedGemmBackwardArgs, WeightGradsRejectBadArguments) {
  const auto with = calls_with(valid_weight_args(), &caracal::gemm::grouped_weight_grads);
  expect_error(with([](auto& a) { a.hidden = -64; }), {"grouped_weight_grads", "hidden (D)", "-64"});
  // Windows of the rows: bf16 gradients carry their sums across the edges in fp32 partials.
  const auto bf16_window = [](int first_row, int end_row) {
    return [=](WeightGradArgs& a) {
      a.d_w_gate_up = nullptr;
      a.d_w_gate_up_bf16 = fake_ptr();
      a.rows.first_row = first_row;
      a.rows.end_row = end_row;
    };
  };
  expect_error(with(bf16_window(128, 0)), {"bf16 gradients over a window from rows.first_row = 128", "partial_in"});
  expect_error(with(bf16_window(0, 512)), {"rows.end_row = 512", "row_capacity = 1024", "partial_out"});
  expect_error(with([&](auto& a) {
                 bf16_window(128, 512)(a);
                 a.partial_in = a.partial_out = fake_ptr<float>();
               }),
               {"partial_in and partial_out must be different buffers"});
  expect_error(with([](auto& a) { a.rows.end_row = 100; }), {"rows.end_row must be 0 (no end) or a multiple of 128", "got 100"});
  expect_error(with([](auto& a) {
                 a.rows.ring_rows = 256;
                 a.rows.first_row = 128;
                 a.rows.end_row = 384;
               }),
               {"over a ring (rows.ring_rows = 256)", "start at a multiple of ring_rows", "got [128, 384)"});
  expect_error(with([](auto& a) { a.rows.expert_count = fake_ptr<const int32_t>(2); }),
               {"rows.expert_count", "4-byte aligned"});
  expect_error(with([](auto& a) { a.x = nullptr; }), {"x must be", "null"});
  expect_error(with([](auto& a) { a.dy = fake_ptr(4); }), {"dy", "16-byte"});
  expect_error(with([](auto& a) { a.d_gate_up = nullptr; }), {"d_gate_up"});
  expect_error(with([](auto& a) { a.scaled_activation = nullptr; }), {"scaled_activation"});
  expect_error(with([](auto& a) { a.d_w_gate_up = nullptr; }), {"d_w_gate_up", "exactly one", "null for both"});
  expect_error(with([](auto& a) { a.d_w_down_bf16 = fake_ptr(); }), {"d_w_down_bf16", "exactly one", "both"});
  expect_error(with([](auto& a) {
                 a.d_w_gate_up = nullptr;
                 a.d_w_gate_up_bf16 = fake_ptr(2);
               }),
               {"d_w_gate_up_bf16", "16-byte"});
  expect_error(with([](auto& a) { a.d_w_down = fake_ptr<float>(4); }), {"d_w_down", "16-byte"});
  // With no rows the row buffers may be null, the gradients may not.
  expect_error(with([](auto& a) {
                 a.rows.row_capacity = 0;
                 a.x = a.dy = a.d_gate_up = a.scaled_activation = nullptr;
                 a.d_w_down = nullptr;
               }),
               {"d_w_down", "null"});
}

TEST(GroupedGemmBackwardArgs, WorkspaceHoldsOnePartialPerRowAndNTile) {
  using caracal::gemm::down_dgrad_workspace_floats;
  EXPECT_EQ(down_dgrad_workspace_floats(1024, 256), 1024u);
  EXPECT_EQ(down_dgrad_workspace_floats(1024, 320), 2048u);
  EXPECT_EQ(down_dgrad_workspace_floats(256, 2048), 2048u);
  EXPECT_EQ(down_dgrad_workspace_floats(0, 2048), 0u);
}

}  // namespace
