// Tests of the grouped-GEMM engine's forward kernels (up/gate + SwiGLU, down projection).
//   GPU: against an fp64 host reference with the bf16-rounding contract (F1-F3 of
//        caracal/reference.hpp) on fresh random inputs, outputs poisoned (NaN) first; experts with
//        0, 1, 63/64/65, 127/128/129 rows, partial N tiles, odd token counts, skewed routing;
//        empty layers; bitwise determinism across runs, grid sizes and the optional counts.
//   Host: argument validation (no GPU needed) and the interleaved up/gate layout.
#include "caracal/gemm/grouped_gemm.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "caracal/bf16.hpp"
#include "caracal/routing.hpp"
#include "gpu/gpu_test_util.hpp"
#include "gpu/grouped_gemm_test_support.hpp"

namespace {

using namespace caracal::test::gemm;
using caracal::gemm::DownProjArgs;
using caracal::gemm::gate_up_row;
using caracal::gemm::UpGateSwigluArgs;

// ---- Problems -----------------------------------------------------------------------------------

// The inputs of one case and the forward's output buffers.
struct Problem : ExpertInputs {
  DeviceBuffer<uint16_t> d_activation, d_gate_up, d_y;
};

void make_problem(Problem& p, const Case& c) {
  std::mt19937_64 rng(p.seed.value());
  ASSERT_NO_FATAL_FAILURE(make_inputs(p, c, rng));
  const size_t D = size_t(c.hidden), I = size_t(c.intermediate), cap = size_t(p.rows.capacity);
  ASSERT_NO_FATAL_FAILURE(p.d_activation.allocate(cap * I));
  ASSERT_NO_FATAL_FAILURE(p.d_gate_up.allocate(cap * 2 * I));
  ASSERT_NO_FATAL_FAILURE(p.d_y.allocate(cap * D));
}

struct RunOptions {
  int num_ctas = 0;
  bool pass_counts = true;
  bool store_gate_up = true;
  bool tile_queue = false;  // tiles from a tile queue instead of at a fixed stride
  bool halves = false;      // W_gate_up as [gate; up] halves (GateUpLayout::kHalves), read in place
};

struct Outputs {
  std::vector<uint16_t> hidden, gate_up, y;
};

// Poisons the outputs, runs up/gate + SwiGLU then down, downloads everything.
void run_forward(Problem& p, const RunOptions& o, Outputs& out) {
  for (auto* b : {&p.d_activation, &p.d_gate_up, &p.d_y}) ASSERT_NO_FATAL_FAILURE(b->poison());
  const ScheduleView rows = p.schedule(o.pass_counts);
  uint16_t* gate_up = o.store_gate_up ? p.d_gate_up.get() : nullptr;
  DeviceBuffer<uint32_t> queue;
  if (o.tile_queue) {
    ASSERT_NO_FATAL_FAILURE(allocate_tile_queue(queue));
  }
  auto up = up_gate_args(p, rows, p.d_activation.get(), gate_up, o.num_ctas);
  up.tile_queue = o.tile_queue ? queue.get() : nullptr;
  DeviceBuffer<uint16_t> halves;
  if (o.halves) {
    ASSERT_NO_FATAL_FAILURE(halves.upload(gate_up_halves(p)));
    up.w_gate_up = as_bf16(halves.get());
    up.w_gate_up_layout = caracal::gemm::GateUpLayout::kHalves;
  }
  ASSERT_NO_THROW(caracal::gemm::grouped_up_gate_swiglu(up, nullptr));
  auto down = kernel_args<DownProjArgs>(rows, p.c.hidden, p.c.intermediate, o.num_ctas);
  down.activation = as_bf16(p.d_activation.get());
  down.w_down = as_bf16(p.d_w_down.get());
  down.y_out = as_bf16(p.d_y.get());
  down.tile_queue = up.tile_queue;  // one after the other on one stream
  ASSERT_NO_THROW(caracal::gemm::grouped_down_proj(down, nullptr));

  CARACAL_ASSERT_CUDA(cudaDeviceSynchronize());
  ASSERT_NO_FATAL_FAILURE(p.d_activation.download(out.hidden));
  ASSERT_NO_FATAL_FAILURE(p.d_gate_up.download(out.gate_up));
  ASSERT_NO_FATAL_FAILURE(p.d_y.download(out.y));
}

// A fresh problem of case `c`, run once with `o`.
void run_case(Problem& p, const Case& c, const RunOptions& o, Outputs& out) {
  ASSERT_NO_FATAL_FAILURE(make_problem(p, c));
  ASSERT_NO_FATAL_FAILURE(run_forward(p, o, out));
}

// fp64 reference of the real rows with the bf16-rounding contract: gate, up (F1), hidden (F2)
// and y (F3), each rounded (through float) where the kernels store bf16. Indexed like the row
// buffers; padding rows stay 0.
struct Reference {
  std::vector<double> gate, up, hidden, y;
};


Reference reference_forward(const Problem& p) {
  const size_t D = size_t(p.c.hidden), I = size_t(p.c.intermediate);
  const size_t cap = size_t(p.rows.capacity);
  const std::vector<double> x = widen(p.x), wg = widen(p.w_gate), wu = widen(p.w_up),
                            wd = widen(p.w_down);
  Reference r;
  r.gate = r.up = r.hidden = std::vector<double>(cap * I, 0.0);
  r.y.assign(cap * D, 0.0);
  for (size_t e = 0; e < size_t(p.num_experts); ++e) {
    const size_t begin = size_t(p.rows.offset[e]);
    for (size_t row = begin; row < begin + size_t(p.c.counts[e]); ++row) {
      const double* xr = &x[row * D];
      for (size_t j = 0; j < I; ++j) {
        const double* g_row = &wg[(e * I + j) * D];
        const double* u_row = &wu[(e * I + j) * D];
        double g = 0.0, u = 0.0;
        for (size_t d = 0; d < D; ++d) {
          g += xr[d] * g_row[d];
          u += xr[d] * u_row[d];
        }
        g = caracal::round_to_bf16(g);
        u = caracal::round_to_bf16(u);
        r.gate[row * I + j] = g;
        r.up[row * I + j] = u;
        r.hidden[row * I + j] = caracal::round_to_bf16(silu(g) * u);
      }
      const double* hr = &r.hidden[row * I];
      for (size_t d = 0; d < D; ++d) {
        const double* w_row = &wd[(e * D + d) * I];
        double acc = 0.0;
        for (size_t j = 0; j < I; ++j) acc += hr[j] * w_row[j];
        r.y[row * D + d] = caracal::round_to_bf16(acc);
      }
    }
  }
  return r;
}

// A fresh problem of case `c` run with `o`, every output against the reference.
void check_against_reference(const Case& c, const RunOptions& o) {
  Problem p;
  Outputs out;
  ASSERT_NO_FATAL_FAILURE(run_case(p, c, o, out));
  const Reference ref = reference_forward(p);
  const size_t D = size_t(c.hidden), I = size_t(c.intermediate);
  expect_close("hidden", p.rows, c.counts, I, ref.hidden, out.hidden, kHiddenBound);
  expect_close("y", p.rows, c.counts, D, ref.y, out.y, kDownBound);
  expect_padding("hidden", p.rows, c.counts, I, out.hidden);
  expect_padding("y", p.rows, c.counts, D, out.y);
  if (o.store_gate_up) {
    expect_half_close("gate", false, p.rows, c.counts, I, ref.gate, out.gate_up, kGateUpBound);
    expect_half_close("up", true, p.rows, c.counts, I, ref.up, out.gate_up, kGateUpBound);
    expect_padding("gate_up", p.rows, c.counts, 2 * I, out.gate_up);
  } else {
    EXPECT_EQ(touched(out.gate_up), 0u) << "gate_up was written although gate_up_out was null";
  }
}

std::vector<Case> reference_cases() {
  return with_routed_cases({
      {"edge_counts", 256, 128, kEdgeCounts},
      // D = 320 and 2I = 384: the last N tile of both GEMMs is partial.
      {"partial_n_tiles", 320, 192, {200, 0, 77, 129}},
      // 32 k tiles in the up/gate GEMM: many laps of the stage ring inside one tile.
      {"long_k", 2048, 128, {130, 60}},
  });
}

// ---- GPU tests ----------------------------------------------------------------------------------

class GroupedGemmReference : public ::testing::TestWithParam<Case> {};

TEST_P(GroupedGemmReference, MatchesFp64Reference) {
  CARACAL_REQUIRE_GPU();
  ASSERT_NO_FATAL_FAILURE(check_against_reference(GetParam(), RunOptions{}));
}

TEST_P(GroupedGemmReference, MatchesWithoutCountsOrGateUp) {
  CARACAL_REQUIRE_GPU();
  RunOptions o;
  o.pass_counts = false;
  o.store_gate_up = false;
  ASSERT_NO_FATAL_FAILURE(check_against_reference(GetParam(), o));
}

TEST_P(GroupedGemmReference, MatchesWithATileQueue) {
  CARACAL_REQUIRE_GPU();
  RunOptions o;
  o.tile_queue = true;
  ASSERT_NO_FATAL_FAILURE(check_against_reference(GetParam(), o));
}

INSTANTIATE_TEST_SUITE_P(Cases, GroupedGemmReference, ::testing::ValuesIn(reference_cases()), case_name);

// The bounds are tight enough to catch small systematic errors: one expert's output rows 0.5%
// off (the largest expert: 300 of 814 rows), and one row of another expert never written.
TEST(GroupedGemmChecks, CatchDeliberateErrors) {
  CARACAL_REQUIRE_GPU();
  Problem p;
  Outputs out;
  ASSERT_NO_FATAL_FAILURE(run_case(p, kChecksCase, RunOptions{}, out));
  const Reference ref = reference_forward(p);
  const size_t D = size_t(p.c.hidden);
  ASSERT_NO_FATAL_FAILURE(expect_catches_expert_off("y", p.rows, D, ref.y, out.y, kDownBound));
  std::vector<uint16_t> dropped = out.y;
  const size_t row = size_t(p.rows.offset[3]) + 5;
  std::fill(dropped.begin() + int64_t(row * D), dropped.begin() + int64_t((row + 1) * D), uint16_t{0});
  EXPECT_NE(close_failures("y", p.rows, p.c.counts, D, ref.y, dropped, kDownBound, false), std::vector<std::string>{})
      << "a dropped row passed";
}

// Every output of two forward runs bit for bit.
void expect_same_forward_bits(const Outputs& want, const Outputs& got) {
  EXPECT_TRUE(same_bits(want.hidden, got.hidden)) << "hidden differs";
  EXPECT_TRUE(same_bits(want.gate_up, got.gate_up)) << "gate_up differs";
  EXPECT_TRUE(same_bits(want.y, got.y)) << "y differs";
}

// Each output tile has one owner and a fixed K order: nothing may depend on the grid size, the
// run, whether the optional counts let the kernels skip padding halves, or which CTA a tile queue
// hands each tile to.
TEST(GroupedGemmDeterminism, BitwiseAcrossRunsGridSizesAndCounts) {
  CARACAL_REQUIRE_GPU();
  Problem p;
  Outputs first;
  ASSERT_NO_FATAL_FAILURE(run_case(p, kDeterminismCase, RunOptions{}, first));
  for (int num_ctas : {1, 7, 0, 0}) {
    for (int variant = 0; variant < 3; ++variant) {
      const bool counts = variant != 1, queued = variant == 2;
      SCOPED_TRACE("num_ctas " + std::to_string(num_ctas) + (counts ? ", counts" : ", no counts") +
                   (queued ? ", tile queue" : ""));
      RunOptions o;
      o.num_ctas = num_ctas;
      o.pass_counts = counts;
      o.tile_queue = queued;
      Outputs again;
      ASSERT_NO_FATAL_FAILURE(run_forward(p, o, again));
      expect_same_forward_bits(first, again);
    }
  }
}

// W_gate_up as Hugging Face's [gate; up] halves, read in place through the gate/up view: the same
// bits as the interleaved copy.
TEST(GroupedGemmLayout, HalvesReadInPlaceGiveTheInterleavedBits) {
  CARACAL_REQUIRE_GPU();
  Problem p;
  Outputs interleaved;
  ASSERT_NO_FATAL_FAILURE(run_case(p, kDeterminismCase, RunOptions{}, interleaved));
  RunOptions o;
  o.halves = true;
  Outputs halves;
  ASSERT_NO_FATAL_FAILURE(run_forward(p, o, halves));
  expect_same_forward_bits(interleaved, halves);
}

// All experts empty: the kernels run over zero tiles and write nothing.
TEST(GroupedGemmEmpty, EmptyLayerWritesNothing) {
  CARACAL_REQUIRE_GPU();
  Problem p;
  Outputs out;
  ASSERT_NO_FATAL_FAILURE(run_case(p, kEmptyCase, RunOptions{}, out));
  for (const auto* v : {&out.hidden, &out.gate_up, &out.y}) EXPECT_EQ(touched(*v), 0u);
}

// No row buffers at all: nothing is launched (row pointers may be null).
TEST(GroupedGemmEmpty, ZeroCapacityLaunchesNothing) {
  CARACAL_REQUIRE_GPU();
  DeviceBuffer<int32_t> offsets;
  ASSERT_NO_FATAL_FAILURE(offsets.upload({0, 0}));
  DeviceBuffer<uint16_t> w;
  ASSERT_NO_FATAL_FAILURE(w.allocate(size_t(256) * 128));
  const ScheduleView rows{offsets.get(), nullptr, 1, 0};
  auto up = kernel_args<UpGateSwigluArgs>(rows, 128, 64);
  up.w_gate_up = as_bf16(w.get());
  EXPECT_NO_THROW(caracal::gemm::grouped_up_gate_swiglu(up, nullptr));
  auto down = kernel_args<DownProjArgs>(rows, 128, 64);
  down.w_down = as_bf16(w.get());
  EXPECT_NO_THROW(caracal::gemm::grouped_down_proj(down, nullptr));
  CARACAL_ASSERT_CUDA(cudaDeviceSynchronize());
}

TEST(GroupedGemmLayout, DeviceInterleaveMatchesHost) {
  CARACAL_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  const int L = 3, I = 192, D = 128;
  const auto gate = random_bf16(size_t(L) * I * D, 1.0, rng);
  const auto up = random_bf16(size_t(L) * I * D, 1.0, rng);
  std::vector<uint16_t> expected(size_t(L) * 2 * I * D);
  caracal::gemm::interleave_gate_up_weights_host(gate.data(), up.data(), expected.data(), L, I,
                                                    D);
  DeviceBuffer<uint16_t> d_gate, d_up, d_out;
  ASSERT_NO_FATAL_FAILURE(d_gate.upload(gate));
  ASSERT_NO_FATAL_FAILURE(d_up.upload(up));
  ASSERT_NO_FATAL_FAILURE(d_out.allocate(expected.size()));
  ASSERT_NO_THROW(caracal::gemm::interleave_gate_up_weights(
      as_bf16(d_gate.get()), as_bf16(d_up.get()), as_bf16(d_out.get()), L, I, D, nullptr));
  CARACAL_ASSERT_CUDA(cudaDeviceSynchronize());
  std::vector<uint16_t> got;
  ASSERT_NO_FATAL_FAILURE(d_out.download(got));
  EXPECT_TRUE(same_bits(got, expected));
}

// ---- Host-only tests ----------------------------------------------------------------------------

TEST(GroupedGemmLayout, GateUpRowsAlternateInGroupsOfEight) {
  EXPECT_EQ(gate_up_row(0, false), 0);
  EXPECT_EQ(gate_up_row(7, false), 7);
  EXPECT_EQ(gate_up_row(0, true), 8);
  EXPECT_EQ(gate_up_row(7, true), 15);
  EXPECT_EQ(gate_up_row(8, false), 16);
  EXPECT_EQ(gate_up_row(13, true), 29);
  // A bijection of [0, 2I).
  const int64_t I = 64;
  std::vector<int> hits(2 * I, 0);
  for (int64_t j = 0; j < I; ++j) {
    ++hits[size_t(gate_up_row(j, false))];
    ++hits[size_t(gate_up_row(j, true))];
  }
  for (int h : hits) EXPECT_EQ(h, 1);

  const std::vector<uint16_t> gate = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  const std::vector<uint16_t> up = {101, 102, 103, 104, 105, 106, 107, 108,
                                    109, 110, 111, 112, 113, 114, 115, 116};
  std::vector<uint16_t> out(32);
  caracal::gemm::interleave_gate_up_weights_host(gate.data(), up.data(), out.data(), 1, 16, 1);
  const std::vector<uint16_t> expected = {1,   2,   3,   4,   5,   6,   7,   8,   101, 102, 103,
                                          104, 105, 106, 107, 108, 9,   10,  11,  12,  13,  14,
                                          15,  16,  109, 110, 111, 112, 113, 114, 115, 116};
  EXPECT_EQ(out, expected);
}

// Arguments that pass validation (the pointers fake, never read).
UpGateSwigluArgs valid_up_args() {
  auto a = kernel_args<UpGateSwigluArgs>(fake_rows(), 256, 128);
  a.x = a.w_gate_up = fake_ptr();
  a.activation_out = fake_ptr();
  return a;
}

DownProjArgs valid_down_args() {
  auto a = kernel_args<DownProjArgs>(fake_rows(), 256, 128);
  a.activation = a.w_down = fake_ptr();
  a.y_out = fake_ptr();
  return a;
}

TEST(GroupedGemmArgs, UpGateRejectsBadArguments) {
  const auto with = calls_with(valid_up_args(), &caracal::gemm::grouped_up_gate_swiglu);
  expect_error(with([](auto& a) { a.hidden = 100; }),
               {"grouped_up_gate_swiglu", "hidden (D)", "multiple of 64", "100"});
  expect_error(with([](auto& a) { a.hidden = 0; }), {"hidden (D)", "got 0"});
  expect_error(with([](auto& a) { a.intermediate = 96; }),
               {"intermediate (I)", "multiple of 64", "96"});
  expect_error(with([](auto& a) { a.rows.num_experts = 0; }), {"rows.num_experts", ">= 1"});
  expect_error(with([](auto& a) { a.rows.row_capacity = 100; }),
               {"rows.row_capacity", "multiple of 128", "100"});
  expect_error(with([](auto& a) { a.rows.row_capacity = -128; }), {"rows.row_capacity", "-128"});
  expect_error(with([](auto& a) { a.rows.expert_offset = nullptr; }), {"rows.expert_offset"});
  expect_error(with([](auto& a) { a.rows.ring_rows = 200; }), {"rows.ring_rows must be 0 or a multiple of 128", "got 200"});
  expect_error(with([](auto& a) { a.rows.ring_rows = 256; }),  // a ring needs a window of at most its rows
               {"over a ring (rows.ring_rows = 256)", "at most ring_rows rows", "got [0, 0)"});
  expect_error(with([](auto& a) {
                 a.rows.ring_rows = 256;
                 a.rows.first_row = 256;
                 a.rows.end_row = 768;
               }),
               {"over a ring", "got [256, 768)"});
  expect_error(with([](auto& a) { a.rows.first_row = 100; }),
               {"rows.first_row must be a multiple of 128", "row_capacity = 1024", "got 100"});
  expect_error(with([](auto& a) { a.rows.first_row = 1152; }), {"rows.first_row", "got 1152"});
  expect_error(with([](auto& a) { a.rows.expert_count = fake_ptr<const int32_t>(2); }),
               {"rows.expert_count", "4-byte aligned"});
  expect_error(with([](auto& a) { a.x = nullptr; }), {"x must be", "null"});
  expect_error(with([](auto& a) { a.x = fake_ptr(2); }), {"x must be 16-byte aligned"});
  expect_error(with([](auto& a) { a.w_gate_up = nullptr; }), {"w_gate_up"});
  expect_error(with([](auto& a) { a.activation_out = fake_ptr(8); }), {"activation_out", "16-byte"});
  expect_error(with([](auto& a) { a.gate_up_out = fake_ptr(4); }), {"gate_up_out", "16-byte"});
  expect_error(with([](auto& a) { a.num_ctas = -1; }), {"num_ctas", ">= 0", "-1"});
  expect_error(with([](auto& a) { a.tile_queue = fake_ptr<uint32_t>(4); }), {"tile_queue must be 16-byte aligned"});
  expect_tile_queue_cap(with, "grouped_up_gate_swiglu", 300);
}

TEST(GroupedGemmArgs, DownRejectsBadArguments) {
  const auto with = calls_with(valid_down_args(), &caracal::gemm::grouped_down_proj);
  expect_error(with([](auto& a) { a.hidden = 7000; }),
               {"grouped_down_proj", "hidden (D)", "multiple of 64", "7000"});
  expect_error(with([](auto& a) { a.intermediate = -64; }), {"intermediate (I)", "-64"});
  expect_error(with([](auto& a) { a.rows.row_capacity = 129; }), {"rows.row_capacity", "129"});
  expect_error(with([](auto& a) { a.activation = fake_ptr(2); }), {"activation", "16-byte"});
  expect_error(with([](auto& a) { a.w_down = nullptr; }), {"w_down"});
  expect_error(with([](auto& a) { a.y_out = nullptr; }), {"y_out"});
  expect_error(with([](auto& a) { a.num_ctas = -5; }), {"num_ctas", "-5"});
}

TEST(GroupedGemmArgs, InterleaveRejectsBadArguments) {
  using caracal::gemm::interleave_gate_up_weights;
  expect_error(
      [] { interleave_gate_up_weights(fake_ptr(), fake_ptr(), fake_ptr(), 2, 12, 64, nullptr); },
      {"interleave_gate_up_weights", "intermediate (I)", "multiple of 8", "12"});
  expect_error(
      [] { interleave_gate_up_weights(fake_ptr(), fake_ptr(), fake_ptr(), 0, 16, 64, nullptr); },
      {"num_experts", ">= 1"});
  expect_error(
      [] { interleave_gate_up_weights(fake_ptr(), fake_ptr(2), fake_ptr(), 1, 16, 64, nullptr); },
      {"w_up", "16-byte"});
}

}  // namespace
