// The bound logic the layer's GPU tests and `caracal bench`'s validation share (bench/
// output_error.hpp, bench/baselines/layer_bounds.hpp, bench/baselines/layer_reference_options.hpp), on the host: what
// passes, and that deliberately wrong values fail.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "caracal/bf16.hpp"
#include "caracal/reference.hpp"
#include "caracal/routing.hpp"
#include "layer_bounds.hpp"
#include "layer_reference_options.hpp"
#include "output_error.hpp"

namespace caracal::checks {
namespace {

bool names(const std::vector<std::string>& failures, const std::string& part) {
  for (const std::string& f : failures) {
    if (f.find(part) != std::string::npos) return true;
  }
  return false;
}

// `rows` rows of `cols` values in [1, top).
std::vector<double> values(size_t rows, size_t cols, uint64_t seed, double top = 2.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(1.0, top);
  std::vector<double> v(rows * cols);
  for (double& x : v) x = u(rng);
  return v;
}

OutputError measured(const std::vector<double>& got, const std::vector<double>& want, size_t rows, size_t cols) {
  OutputError e("out");
  add_rows(e, [&](size_t i) { return got[i]; }, want, rows, cols);
  return e;
}

TEST(OutputError, ExactOutputPasses) {
  const std::vector<double> want = values(16, 32, 1);
  const OutputError e = measured(want, want, 16, 32);
  EXPECT_EQ(e.frobenius(), 0.0);
  EXPECT_EQ(e.worst_row(), 0.0);
  EXPECT_TRUE(e.failures(ErrorBound{0.0, 0.0}).empty());
}

// One row off by 1% of 64 rows: the average hides it (0.125%), the row bound does not.
TEST(OutputError, OneRowOffFailsTheRowBoundOnly) {
  const std::vector<double> want = values(64, 32, 2);
  std::vector<double> got = want;
  for (size_t c = 0; c < 32; ++c) got[5 * 32 + c] *= 1.01;
  const OutputError e = measured(got, want, 64, 32);
  EXPECT_NEAR(e.worst_row(), 0.01, 1e-9);
  EXPECT_LT(e.frobenius(), 2e-3);
  const std::vector<std::string> f = e.failures(ErrorBound{4e-3, 5e-3});
  ASSERT_EQ(f.size(), 1u);
  EXPECT_TRUE(names(f, "out: worst row's relative error")) << f[0];
  EXPECT_FALSE(names(f, "Frobenius")) << f[0];
  EXPECT_TRUE(e.failures(ErrorBound{4e-3, 2e-2}).empty());
}

TEST(OutputError, UnwrittenElementsAndNonzeroRowsFail) {
  std::vector<double> want = values(4, 8, 3);
  for (size_t c = 0; c < 8; ++c) want[2 * 8 + c] = 0.0;  // row 2's reference is exactly 0
  std::vector<double> got = want;
  got[3] = std::numeric_limits<double>::quiet_NaN();
  got[2 * 8 + 1] = 1e-30;
  const OutputError e = measured(got, want, 4, 8);
  EXPECT_EQ(e.unwritten(), 1u);
  EXPECT_EQ(e.nonzero_rows(), 1u);
  const std::vector<std::string> f = e.failures(ErrorBound{1.0, 1.0});
  ASSERT_EQ(f.size(), 1u);
  EXPECT_TRUE(names(f, "1 elements not written (NaN)")) << f[0];
  EXPECT_TRUE(names(f, "1 rows should be exactly 0")) << f[0];
}

// bf16 weight gradients: bf16(g) of fp32 sums g within the fp32 bound of w lands within
// bf16_rounded of it, which the fp32 bound alone does not hold (values just above 1, where bf16's
// relative step is largest).
TEST(LayerBounds, Bf16RoundedGradientsStayWithinTheWidenedBound) {
  const ErrorBound fp32 = kLayerBounds.weight_grad;
  const ErrorBound bf16 = bf16_rounded(fp32);
  EXPECT_DOUBLE_EQ(bf16.frobenius, 1.0 / 256 + (1.0 + 1.0 / 256) * fp32.frobenius);
  EXPECT_DOUBLE_EQ(bf16.row, 1.0 / 256 + (1.0 + 1.0 / 256) * fp32.row);
  std::mt19937_64 rng(4);
  std::uniform_real_distribution<double> sign(-1.0, 1.0);
  const std::vector<double> want = values(8, 256, 5, 1.25);
  std::vector<double> got(want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = want[i] * (1.0 + 0.9 * fp32.frobenius * (sign(rng) > 0 ? 1.0 : -1.0));  // fp32 sums, in bound
    got[i] = round_to_bf16(g);
  }
  const OutputError e = measured(got, want, 8, 256);
  EXPECT_TRUE(e.failures(bf16).empty()) << e.failures(bf16)[0];
  EXPECT_FALSE(e.failures(fp32).empty()) << "bf16 rounding on top of fp32 error stayed within the fp32 bound";
}

// One token, two slots on two experts, through the reference: d_topk_scores per element.
struct ScoreCase {
  ReferenceLayer layer;
  ReferenceInputs inputs;
  ReferenceForwardResult forward;
  ReferenceGradients grads;
  std::vector<uint16_t> dy;
  RouterNormalization router{true, 1.0};

