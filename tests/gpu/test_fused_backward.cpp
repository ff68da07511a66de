// The fused backward (src/fused/fused_backward.hpp) through MoELayer: every gradient the same bits
// as v1's separate launches (the shared expert's too: its dgrad and dx tiles run in macrobatch 0's
// launch, its dx stored straight into the exchange's slot, for token counts of one, odd, not a
// multiple of 128 and a multiple of 128, where the shared rows are read in place) — but dx at
// W > 1, which it sums per (token, rank) and macrobatch before one row goes home
// (dx_group_sums.cuh), checked against the reference that rounds there too, and v1's bits with a
// dx row per route — whatever the number of pulling CTAs and the ring (macrobatch 0's launch
// copies its x rows, the later ones follow an up/gate replay), with the rows of tokens on this GPU
// copied by idle warps or every row pulled, and within the fp64 reference's bounds; on loopback
// W = 1, 2, 4, 8 and adversarial routings (all routes to one expert, empty experts and ranks, -1
// slots, one token, k > 32). At W = 1 the reverse dispatch's sums ride on the last weight-gradient
// launch's idle warps; DxSumsOnWeightGrads holds them, with bf16 gradients, to v1's bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "caracal/moe_layer.hpp"
#include "gpu_test_util.hpp"
#include "moe_layer_test_support.hpp"

