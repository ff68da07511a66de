// The fused backward (src/fused/fused_backward.hpp) through MoELayer: the same bits as the
// backward's separate launches on the fused path (MoELayerOptions::fused_backward = false) for
// every output and gradient (the shared expert's too: its dgrad and dx tiles run in macrobatch
// 0's launch, its dx stored straight into the exchange's slot, for token counts of one, odd, not a
// multiple of 128 and a multiple of 128, where the shared rows are read in place) — but dx at
// W > 1, which it sums per (token, rank) and macrobatch before one row goes home
// (dx_group_sums.cuh), checked against the reference that rounds there too — whatever the
// number of pulling CTAs and the ring (macrobatch 0's launch copies its x rows, the later ones
// follow an up/gate replay), with the dy rows of tokens on this GPU copied in the
// launch (the default), before it, or every row pulled in it, and within the fp64 reference's
// bounds; on loopback W = 1, 2, 4, 8 and adversarial routings (all routes to one expert, empty
// experts and ranks, -1 slots, one token, k > 32). Every output is the same bits whatever the comm
// CTAs. At W = 1 the fused backward's reverse-dispatch sums ride on the weight gradients' idle
// warps (MoELayerOptions::dx_sums_in_weight_grads), so the comparison with the separate launches
// holds them to reverse dispatch's own launch too; DxSumsOnWeightGrads does so for bf16 gradients.
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

MoELayerOptions options(bool fused_backward, int comm_ctas = 0, int ring_rows = 0, bool pull_all_rows = false) {
  MoELayerOptions o;
  o.fused_backward = fused_backward;
  o.fused_comm_ctas = comm_ctas;
  o.ring_rows = ring_rows;
  o.fused_pull_all_rows = pull_all_rows;
  return o;
}

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

TEST_P(GpuFusedBackward, SameBitsAsSeparateLaunchesAcrossCommCtasAndRings) {
  CARACAL_REQUIRE_GPU();
  const LayerCase& c = GetParam();
  const SeededStep s(c, c.routing);
  const ReferenceLayer reference = reference_layer(c, s.weights);
  const auto expect_pair = [&](int ring_rows, bool pull_all_rows) {
    const std::string ring = "ring " + std::to_string(ring_rows) + (pull_all_rows ? ", every row pulled" : "");
    SCOPED_TRACE(ring);
    const std::vector<RankOutputs> separate = run_once(c, s, options(false, 0, ring_rows, pull_all_rows));
    const std::vector<RankOutputs> fused = run_once(c, s, options(true, 0, ring_rows, pull_all_rows));
    const LoopbackLayer layer(c, s.weights, options(true, 0, ring_rows));
    const bool grouped = layer.layer.groups_dx_rows();
    EXPECT_EQ(grouped, c.world > 1) << "the fused backward groups dx rows at W > 1 only";
    expect_step_matches(c, s.step, reference_step(c, reference, s.step, layer.layer.ring_rows(), false, grouped), fused);
    if (grouped) {
      expect_same_bits_but_dx(separate, fused, "fused backward against its separate launches, " + ring);
      expect_step_matches(c, s.step, reference_step(c, reference, s.step, layer.layer.ring_rows()), separate);
      // A row per route (MoELayerOptions::dx_rows_per_route): the separate launches' bits.
      MoELayerOptions per_route = options(true, 0, ring_rows, pull_all_rows);
      per_route.dx_rows_per_route = true;
      expect_same_bits(separate, run_once(c, s, per_route), "fused backward, dx a row per route, " + ring);
    } else {
      expect_same_bits(separate, fused, "fused backward against its separate launches, " + ring);
    }
    expect_same_bits(fused, run_once(c, s, options(true, 1, ring_rows, pull_all_rows)), "1 comm CTA per rank, " + ring);
    expect_same_bits(fused, run_once(c, s, options(true, 7, ring_rows, pull_all_rows)), "7 comm CTAs per rank, " + ring);
    for (const int comm_ctas : {0, 3}) {
      MoELayerOptions before = options(true, comm_ctas, ring_rows, pull_all_rows);
      before.fused_backward_local_rows_in_launch = false;
      expect_same_bits(fused, run_once(c, s, before),
                       "local rows copied before the launch, " + std::to_string(comm_ctas) + " comm CTAs, " + ring);
    }
  };
  expect_pair(0, false);    // the default ring: a balanced step in one macrobatch
  expect_pair(128, false);  // one block a macrobatch: replays, and a launch per block
  expect_pair(384, true);
}

INSTANTIATE_TEST_SUITE_P(Loopback, GpuFusedBackward, testing::ValuesIn(backward_cases()), case_name);

// Graphs and repeats: a layer stepping again (its counters rezeroed per launch) gives the same bits.
TEST(GpuFusedBackward, RepeatsBitwiseOnOneLayer) {
  CARACAL_REQUIRE_GPU();
  const LayerCase c{"repeat_W2", 2, 300, 8, 4, true, false, kNormalized, RoutingCase::kZipf};
  const SeededStep s(c, c.routing);
  LoopbackLayer l(c, s.weights, options(true, 0, 256));
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
// d topk_scores and every gradient written and the same bits with the sums on the weight
// gradients' idle warps as in their own launch, over a ring of one macrobatch and one of several
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
  const auto run = [&](bool on_weight_grads, int ring_rows) {
    MoELayerOptions o = options(true, 0, ring_rows);
    o.dx_sums_in_weight_grads = on_weight_grads;
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
  for (const int ring_rows : {0, 128}) {
    SCOPED_TRACE("ring " + std::to_string(ring_rows));
    const Outputs apart = run(false, ring_rows);
    const Outputs riding = run(true, ring_rows);
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