  ScoreCase() {
    const int64_t D = 16, I = 8, T = 3, k = 2;
    std::mt19937_64 rng(6);
    std::uniform_real_distribution<double> u(-0.5, 0.5);
    const auto random = [&](size_t n) {
      std::vector<double> v(n);
      for (double& x : v) x = round_to_bf16(u(rng));
      return v;
    };
    for (int e = 0; e < 3; ++e) {
      layer.experts.push_back(ExpertWeights{D, I, random(size_t(I * D)), random(size_t(I * D)), random(size_t(D * I))});
    }
    inputs.tokens = T;
    inputs.top_k = k;
    inputs.x = random(size_t(T * D));
    inputs.topk_idx = {0, 1, 2, -1, 1, 2};  // token 1 has an empty slot
    inputs.topk_scores = {0.3, 0.7, 0.5, 0.0, 0.9, 0.2};
    ReferenceOptions options;
    options.router = router;
    options.round_intermediates_to_bf16 = true;
    forward = reference_forward(layer, inputs, options);
    dy = to_bf16_bits(random(size_t(T * D)));
    grads = reference_backward(layer, inputs, forward, from_bf16_bits(dy));
  }
  ScoreGradientError error(const std::vector<float>& got) const {
    return score_gradient_error("d_topk_scores", got, inputs, forward, grads, router, dy, kLayerBounds);
  }
  std::vector<float> exact() const { return std::vector<float>(grads.d_topk_scores.begin(), grads.d_topk_scores.end()); }
};

TEST(LayerBounds, ScoreGradientsPassExactAndFailWrongSlots) {
  const ScoreCase c;
  const ScoreGradientError ok = c.error(c.exact());
  EXPECT_EQ(ok.bad, 0u);
  EXPECT_LE(ok.worst_over_allowed, 1e-3);
  EXPECT_TRUE(ok.failures().empty());

  // The largest slot 5% off: a few % of B_t, far past 1e-3 B_t.
  std::vector<float> off = c.exact();
  size_t largest = 0;
  for (size_t i = 0; i < off.size(); ++i) largest = std::abs(off[i]) > std::abs(off[largest]) ? i : largest;
  off[largest] *= 1.05f;
  const ScoreGradientError bad = c.error(off);
  EXPECT_EQ(bad.bad, 1u);
  EXPECT_GT(bad.worst_over_allowed, 1.0);
  const std::string where = "token " + std::to_string(largest / 2) + " slot " + std::to_string(largest % 2);
  EXPECT_TRUE(names(bad.failures(), where)) << bad.first_bad;

  std::vector<float> empty_written = c.exact();
  empty_written[3] = 1e-6f;  // an empty slot must be exactly 0
  EXPECT_EQ(c.error(empty_written).bad, 1u);

  std::vector<float> unwritten = c.exact();
  unwritten[0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(c.error(unwritten).bad, 1u);
  EXPECT_TRUE(std::isinf(c.error(unwritten).worst_over_allowed));
}

// The reference's groups: y per (token, rank), or per macrobatch of the ring, or per route; dx
// per (token, other rank, macrobatch), the rank's own routes alone.
TEST(LayerReferenceOptions, GroupsFollowTheLayersRounding) {
  RoutingSpec spec;
  spec.seed = 7;
  const Routing routing = make_routing(spec, 2, 40, 2, 8);
  const RouterNormalization router{true, 1.0};
  const std::vector<ReferenceOptions> plain = layer_reference_options(router, routing, 8, LayerRounding{});
  ASSERT_EQ(plain.size(), 2u);
  EXPECT_EQ(plain[0].experts_per_rank, 4);
  EXPECT_TRUE(plain[0].round_intermediates_to_bf16);
  EXPECT_TRUE(plain[0].route_groups.empty());
  EXPECT_TRUE(plain[0].dx_route_groups.empty());

  const std::vector<ReferenceOptions> ring = layer_reference_options(router, routing, 8, LayerRounding{128, false, true});
  const std::vector<ReferenceOptions> one = layer_reference_options(router, routing, 8, LayerRounding{1 << 20, false, true});
  const int32_t* ids = routing.rank_topk(1);
  bool cut = false;  // a ring of 128 rows cuts some rank's routes into macrobatches
  for (size_t route = 0; route < 80; ++route) {
    const int64_t dst = ids[route] / 4;
    EXPECT_EQ(one[1].route_groups[route] >> 32, dst);
    EXPECT_EQ(ring[1].route_groups[route] >> 32, dst);
    EXPECT_EQ(one[1].dx_route_groups[route], dst == 1 ? -1 : one[1].route_groups[route]);
    cut = cut || (ring[1].route_groups[route] & 0xFFFFFFFF) > 0;
  }
  EXPECT_TRUE(cut);
  const std::vector<ReferenceOptions> per_route =
      layer_reference_options(router, routing, 8, LayerRounding{128, true, false});
  for (size_t route = 0; route < 80; ++route) EXPECT_EQ(per_route[0].route_groups[route], int64_t(route));
}

}  // namespace
}  // namespace caracal::checks
