// The fused forward (src/fused/fused_forward.hpp) through MoELayer: the same bits as v1's separate
// launches (MoELayerOptions::fused_forward = false) for every output and gradient, whatever the
// number of pulling CTAs, and within the fp64 reference's bounds; on loopback W = 1, 2, 4, 8, on
// adversarial routings (all routes to one expert, empty experts and ranks, -1 slots), tiny and odd
// token counts, and enough rows for many 128-row blocks per expert; and on rings much smaller than
// the rows (many macrobatches: the gradients to the bit, y within the reference's bounds where
// macrobatches split a token's rows on a rank).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "caracal/comm/loopback_world.hpp"
#include "caracal/error.hpp"
#include "caracal/moe_layer.hpp"
#include "caracal/schedule.hpp"
#include "error_checks.hpp"
#include "gpu_test_util.hpp"
#include "moe_layer_test_support.hpp"

namespace caracal::layer_test {
namespace {

std::vector<LayerCase> fused_cases() {
  using R = RoutingCase;
  return {
      {"W1_uniform_shared_k2", 1, 133, 8, 2, true, false, kNormalized, R::kUniform},
      {"W1_one_token_k4", 1, 1, 8, 4, true, false, kNormalized, R::kUniform},
      {"W1_many_blocks_k8", 1, 1500, 8, 8, false, false, kNormalizedScaled, R::kZipf},
      {"W2_empty_slots_shared_scale_k3", 2, 75, 8, 3, true, true, kNormalized, R::kEmptySlots},
      {"W2_all_to_one_k4", 2, 700, 8, 4, true, false, kNormalized, R::kAllToOne},
      {"W4_empty_ranks_k2_unnormalized", 4, 53, 16, 2, true, true, kUnnormalized, R::kEmptyRanks},
      {"W4_three_tokens_k3", 4, 3, 16, 3, false, false, kNormalized, R::kUniform},
      {"W8_zipf_noshared_k2", 8, 39, 16, 2, false, false, kUnnormalized, R::kZipf},
      {"W8_all_slots_empty_shared_k2", 8, 41, 8, 2, true, false, kNormalized, R::kAllEmpty},
  };
}

// Whether `ring` holds every rank's schedule rows in one macrobatch: y is then v1's to the bit
// (group_sum.cuh).
bool ring_holds_step(const LayerCase& c, const HostStep& step, int64_t ring) {
  const Schedule schedule = build_schedule(step.routing, c.experts, 128);
  for (const RankSchedule& rank : schedule.ranks) {
    if (rank.padded_rows() > ring) return false;
  }
  return true;
}

class GpuFusedForward : public testing::TestWithParam<LayerCase> {};

TEST_P(GpuFusedForward, SameBitsAsV1AcrossCommCtasAndMatchesReference) {
  CARACAL_REQUIRE_GPU();
  const LayerCase& c = GetParam();
  const SeededStep s(c, c.routing);
  const std::vector<RankOutputs> v1 = run_once(c, s, v1_setup());
  const std::vector<RankOutputs> fused = run_once(c, s, MoELayerOptions{});
  const int64_t ring = LoopbackLayer(c, s.weights, MoELayerOptions{}).layer.ring_rows();  // the default's
  expect_step_matches(c, s.step, reference_for(c, s.weights, s.step), fused);
  // The fused backward sums dx per (token, rank) at W > 1 (v1 sends a row per route).
  const bool dx_grouped = c.world > 1;
  if (ring_holds_step(c, s.step, ring)) {
    if (dx_grouped) {
      expect_same_bits_but_dx(v1, fused, "fused (default comm CTAs) against v1");
    } else {
      expect_same_bits(v1, fused, "fused (default comm CTAs) against v1");
    }
  } else {  // more than one macrobatch: y's groups differ (GpuFusedForwardRing)
    expect_same_bits_but_y(v1, fused, "fused (default comm CTAs) against v1", dx_grouped);
  }
  expect_same_bits(fused, run_once(c, s, fused_setup(1)), "fused, 1 comm CTA per rank");
  expect_same_bits(fused, run_once(c, s, fused_setup(3)), "fused, 3 comm CTAs per rank");
}

INSTANTIATE_TEST_SUITE_P(Loopback, GpuFusedForward, testing::ValuesIn(fused_cases()), case_name);

// Rings far smaller than the rows: many macrobatches, each taking over the ring rows of the one
// walked before it (all routes to one expert: every rank's routes on one rank), and the backward
// recomputing the up/gate tiles of every row past the ring. The same bits as v1 for every
// gradient, whatever the ring and the comm CTAs, with rows gathered in place or all pulled, once
// per (token, rank) and macrobatch or once per route. y sums a token's rows on a rank per
// macrobatch (group_sum.cuh), so where macrobatches split them it differs from v1's (within the
// reference's bounds), and is the same for every split of CTAs and way of pulling; per route (no
// groups) it is v1's to the bit.
std::vector<LayerCase> ring_cases() {
  using R = RoutingCase;
  return {
      {"W1_many_blocks_k8", 1, 1500, 8, 8, true, false, kNormalizedScaled, R::kZipf},
      {"W2_all_to_one_k4", 2, 700, 8, 4, true, false, kNormalized, R::kAllToOne},
      {"W4_all_to_one_k3_odd", 4, 301, 16, 3, true, true, kNormalized, R::kAllToOne},
      {"W4_empty_ranks_k2", 4, 253, 16, 2, true, true, kUnnormalized, R::kEmptyRanks},
      {"W8_empty_slots_k2", 8, 97, 16, 2, true, false, kNormalized, R::kEmptySlots},
      // k > 32: a token's rows on a rank are found in two rounds of 32 slots.
      {"W2_duplicates_k36", 2, 45, 48, 36, true, false, kNormalized, R::kDuplicates},
  };
}

class GpuFusedForwardRing : public testing::TestWithParam<LayerCase> {};

TEST_P(GpuFusedForwardRing, SameGradientBitsAsV1ForEveryRing) {
  CARACAL_REQUIRE_GPU();
  const LayerCase& c = GetParam();
  const SeededStep s(c, c.routing);
  const ReferenceLayer reference = reference_layer(c, s.weights);
  const std::vector<RankOutputs> v1 = run_once(c, s, v1_setup());
  // The fused backward sums dx per (token, rank) and macrobatch at W > 1 (v1: a row per route).
  const bool dx_grouped = c.world > 1;
  // Every output of a ring run but y (and dx where grouped) against v1 bitwise, y and dx against
  // the reference of its ring.
  const auto expect_ring = [&](const std::vector<RankOutputs>& ring, int64_t ring_rows, const std::string& what) {
    SCOPED_TRACE(what);
    expect_step_matches(c, s.step, reference_step(c, reference, s.step, ring_rows, false, dx_grouped), ring);
    expect_same_bits_but_y(v1, ring, what + " against v1", dx_grouped);
  };
  const std::vector<RankOutputs> ring128 = run_once(c, s, fused_setup(0, 128));
  expect_ring(ring128, 128, "fused, a ring of 128 rows");
  expect_ring(run_once(c, s, fused_setup(1, 384)), 384, "fused, a ring of 384 rows, 1 comm CTA per rank");
  expect_ring(run_once(c, s, fused_setup(5, 1024)), 1024, "fused, a ring of 1024 rows, 5 comm CTAs per rank");
  // Every row pulled (a loopback world pulls none otherwise): the pull role, its x_ready counts and
  // its waits for the ring rows it takes over; the same bits as the ring's other runs.
  expect_same_bits(ring128, run_once(c, s, fused_setup(0, 128, true)), "fused, every row pulled, a ring of 128 rows");
  const std::vector<RankOutputs> all_pulled = run_once(c, s, fused_setup(2, 0, true));
  if (dx_grouped) {
    expect_same_bits_but_dx(v1, all_pulled, "fused, every row pulled, no ring, 2 comm CTAs");
  } else {
    expect_same_bits(v1, all_pulled, "fused, every row pulled, no ring, 2 comm CTAs");
  }
  // Per route (a pull per route, a row home per route): v1's bits, whatever the ring.
  const std::vector<RankOutputs> v1_per_route = run_once(c, s, v1_setup(true));
  expect_step_matches(c, s.step, reference_step(c, reference, s.step, 0, /*per_route=*/true), v1_per_route);
  expect_same_bits(v1_per_route, run_once(c, s, fused_setup(0, 128, true, true)),
                   "fused, every row pulled per route, a ring of 128 rows");
}

INSTANTIATE_TEST_SUITE_P(Loopback, GpuFusedForwardRing, testing::ValuesIn(ring_cases()), case_name);

// A ring layer repeated, with routings that change between steps (more or fewer macrobatches than
// the step before), is bitwise what a fresh ring layer gives each step, and matches the reference.
TEST(GpuFusedForwardRing, ChangingRoutingOnOneLayer) {
  CARACAL_REQUIRE_GPU();
  const LayerCase base{"ring_steps_W2", 2, 400, 8, 4, true, false, kNormalized, RoutingCase::kUniform};
  const TracedSeed seed;
  const HostWeights weights = random_weights(base, seed.value());
  LoopbackLayer ring(base, weights, fused_setup(0, 256));
  const Stream stream;
  int i = 0;
  for (const RoutingCase routing : {RoutingCase::kAllToOne, RoutingCase::kUniform, RoutingCase::kZipf,
                                    RoutingCase::kAllToOne, RoutingCase::kAllEmpty}) {
    const HostStep step = random_step(base, routing, seed.value() + 1 + i);
    ring.buffers.prepare(step, ring.world);
    run_step(ring.layer, ring.buffers, stream);
    const std::vector<RankOutputs> got = ring.buffers.download();
    const std::string what = "ring layer, step " + std::to_string(i++);
    expect_same_bits(run_once(base, weights, step, fused_setup(0, 256)), got, what);
    SCOPED_TRACE(what);
    expect_step_matches(base, step, reference_step(base, reference_layer(base, weights), step, 256, false, true), got);
  }
}

TEST(GpuFusedForward, RepeatsBitwiseOnOneLayer) {
  CARACAL_REQUIRE_GPU();
  const LayerCase c{"repeat_W2", 2, 300, 8, 4, true, false, kNormalized, RoutingCase::kZipf};
  const SeededStep s(c, c.routing);
  LoopbackLayer l(c, s.weights);
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

TEST(GpuFusedForward, CommCtasOutOfRangeAreRefused) {
  CARACAL_REQUIRE_GPU();
  const LayerCase c{"refused", 2, 16, 8, 2, false, false, kNormalized, RoutingCase::kUniform};
  const HostWeights weights = random_weights(c, 1);
  for (const int bad : {-1, 100000}) {
    SCOPED_TRACE(bad);
    test::expect_error([&] { LoopbackLayer l(c, weights, fused_setup(bad)); }, {"options.fused_comm_ctas"});
  }
  for (const int bad : {-128, 100}) {
    SCOPED_TRACE(bad);
    test::expect_error([&] { LoopbackLayer l(c, weights, fused_setup(0, bad)); },
                       {"options.ring_rows", "multiple of 128"});
  }
  LayerSetup off = fused_setup(100000);  // not read when the fused forward is off
  off.options.fused_forward = false;
  EXPECT_NO_THROW({ LoopbackLayer l(c, weights, off); });
}

}  // namespace
}  // namespace caracal::layer_test