namespace caracal::layer_test {
namespace {

std::vector<LayerCase> backward_cases() {
  using R = RoutingCase;
  return {
      {"W1_uniform_shared_k2", 1, 133, 8, 2, true, false, kNormalized, R::kUniform},
      {"W1_one_token_k4", 1, 1, 8, 4, true, false, kNormalized, R::kUniform},
      {"W1_many_blocks_k8", 1, 1500, 8, 8, false, false, kNormalizedScaled, R::kZipf},
      {"W2_all_to_one_k4", 2, 700, 8, 4, true, false, kNormalized, R::kAllToOne},
      {"W4_empty_ranks_k2_unnormalized", 4, 253, 16, 2, true, true, kUnnormalized, R::kEmptyRanks},
      {"W8_empty_slots_k2", 8, 97, 16, 2, true, false, kNormalized, R::kEmptySlots},
      {"W8_all_slots_empty_k2", 8, 41, 8, 2, true, false, kNormalized, R::kAllEmpty},
      // Several of a token's rows on each rank (groups of many members), in two rounds of 32 slots.
      {"W2_duplicates_k36", 2, 45, 48, 36, true, false, kNormalized, R::kDuplicates},
      {"W4_uniform_k8", 4, 500, 16, 8, false, false, kNormalized, R::kUniform},
      // Token counts a multiple of 128: the shared expert reads x in place and its dx map covers
      // the whole slot (no clipped rows).
      {"W1_shared_in_place_k4", 1, 256, 8, 4, true, true, kNormalized, R::kZipf},
      {"W2_shared_in_place_k2", 2, 128, 8, 2, true, false, kUnnormalized, R::kUniform},
  };
}

class GpuFusedBackward : public testing::TestWithParam<LayerCase> {};

TEST_P(GpuFusedBackward, SameGradientBitsAsV1AcrossCommCtasAndRings) {
  CARACAL_REQUIRE_GPU();
  const LayerCase& c = GetParam();
  const SeededStep s(c, c.routing);
  const ReferenceLayer reference = reference_layer(c, s.weights);
  const std::vector<RankOutputs> v1 = run_once(c, s, v1_setup());
  expect_step_matches(c, s.step, reference_step(c, reference, s.step, 0), v1);
  const auto expect_ring = [&](int ring_rows, bool pull_all_rows) {
    const std::string ring = "ring " + std::to_string(ring_rows) + (pull_all_rows ? ", every row pulled" : "");
    SCOPED_TRACE(ring);
    const std::vector<RankOutputs> fused = run_once(c, s, fused_setup(0, ring_rows, pull_all_rows));
    const LoopbackLayer layer(c, s.weights, fused_setup(0, ring_rows));
    const bool grouped = layer.layer.groups_dx_rows();
    EXPECT_EQ(grouped, c.world > 1) << "the fused backward groups dx rows at W > 1 only";
    expect_step_matches(c, s.step, reference_step(c, reference, s.step, layer.layer.ring_rows(), false, grouped), fused);
    // y sums a token's rows per macrobatch (the forward's tests compare it with v1's).
    expect_same_bits_but_y(v1, fused, "fused backward against v1, " + ring, grouped);
    if (grouped) {
      LayerSetup per_route = fused_setup(0, ring_rows, pull_all_rows);
      per_route.experiments.dx_rows_per_route = true;
      expect_same_bits_but_y(v1, run_once(c, s, per_route), "fused backward, dx a row per route, against v1, " + ring);
    }
    expect_same_bits(fused, run_once(c, s, fused_setup(1, ring_rows, pull_all_rows)), "1 comm CTA per rank, " + ring);
    expect_same_bits(fused, run_once(c, s, fused_setup(7, ring_rows, pull_all_rows)), "7 comm CTAs per rank, " + ring);
    expect_same_bits(fused, run_once(c, s, fused_setup(3, ring_rows, pull_all_rows)), "3 comm CTAs per rank, " + ring);
  };
  expect_ring(0, false);    // the default ring: a balanced step in one macrobatch
  expect_ring(128, false);  // one block a macrobatch: replays, and a launch per block
  expect_ring(384, true);
}

INSTANTIATE_TEST_SUITE_P(Loopback, GpuFusedBackward, testing::ValuesIn(backward_cases()), case_name);

// Graphs and repeats: a layer stepping again (its counters rezeroed per launch) gives the same bits.
TEST(GpuFusedBackward, RepeatsBitwiseOnOneLayer) {
  CARACAL_REQUIRE_GPU();
  const LayerCase c{"repeat_W2", 2, 300, 8, 4, true, false, kNormalized, RoutingCase::kZipf};
  const SeededStep s(c, c.routing);
  LoopbackLayer l(c, s.weights, fused_setup(0, 256));
  const Stream stream;
  l.buffers.prepare(s.step, l.world);
  run_step(l.layer, l.buffers, stream);
  const std::vector<RankOutputs> first = l.buffers.download();
  for (int i = 0; i < 3; ++i) {
    l.buffers.prepare(s.step, l.world);
    run_step(l.layer, l.buffers, stream);
    expect_same_bits(first, l.buffers.download(), "run " + std::to_string(i + 2));
  }
}

// Elements of a poisoned output (every byte exchange_test::kNanByte) that nothing wrote.
template <typename T>
size_t unwritten(const std::vector<T>& out) {
  T poison;
  std::memset(&poison, exchange_test::kNanByte, sizeof(T));
  return static_cast<size_t>(
      std::count_if(out.begin(), out.end(), [&](const T& v) { return std::memcmp(&v, &poison, sizeof(T)) == 0; }));
}

// W = 1, routed weight gradients in bf16 (the bf16 kernel in CTA pairs carries the sums): dx,
// d topk_scores and every gradient written, with the sums on the last weight-gradient launch's
// idle warps, and the same bits as v1's launches, over a ring of one macrobatch and one of several
// (the sums ride on the last macrobatch's launch).
TEST(GpuFusedBackward, DxSumsOnWeightGradsSameBitsWithBf16Gradients) {
  CARACAL_REQUIRE_GPU();
  const LayerCase c{"W1_bf16_grads_k4", 1, 700, 8, 4, true, true, kNormalized, RoutingCase::kZipf};
  const SeededStep s(c, c.routing);
  const size_t L = static_cast<size_t>(c.experts), D = kHidden, I = kIntermediate;
  struct Outputs {
    RankOutputs rank;
    std::vector<uint16_t> d_w_gate_up, d_w_down;
  };
  const auto run = [&](const MoELayerOptions& o) {
    LoopbackLayer l(c, s.weights, o);
    l.buffers.prepare(s.step, l.world);
    const DeviceArray<uint16_t> d_w_gate_up(L * 2 * I * D), d_w_down(L * D * I);
    d_w_gate_up.poison();
    d_w_down.poison();
    std::vector<MoEBackwardArgs> args = l.buffers.backward_args();
    args[0].d_w_gate_up = nullptr;
    args[0].d_w_down = nullptr;
    args[0].d_w_gate_up_bf16 = bf16_out(d_w_gate_up);
    args[0].d_w_down_bf16 = bf16_out(d_w_down);
    const Stream stream;
    const MoEContext context = l.layer.forward(l.buffers.forward_args(), stream.get());
    l.layer.backward(args, context, stream.get());
    stream.sync();
    l.layer.check();
    return Outputs{l.buffers.download()[0], d_w_gate_up.download(), d_w_down.download()};
  };
  const Outputs apart = run(v1_setup().options);
  for (const int ring_rows : {0, 128}) {
    SCOPED_TRACE("ring " + std::to_string(ring_rows));
    const Outputs riding = run(fused_setup(0, ring_rows).options);
    // Every output poisoned before the step: equal bits must also be written ones.
    EXPECT_EQ(unwritten(riding.rank.dx), 0u) << "dx";
    EXPECT_EQ(unwritten(riding.rank.d_scores), 0u) << "d_topk_scores";
    EXPECT_EQ(unwritten(riding.d_w_gate_up), 0u) << "d_w_gate_up (bf16)";
    EXPECT_EQ(unwritten(riding.d_w_down), 0u) << "d_w_down (bf16)";
    EXPECT_EQ(unwritten(riding.rank.d_shared_w_gate_up), 0u) << "d_shared_w_gate_up";
    EXPECT_EQ(unwritten(riding.rank.d_shared_scale), 0u) << "d_shared_scale";
    exchange_test::expect_same_bits(riding.rank.dx, apart.rank.dx, "dx");
    exchange_test::expect_same_bits(riding.rank.d_scores, apart.rank.d_scores, "d_topk_scores");
    exchange_test::expect_same_bits(riding.d_w_gate_up, apart.d_w_gate_up, "d_w_gate_up (bf16)");
    exchange_test::expect_same_bits(riding.d_w_down, apart.d_w_down, "d_w_down (bf16)");
    exchange_test::expect_same_bits(riding.rank.d_shared_w_gate_up, apart.rank.d_shared_w_gate_up, "d_shared_w_gate_up");
    exchange_test::expect_same_bits(riding.rank.d_shared_scale, apart.rank.d_shared_scale, "d_shared_scale");
  }
}

}  // namespace
}  // namespace caracal::layer_test
