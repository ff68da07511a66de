// Tests of the fp64 MoE reference (forward, backward, bf16-rounding mode) and of the bf16 helpers.
// Random inputs are seeded from std::random_device; the seed is attached to every failure and
// recorded as a test property. Rerun with CARACAL_TEST_SEED=<seed> to reproduce.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "caracal/bf16.hpp"
#include "caracal/error.hpp"
#include "caracal/reference.hpp"
#include "fresh_seed.hpp"

namespace caracal {
namespace {

// ---- Random problems -------------------------------------------------------------------------

// bf16-representable values, uniform in [-bound, bound].
std::vector<double> random_bf16(std::mt19937_64& rng, int64_t count, double bound) {
  std::uniform_real_distribution<double> uniform(-bound, bound);
  std::vector<double> values(static_cast<size_t>(count));
  for (double& v : values) v = round_to_bf16(uniform(rng));
  return values;
}

// Weights scaled so that pre-activations are O(1): SiLU is exercised away from its linear part.
ExpertWeights random_expert(std::mt19937_64& rng, int64_t hidden, int64_t intermediate) {
  const int64_t n = hidden * intermediate;
  return ExpertWeights{hidden, intermediate,
                       random_bf16(rng, n, 2.0 / std::sqrt(static_cast<double>(hidden))),
                       random_bf16(rng, n, 2.0 / std::sqrt(static_cast<double>(hidden))),
                       random_bf16(rng, n, 2.0 / std::sqrt(static_cast<double>(intermediate)))};
}

struct ProblemShape {
  int64_t tokens = 4;
  int64_t hidden = 8;
  int64_t intermediate = 5;
  int64_t experts = 6;
  int64_t top_k = 3;
  int64_t shared_intermediate = 0;  // 0: no shared expert
  bool shared_scale = false;        // give a per-token shared-output scale
  double empty_slot_fraction = 0.0;
};

struct Problem {
  ReferenceLayer layer;
  ReferenceInputs inputs;
  ReferenceOptions options;
  std::vector<double> dy;
};

// Random weights, inputs, scores in [0.05, 1] and routing (duplicates possible).
Problem random_problem(std::mt19937_64& rng, const ProblemShape& shape,
                       RouterNormalization router) {
  Problem p;
  for (int64_t e = 0; e < shape.experts; ++e) {
    p.layer.experts.push_back(random_expert(rng, shape.hidden, shape.intermediate));
  }
  if (shape.shared_intermediate > 0) {
    p.layer.shared = random_expert(rng, shape.hidden, shape.shared_intermediate);
  }
  ReferenceInputs& in = p.inputs;
  in.tokens = shape.tokens;
  in.top_k = shape.top_k;
  in.x = random_bf16(rng, shape.tokens * shape.hidden, 1.0);
  const int64_t routes = shape.tokens * shape.top_k;
  std::uniform_int_distribution<int32_t> expert(0, static_cast<int32_t>(shape.experts - 1));
  std::bernoulli_distribution empty(shape.empty_slot_fraction);
  std::uniform_real_distribution<double> score(0.05, 1.0);
  for (int64_t r = 0; r < routes; ++r) {
    in.topk_idx.push_back(empty(rng) ? -1 : expert(rng));
    in.topk_scores.push_back(round_to_bf16(score(rng)));
  }
  if (shape.shared_scale) {
    std::uniform_real_distribution<double> gate(0.1, 0.9);
    for (int64_t t = 0; t < shape.tokens; ++t) in.shared_scale.push_back(round_to_bf16(gate(rng)));
  }
  p.options.router = router;
  p.dy = random_bf16(rng, shape.tokens * shape.hidden, 1.0);
  return p;
}

void set_route(Problem& p, int64_t token, int64_t slot, int32_t expert) {
  p.inputs.topk_idx[static_cast<size_t>(token * p.inputs.top_k + slot)] = expert;
}
void set_routes(Problem& p, int64_t token, const std::vector<int32_t>& experts) {
  for (size_t slot = 0; slot < experts.size(); ++slot) {
    set_route(p, token, static_cast<int64_t>(slot), experts[slot]);
  }
}
void set_score(Problem& p, int64_t token, int64_t slot, double score) {
  p.inputs.topk_scores[static_cast<size_t>(token * p.inputs.top_k + slot)] = score;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double sum = 0.0;
  for (size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
  return sum;
}

// L = sum(dy ⊙ y): its gradient is what reference_backward computes for that dy.
double loss(const Problem& p) {
  return dot(p.dy, reference_forward(p.layer, p.inputs, p.options).y);
}

// ---- Finite differences ----------------------------------------------------------------------

// One differentiable input of the problem and the analytic gradient to check it against.
struct Parameter {
  std::string name;
  std::vector<double>* values;
  const std::vector<double>* gradient;
};

std::vector<Parameter> parameters_of(Problem& p, const ReferenceGradients& g) {
  std::vector<Parameter> params = {{"x", &p.inputs.x, &g.dx},
                                   {"topk_scores", &p.inputs.topk_scores, &g.d_topk_scores}};
  if (!p.inputs.shared_scale.empty()) {
    params.push_back({"shared_scale", &p.inputs.shared_scale, &g.d_shared_scale});
  }
  auto add_expert = [&params](const std::string& name, ExpertWeights& w,
                              const ExpertGradients& dw) {
    params.push_back({name + ".gate", &w.gate, &dw.gate});
    params.push_back({name + ".up", &w.up, &dw.up});
    params.push_back({name + ".down", &w.down, &dw.down});
  };
  for (size_t e = 0; e < p.layer.experts.size(); ++e) {
    add_expert("experts[" + std::to_string(e) + "]", p.layer.experts[e], g.d_experts[e]);
  }
  if (p.layer.shared) add_expert("shared", *p.layer.shared, *g.d_shared);
  return params;
}

// Checks every gradient element against a central difference of the loss.
void expect_gradients_match_finite_differences(Problem p) {
  ASSERT_FALSE(p.options.round_intermediates_to_bf16) << "finite differences need exact mode";
  const ReferenceForwardResult forward = reference_forward(p.layer, p.inputs, p.options);
  const ReferenceGradients grads = reference_backward(p.layer, p.inputs, forward, p.dy);
  ASSERT_EQ(grads.d_shared_scale.size(), p.inputs.shared_scale.size());
  ASSERT_EQ(grads.d_shared.has_value(), p.layer.shared.has_value());

  constexpr double kStep = 1e-6;
  constexpr double kTolerance = 1e-7;  // fp64 central differences: ~1e-9 noise for |L| ~ 10
  int64_t checked = 0;
  int64_t mismatches = 0;
  for (const Parameter& param : parameters_of(p, grads)) {
    ASSERT_EQ(param.values->size(), param.gradient->size()) << param.name;
    for (size_t i = 0; i < param.values->size(); ++i) {
      double& v = (*param.values)[i];
      const double saved = v;
      v = saved + kStep;
      const double above = loss(p);
      v = saved - kStep;
      const double below = loss(p);
      v = saved;
      const double numeric = (above - below) / (2 * kStep);
      const double analytic = (*param.gradient)[i];
      ++checked;
      if (std::abs(numeric - analytic) > kTolerance * (1.0 + std::abs(analytic))) {
        if (++mismatches <= 10) {
          ADD_FAILURE() << param.name << "[" << i << "]: analytic " << analytic
                        << ", finite difference " << numeric;
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << checked << " gradient elements";
}

bool all_zero(const std::vector<double>& v) {
  for (double e : v) {
    if (e != 0.0) return false;
  }
  return true;
}

double relative_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0.0;
  double norm = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  return std::sqrt(diff / norm);
}

bool all_bf16(const std::vector<double>& v) {
  for (double e : v) {
    if (round_to_bf16(e) != e) return false;
  }
  return true;
}

template <typename Fn>
void expect_error_containing(Fn&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected caracal::Error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message '" << e.what() << "' lacks '" << needle << "'";
  }
}

class ReferenceTest : public ::testing::Test {
 protected:
  ReferenceTest()
      : seed_(test::fresh_seed()),
        rng_(seed_),
        trace_(__FILE__, __LINE__, "CARACAL_TEST_SEED=" + std::to_string(seed_)) {}
  void SetUp() override { RecordProperty("seed", std::to_string(seed_)); }

  uint64_t seed_;
  std::mt19937_64 rng_;
  ::testing::ScopedTrace trace_;
};

// ---- Gradients -------------------------------------------------------------------------------

// Routing of 4 tokens, k = 3, E = 6 (W = 2 ranks of 3 experts) covering the special cases.
// Experts 3 and 5 get no route.
void use_special_routing(Problem& p) {
  set_routes(p, 0, {0, 1, 2});    // all slots on rank 0's experts 0..k-1
  set_routes(p, 1, {4, -1, 4});   // one expert twice, one empty slot
  set_routes(p, 2, {-1, -1, -1});  // all slots empty
  set_routes(p, 3, {1, 2, 0});    // with a zero score (g = 0) in the middle
  set_score(p, 3, 1, 0.0);
}

TEST_F(ReferenceTest, GradientsMatchFiniteDifferencesOnSpecialRouting) {
  struct Case {
    bool normalize;
    double scale;
    int64_t shared_intermediate;
    bool shared_scale;
  };
  const Case cases[] = {{true, 2.5, 6, true},
                        {false, 0.75, 6, false},
                        {true, 1.0, 0, false},
                        {false, 1.0, 4, true}};
  for (const Case& c : cases) {
    SCOPED_TRACE("normalize=" + std::to_string(c.normalize) + " scale=" + std::to_string(c.scale) +
                 " shared_intermediate=" + std::to_string(c.shared_intermediate) +
                 " shared_scale=" + std::to_string(c.shared_scale));
    ProblemShape shape;
    shape.shared_intermediate = c.shared_intermediate;
    shape.shared_scale = c.shared_scale;
    Problem p = random_problem(rng_, shape, {c.normalize, c.scale});
    use_special_routing(p);
    expect_gradients_match_finite_differences(p);

    const auto forward = reference_forward(p.layer, p.inputs, p.options);
    const auto grads = reference_backward(p.layer, p.inputs, forward, p.dy);
    for (int unrouted : {3, 5}) {
      SCOPED_TRACE("expert " + std::to_string(unrouted));
      const ExpertGradients& dw = grads.d_experts[static_cast<size_t>(unrouted)];
      EXPECT_TRUE(all_zero(dw.gate) && all_zero(dw.up) && all_zero(dw.down));
    }
    for (int64_t empty_route : {4, 6, 7, 8}) {  // (1,1), (2,0), (2,1), (2,2)
      EXPECT_EQ(grads.d_topk_scores[static_cast<size_t>(empty_route)], 0.0) << empty_route;
      EXPECT_EQ(forward.gates[static_cast<size_t>(empty_route)], 0.0) << empty_route;
    }
    EXPECT_EQ(forward.gates[10], 0.0);               // the zero score ...
    EXPECT_NE(grads.d_topk_scores[10], 0.0);         // ... still gets a gradient
  }
}

TEST_F(ReferenceTest, GradientsMatchFiniteDifferencesOnRandomRouting) {
  ProblemShape shape;
  shape.tokens = 5;
  shape.intermediate = 4;
  shape.experts = 5;
  shape.top_k = 2;
  shape.shared_intermediate = 6;
  shape.shared_scale = true;
  shape.empty_slot_fraction = 0.2;
  for (bool normalize : {true, false}) {
    SCOPED_TRACE("normalize=" + std::to_string(normalize));
    expect_gradients_match_finite_differences(random_problem(rng_, shape, {normalize, 1.5}));
  }
}

// Without normalization d_score = scale * <dy, E(x)>: at a zero score it is the full dot product,
// not 0 (what dividing by g would give).
TEST_F(ReferenceTest, ZeroScoreGetsTheFullScoreGradient) {
  const double scale = 2.0;
  Problem p = random_problem(rng_, ProblemShape{}, {false, scale});
  set_score(p, 2, 1, 0.0);
  const auto forward = reference_forward(p.layer, p.inputs, p.options);
  const auto grads = reference_backward(p.layer, p.inputs, forward, p.dy);
  const int64_t route = 2 * p.inputs.top_k + 1;
  const int64_t D = p.layer.hidden();
  double expected = 0.0;
  for (int64_t d = 0; d < D; ++d) {
    expected += p.dy[static_cast<size_t>(2 * D + d)] *
                forward.routed.output[static_cast<size_t>(route * D + d)];
  }
  expected *= scale;
  ASSERT_NE(expected, 0.0);
  EXPECT_NEAR(grads.d_topk_scores[static_cast<size_t>(route)], expected,
              1e-14 * (1.0 + std::abs(expected)));
}

// Two slots to one expert act like one slot holding the summed weight.
TEST_F(ReferenceTest, DuplicateSlotsAreSeparateRoutes) {
  ProblemShape shape;
  shape.top_k = 2;
  Problem twice = random_problem(rng_, shape, {false, 1.0});
  Problem once = twice;
  set_routes(twice, 0, {3, 3});
  set_routes(once, 0, {3, -1});
  set_score(once, 0, 0, twice.inputs.topk_scores[0] + twice.inputs.topk_scores[1]);

  const auto fwd_twice = reference_forward(twice.layer, twice.inputs, twice.options);
  const auto fwd_once = reference_forward(once.layer, once.inputs, once.options);
  for (size_t i = 0; i < fwd_twice.y.size(); ++i) {
    EXPECT_NEAR(fwd_twice.y[i], fwd_once.y[i], 1e-14) << "y[" << i << "]";
  }
  const auto grads = reference_backward(twice.layer, twice.inputs, fwd_twice, twice.dy);
  EXPECT_NEAR(grads.d_topk_scores[0], grads.d_topk_scores[1], 1e-14);
}

// A token without valid slots gets exactly its shared expert's output (or zero without one).
TEST_F(ReferenceTest, AllEmptyTokenGetsOnlyTheSharedExpert) {
  ProblemShape shape;
  shape.shared_intermediate = 4;
  shape.shared_scale = true;
  for (bool with_shared : {true, false}) {
    SCOPED_TRACE("with_shared=" + std::to_string(with_shared));
    Problem p = random_problem(rng_, shape, {true, 1.0});
    if (!with_shared) {
      p.layer.shared.reset();
      p.inputs.shared_scale.clear();
    }
    set_routes(p, 1, {-1, -1, -1});
    const auto forward = reference_forward(p.layer, p.inputs, p.options);
    const auto grads = reference_backward(p.layer, p.inputs, forward, p.dy);
    const int64_t D = p.layer.hidden();
    for (int64_t d = 0; d < D; ++d) {
      const auto i = static_cast<size_t>(D + d);
      const double expected =
          with_shared ? p.inputs.shared_scale[1] * forward.shared.output[i] : 0.0;
      EXPECT_EQ(forward.y[i], expected) << "y[1][" << d << "]";
      if (!with_shared) {
        EXPECT_EQ(grads.dx[i], 0.0) << "dx[1][" << d << "]";
      }
    }
  }
}

// ---- Forward against a hand computation ------------------------------------------------------

// D = 2, I = 1: E(x) = down * SiLU(gate·x) * (up·x), written out by hand.
TEST(ReferenceForward, MatchesHandComputation) {
  auto silu = [](double z) { return z / (1.0 + std::exp(-z)); };
  ReferenceLayer layer;
  layer.experts.push_back(ExpertWeights{2, 1, {0.5, 0.25}, {1.0, -0.25}, {2.0, -1.0}});
  layer.experts.push_back(ExpertWeights{2, 1, {-1.0, 0.25}, {0.5, 0.5}, {1.0, 3.0}});
  layer.shared = ExpertWeights{2, 1, {0.25, 0.25}, {2.0, 0.0}, {-1.0, 0.5}};
  ReferenceInputs in;
  in.tokens = 1;
  in.top_k = 3;
  in.x = {1.0, 2.0};
  in.topk_idx = {1, -1, 0};
  in.topk_scores = {0.75, 5.0, 0.25};  // the empty slot's score is ignored
  in.shared_scale = {0.5};
  ReferenceOptions options;
  options.router = {true, 2.0};  // g = 2 * (0.75, 0.25) / 1 = (1.5, 0.5)

  // expert 0: gate·x = 1, up·x = 0.5; expert 1: -0.5, 1.5; shared: 0.75, 2
  const double h0 = silu(1.0) * 0.5;
  const double h1 = silu(-0.5) * 1.5;
  const double hs = silu(0.75) * 2.0;
  const double y0 = 0.5 * (-1.0 * hs) + 1.5 * (1.0 * h1) + 0.5 * (2.0 * h0);
  const double y1 = 0.5 * (0.5 * hs) + 1.5 * (3.0 * h1) + 0.5 * (-1.0 * h0);

  const auto forward = reference_forward(layer, in, options);
  ASSERT_EQ(forward.y.size(), 2u);
  EXPECT_NEAR(forward.y[0], y0, 1e-15);
  EXPECT_NEAR(forward.y[1], y1, 1e-15);
  EXPECT_EQ(forward.gates, (std::vector<double>{1.5, 0.0, 0.5}));

  // dy = (1, 0): d_shared_scale = <dy, E_shared(x)> = -hs; unnormalized d_score = 2 * <dy, E_j>.
  const auto grads = reference_backward(layer, in, forward, {1.0, 0.0});
  ASSERT_EQ(grads.d_shared_scale.size(), 1u);
  EXPECT_NEAR(grads.d_shared_scale[0], -hs, 1e-15);
  // Normalized: d_s_m = (2 / S) (dg_m - sum_j dg_j s_j / S), S = 1, dg = (h1, 2 h0).
  const double mean = h1 * 0.75 + 2.0 * h0 * 0.25;
  EXPECT_NEAR(grads.d_topk_scores[0], 2.0 * (h1 - mean), 1e-15);
  EXPECT_EQ(grads.d_topk_scores[1], 0.0);
  EXPECT_NEAR(grads.d_topk_scores[2], 2.0 * (2.0 * h0 - mean), 1e-15);
}

// ---- bf16-rounding mode ----------------------------------------------------------------------

TEST_F(ReferenceTest, Bf16ModeIsCloseToExactAndStoresBf16) {
  ProblemShape shape;
  shape.tokens = 64;  // enough scalar gradients (each a dot product) for a stable norm ratio
  shape.hidden = 64;
  shape.intermediate = 32;
  shape.experts = 8;
  shape.top_k = 4;
  shape.shared_intermediate = 48;
  shape.shared_scale = true;
  shape.empty_slot_fraction = 0.1;
  // Unnormalized: the normalization Jacobian (applied exactly in both modes) subtracts the
  // weighted mean of dg, and that cancellation would inflate the relative difference.
  Problem p = random_problem(rng_, shape, {false, 2.5});
  const auto exact_fwd = reference_forward(p.layer, p.inputs, p.options);
  const auto exact = reference_backward(p.layer, p.inputs, exact_fwd, p.dy);
  p.options.round_intermediates_to_bf16 = true;
  const auto bf16_fwd = reference_forward(p.layer, p.inputs, p.options);
  const auto bf16 = reference_backward(p.layer, p.inputs, bf16_fwd, p.dy);

  constexpr double kClose = 1e-2;
  EXPECT_GT(relative_difference(bf16_fwd.y, exact_fwd.y), 0.0) << "rounding had no effect";
  EXPECT_LT(relative_difference(bf16_fwd.y, exact_fwd.y), kClose);
  EXPECT_LT(relative_difference(bf16.dx, exact.dx), kClose);
  EXPECT_LT(relative_difference(bf16.d_topk_scores, exact.d_topk_scores), kClose);
  EXPECT_LT(relative_difference(bf16.d_shared_scale, exact.d_shared_scale), kClose);
  auto expect_close = [&](const std::string& name, const ExpertGradients& a,
                          const ExpertGradients& b) {
    SCOPED_TRACE(name);
    EXPECT_LT(relative_difference(a.gate, b.gate), kClose);
    EXPECT_LT(relative_difference(a.up, b.up), kClose);
    EXPECT_LT(relative_difference(a.down, b.down), kClose);
  };
  for (size_t e = 0; e < exact.d_experts.size(); ++e) {
    if (all_zero(exact.d_experts[e].down)) continue;  // an expert without routes
    expect_close("experts[" + std::to_string(e) + "]", bf16.d_experts[e], exact.d_experts[e]);
  }
  expect_close("shared", *bf16.d_shared, *exact.d_shared);

  // What the kernels store is bf16.
  EXPECT_TRUE(all_bf16(bf16_fwd.y));
  EXPECT_TRUE(all_bf16(bf16.dx));
  for (const ExpertActivations* a : {&bf16_fwd.routed, &bf16_fwd.shared}) {
    EXPECT_TRUE(all_bf16(a->gate));
    EXPECT_TRUE(all_bf16(a->up));
    EXPECT_TRUE(all_bf16(a->swiglu));
    EXPECT_TRUE(all_bf16(a->output));
  }
}

// The contract of reference.hpp written out from scratch for one expert on one row.
struct ContractRoute {
  std::vector<double> gate, up, swiglu, output;  // forward, as stored (F1-F3)
  std::vector<double> dx;                        // backward: the route's dx row (B3)
  double d_weight = 0.0;                         // <dy, E(x)> (B1)
  ExpertGradients grad;                          // B5
};

ContractRoute contract_route(const ExpertWeights& w, const std::vector<double>& x,
                             const std::vector<double>& dy, double weight) {
  auto silu = [](double z) { return z / (1.0 + std::exp(-z)); };
  const auto D = static_cast<size_t>(w.hidden);
  const auto I = static_cast<size_t>(w.intermediate);
  ContractRoute r;
  r.gate.assign(I, 0.0);
  r.up.assign(I, 0.0);
  r.swiglu.assign(I, 0.0);
  r.output.assign(D, 0.0);
  r.dx.assign(D, 0.0);
  r.grad = ExpertWeights::zeros(w.hidden, w.intermediate);
  for (size_t i = 0; i < I; ++i) {
    for (size_t d = 0; d < D; ++d) {
      r.gate[i] += w.gate[i * D + d] * x[d];
      r.up[i] += w.up[i * D + d] * x[d];
    }
    r.gate[i] = round_to_bf16(r.gate[i]);
    r.up[i] = round_to_bf16(r.up[i]);
    r.swiglu[i] = round_to_bf16(silu(r.gate[i]) * r.up[i]);
  }
  for (size_t d = 0; d < D; ++d) {
    for (size_t i = 0; i < I; ++i) r.output[d] += w.down[d * I + i] * r.swiglu[i];
    r.output[d] = round_to_bf16(r.output[d]);
  }
  for (size_t i = 0; i < I; ++i) {
    double down_t_dy = 0.0;
    for (size_t d = 0; d < D; ++d) down_t_dy += w.down[d * I + i] * dy[d];
    r.d_weight += down_t_dy * r.swiglu[i];
    const double sig = 1.0 / (1.0 + std::exp(-r.gate[i]));
    const double d_gate =
        round_to_bf16(weight * down_t_dy * r.up[i] * sig * (1.0 + r.gate[i] * (1.0 - sig)));
    const double d_up = round_to_bf16(weight * down_t_dy * silu(r.gate[i]));
    for (size_t d = 0; d < D; ++d) {
      r.dx[d] += d_gate * w.gate[i * D + d] + d_up * w.up[i * D + d];
      r.grad.gate[i * D + d] = d_gate * x[d];
      r.grad.up[i * D + d] = d_up * x[d];
      r.grad.down[d * I + i] = dy[d] * round_to_bf16(weight * r.swiglu[i]);  // B5: bf16(w * hidden)
    }
  }
  for (double& v : r.dx) v = round_to_bf16(v);
  return r;
}

void expect_near_relative(const std::vector<double>& actual, const std::vector<double>& expected,
                          const std::string& name) {
  ASSERT_EQ(actual.size(), expected.size()) << name;
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], 1e-12 * (1.0 + std::abs(expected[i])))
        << name << "[" << i << "]";
  }
}

// One token, shared expert + two routes, checked against the contract written out above. Any
// rounding point left out or added moves results by about a bf16 ulp (~1e-3 relative).
TEST_F(ReferenceTest, Bf16ModeRoundsExactlyAtTheContractPoints) {
  ProblemShape shape;
  shape.tokens = 1;
  shape.hidden = 64;  // enough elements that a misplaced rounding shows somewhere
  shape.experts = 3;
  shape.top_k = 2;
  shape.shared_intermediate = 3;
  shape.shared_scale = true;
  const double scale = 1.25;
  Problem p = random_problem(rng_, shape, {false, scale});
  p.options.round_intermediates_to_bf16 = true;
  set_routes(p, 0, {2, 0});
  const auto forward = reference_forward(p.layer, p.inputs, p.options);
  const auto grads = reference_backward(p.layer, p.inputs, forward, p.dy);

  const double c = p.inputs.shared_scale[0];
  const double g0 = scale * p.inputs.topk_scores[0];
  const double g1 = scale * p.inputs.topk_scores[1];
  const ContractRoute shared = contract_route(*p.layer.shared, p.inputs.x, p.dy, c);
  const ContractRoute slot0 = contract_route(p.layer.experts[2], p.inputs.x, p.dy, g0);
  const ContractRoute slot1 = contract_route(p.layer.experts[0], p.inputs.x, p.dy, g1);
  std::vector<double> y(p.dy.size());
  std::vector<double> dx(p.dy.size());
  for (size_t d = 0; d < y.size(); ++d) {
    // Both routes on one rank (experts_per_rank 0): one group, rounded once before the home's sum.
    y[d] = round_to_bf16(round_to_bf16(c * shared.output[d]) + round_to_bf16(g0 * slot0.output[d] + g1 * slot1.output[d]));
    dx[d] = round_to_bf16(shared.dx[d] + slot0.dx[d] + slot1.dx[d]);
  }
  expect_near_relative(forward.shared.swiglu, shared.swiglu, "shared.swiglu");
  expect_near_relative(forward.shared.output, shared.output, "shared.output");
  expect_near_relative(forward.y, y, "y");
  expect_near_relative(grads.dx, dx, "dx");
  expect_near_relative(grads.d_shared_scale, {shared.d_weight}, "d_shared_scale");
  expect_near_relative(grads.d_topk_scores, {scale * slot0.d_weight, scale * slot1.d_weight},
                       "d_topk_scores");
  expect_near_relative(grads.d_experts[2].gate, slot0.grad.gate, "experts[2].gate");
  expect_near_relative(grads.d_experts[2].up, slot0.grad.up, "experts[2].up");
  expect_near_relative(grads.d_experts[2].down, slot0.grad.down, "experts[2].down");
  expect_near_relative(grads.d_shared->gate, shared.grad.gate, "shared.gate");
  expect_near_relative(grads.d_shared->down, shared.grad.down, "shared.down");

  // One expert per rank: each route its own group (F4), rounded before the home's sum.
  p.options.experts_per_rank = 1;
  const auto per_rank = reference_forward(p.layer, p.inputs, p.options);
  for (size_t d = 0; d < y.size(); ++d) {
    y[d] = round_to_bf16(round_to_bf16(c * shared.output[d]) + round_to_bf16(g0 * slot0.output[d]) +
                         round_to_bf16(g1 * slot1.output[d]));
  }
  expect_near_relative(per_rank.y, y, "y, one expert per rank");
  EXPECT_GT(relative_difference(per_rank.y, forward.y), 0.0) << "the groups made no difference";

  // B4's groups (the fused backward's dx per (token, rank)): both routes in one group, summed and
  // rounded to bf16 before the shared row's dx joins them; each alone (-1) is the plain sum.
  p.options.dx_route_groups = {7, 7};
  const auto grouped_forward = reference_forward(p.layer, p.inputs, p.options);
  const auto grouped = reference_backward(p.layer, p.inputs, grouped_forward, p.dy);
  for (size_t d = 0; d < dx.size(); ++d) dx[d] = round_to_bf16(shared.dx[d] + round_to_bf16(slot0.dx[d] + slot1.dx[d]));
  expect_near_relative(grouped.dx, dx, "dx, both routes in one group");
  EXPECT_GT(relative_difference(grouped.dx, grads.dx), 0.0) << "the dx group made no difference";
  expect_near_relative(grouped.d_topk_scores, grads.d_topk_scores, "d_topk_scores, dx groups");
  p.options.dx_route_groups = {-1, -1};
  const auto alone_forward = reference_forward(p.layer, p.inputs, p.options);
  EXPECT_EQ(reference_backward(p.layer, p.inputs, alone_forward, p.dy).dx, grads.dx) << "every route alone";
  p.options.dx_route_groups = {7};
  const auto bad_forward = reference_forward(p.layer, p.inputs, p.options);
  expect_error_containing([&] { (void)reference_backward(p.layer, p.inputs, bad_forward, p.dy); },
                          "options.dx_route_groups must be empty or hold T * k = 2 entries, got 1");
}

// ---- Bad inputs ------------------------------------------------------------------------------

// fp8_experts: the routed and the shared experts' GEMMs read e4m3 operands, ~2^-4 relative a value,
// so y, dx and every weight gradient move by a few percent against the bf16 mode; refused without
// the bf16 rounding or on dimensions that are not multiples of 128 (the shared I's too).
TEST_F(ReferenceTest, Fp8ExpertsQuantizesTheRoutedAndSharedOperands) {
  ProblemShape shape;
  shape.tokens = 32;
  shape.hidden = 128;
  shape.intermediate = 128;
  shape.experts = 4;
  shape.top_k = 2;
  shape.shared_intermediate = 128;
  shape.shared_scale = true;
  Problem p = random_problem(rng_, shape, {false, 2.5});
  p.options.round_intermediates_to_bf16 = true;
  const auto bf16_fwd = reference_forward(p.layer, p.inputs, p.options);
  const auto bf16 = reference_backward(p.layer, p.inputs, bf16_fwd, p.dy);
  p.options.fp8_experts = true;
  const auto fp8_fwd = reference_forward(p.layer, p.inputs, p.options);
  const auto fp8 = reference_backward(p.layer, p.inputs, fp8_fwd, p.dy);
  for (const auto& [name, a, b] : {std::tuple{"y", &fp8_fwd.y, &bf16_fwd.y}, std::tuple{"dx", &fp8.dx, &bf16.dx},
                                   std::tuple{"d_w_down[0]", &fp8.d_experts[0].down, &bf16.d_experts[0].down},
                                   std::tuple{"d_w_gate[0]", &fp8.d_experts[0].gate, &bf16.d_experts[0].gate},
                                   std::tuple{"d_shared.down", &fp8.d_shared->down, &bf16.d_shared->down},
                                   std::tuple{"d_shared.gate", &fp8.d_shared->gate, &bf16.d_shared->gate},
                                   std::tuple{"d_shared_scale", &fp8.d_shared_scale, &bf16.d_shared_scale}}) {
    SCOPED_TRACE(name);
    EXPECT_GT(relative_difference(*a, *b), 5e-3) << "e4m3 operands change nothing";
    EXPECT_LT(relative_difference(*a, *b), 0.2);
  }
  EXPECT_TRUE(all_bf16(fp8_fwd.y) && all_bf16(fp8.dx));

  p.options.round_intermediates_to_bf16 = false;
  expect_error_containing([&] { (void)reference_forward(p.layer, p.inputs, p.options); },
                          "round_intermediates_to_bf16");
  ProblemShape odd = shape;
  odd.hidden = 64;
  Problem q = random_problem(rng_, odd, {false, 1.0});
  q.options.round_intermediates_to_bf16 = true;
  q.options.fp8_experts = true;
  expect_error_containing([&] { (void)reference_forward(q.layer, q.inputs, q.options); }, "multiples of 128");
  ProblemShape odd_shared = shape;
  odd_shared.shared_intermediate = 48;
  Problem r = random_problem(rng_, odd_shared, {false, 1.0});
  r.options.round_intermediates_to_bf16 = true;
  r.options.fp8_experts = true;
  expect_error_containing([&] { (void)reference_forward(r.layer, r.inputs, r.options); }, "shared I = 48");
}

TEST_F(ReferenceTest, RejectsBadInputsNamingTheArgument) {
  ProblemShape shape;
  shape.shared_intermediate = 4;
  shape.shared_scale = true;
  const Problem good = random_problem(rng_, shape, {true, 1.0});
  auto forward_of = [](const Problem& p) { reference_forward(p.layer, p.inputs, p.options); };
  ASSERT_NO_THROW(forward_of(good));

  Problem p = good;
  p.inputs.x.pop_back();
  expect_error_containing([&] { forward_of(p); }, "x has 31 values, expected 32");
  p = good;
  p.inputs.topk_idx.push_back(0);
  expect_error_containing([&] { forward_of(p); }, "topk_idx has 13 values, expected 12");
  p = good;
  p.inputs.topk_scores.clear();
  expect_error_containing([&] { forward_of(p); }, "topk_scores has 0 values, expected 12");
  p = good;
  p.inputs.shared_scale.pop_back();
  expect_error_containing([&] { forward_of(p); }, "shared_scale has 3 values, expected 4");
  p = good;
  p.layer.shared.reset();
  expect_error_containing([&] { forward_of(p); }, "shared_scale is given");
  p = good;
  set_route(p, 1, 2, 6);
  expect_error_containing([&] { forward_of(p); }, "topk_idx[token 1][slot 2] = 6");
  p = good;
  set_route(p, 3, 0, -2);
  expect_error_containing([&] { forward_of(p); }, "topk_idx[token 3][slot 0] = -2");
  p = good;
  p.layer.experts[2].down.pop_back();
  expect_error_containing([&] { forward_of(p); }, "experts[2].down has 39 values, expected 40");
  p = good;
  p.layer.experts[1] = random_expert(rng_, 8, 6);
  expect_error_containing([&] { forward_of(p); }, "experts[1].intermediate is 6, expected 5");
  p = good;
  p.layer.shared = random_expert(rng_, 4, 4);
  expect_error_containing([&] { forward_of(p); }, "shared.hidden is 4, expected 8");
  p = good;
  p.layer.experts.clear();
  expect_error_containing([&] { forward_of(p); }, "experts must hold at least one");

  const auto forward = reference_forward(good.layer, good.inputs, good.options);
  std::vector<double> short_dy = good.dy;
  short_dy.pop_back();
  expect_error_containing(
      [&] { reference_backward(good.layer, good.inputs, forward, short_dy); },
      "dy has 31 values, expected 32");
  shape.tokens = 2;
  const Problem fewer_tokens = random_problem(rng_, shape, {true, 1.0});
  expect_error_containing(
      [&] {
        reference_backward(fewer_tokens.layer, fewer_tokens.inputs, forward, fewer_tokens.dy);
      },
      "forward.y has 32 values, expected 16");
}

// A token whose valid scores sum to exactly 0 has no defined weights: g = 0, so its routed experts
// add nothing (y equals the same token with every slot empty) and its score gradients are 0.
TEST_F(ReferenceTest, AZeroScoreSumGivesZeroWeightsAndZeroScoreGradients) {
  ProblemShape shape;
  shape.shared_intermediate = 4;
  Problem p = random_problem(rng_, shape, {true, 1.0});
  set_routes(p, 2, {0, -1, 5});
  set_score(p, 2, 0, 0.5);
  set_score(p, 2, 1, 1.0);  // an empty slot's score does not count
  set_score(p, 2, 2, -0.5);
  const ReferenceForwardResult forward = reference_forward(p.layer, p.inputs, p.options);
  const ReferenceGradients grads = reference_backward(p.layer, p.inputs, forward, p.dy);
  Problem empty = p;
  set_routes(empty, 2, {-1, -1, -1});
  const ReferenceForwardResult without = reference_forward(empty.layer, empty.inputs, empty.options);
  const auto k = static_cast<size_t>(shape.top_k), D = static_cast<size_t>(shape.hidden);
  for (size_t j = 0; j < k; ++j) {
    EXPECT_EQ(forward.gates[2 * k + j], 0.0) << "slot " << j;
    EXPECT_EQ(grads.d_topk_scores[2 * k + j], 0.0) << "slot " << j;
  }
  for (size_t d = 0; d < D; ++d) EXPECT_EQ(forward.y[2 * D + d], without.y[2 * D + d]) << "y[2][" << d << "]";
  for (double v : grads.dx) EXPECT_TRUE(std::isfinite(v));
  for (double v : grads.d_topk_scores) EXPECT_TRUE(std::isfinite(v));
  p.options.router.normalize = false;  // without normalization g = scale * s as usual
  const ReferenceForwardResult scaled = reference_forward(p.layer, p.inputs, p.options);
  EXPECT_EQ(scaled.gates[2 * k], 0.5);
}

// ---- bf16 helpers ----------------------------------------------------------------------------

TEST(Bf16, KnownValues) {
  EXPECT_EQ(bf16_bits(1.0f), 0x3F80);
  EXPECT_EQ(bf16_bits(-2.0f), 0xC000);
  EXPECT_EQ(bf16_bits(0.0f), 0x0000);
  EXPECT_EQ(bf16_bits(-0.0f), 0x8000);
  EXPECT_EQ(bf16_to_float(0x4049), 3.140625f);
  EXPECT_EQ(round_to_bf16(3.14159265358979), 3.140625);
  EXPECT_EQ(round_to_bf16(1.0 / 3.0), 0.333984375);  // 0x3EAB: the dropped half is above the tie
  EXPECT_EQ(round_to_bf16(-1.0 / 3.0), -0.333984375);
  // Subnormals: the smallest bf16 one survives, the smallest float one rounds to zero.
  EXPECT_EQ(round_to_bf16(std::ldexp(1.0, -133)), std::ldexp(1.0, -133));
  EXPECT_EQ(round_to_bf16(std::ldexp(1.0, -149)), 0.0);
}

TEST(Bf16, RoundsToNearestTiesToEven) {
  const double ulp = std::ldexp(1.0, -7);  // bf16 spacing in [1, 2)
  EXPECT_EQ(round_to_bf16(1.0 + ulp / 2), 1.0);              // tie, 1.0 is even
  EXPECT_EQ(round_to_bf16(1.0 + 3 * ulp / 2), 1.0 + 2 * ulp);  // tie, 1 + ulp is odd
  EXPECT_EQ(round_to_bf16(-(1.0 + ulp / 2)), -1.0);
  EXPECT_EQ(round_to_bf16(1.0 + ulp / 2 + std::ldexp(1.0, -20)), 1.0 + ulp);  // above the tie
  EXPECT_EQ(round_to_bf16(1.0 + ulp / 2 - std::ldexp(1.0, -20)), 1.0);        // below the tie
  EXPECT_EQ(round_to_bf16(2.0 - ulp / 4), 2.0);  // carries into the exponent
}

TEST(Bf16, PreservesNanAndInfinity) {
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(std::isnan(round_to_bf16(std::numeric_limits<double>::quiet_NaN())));
  EXPECT_EQ(round_to_bf16(inf), inf);
  EXPECT_EQ(round_to_bf16(-inf), -inf);
  EXPECT_EQ(bf16_bits(std::numeric_limits<float>::infinity()), 0x7F80);
  // A NaN whose payload lies only in the dropped half must not become Inf.
  const uint32_t low_payload_nan = 0x7F800001u;
  float nan_value = 0.0f;
  std::memcpy(&nan_value, &low_payload_nan, sizeof nan_value);
  EXPECT_TRUE(std::isnan(bf16_to_float(bf16_bits(nan_value))));
  // Beyond the largest bf16 (0x7F7F) rounding goes to Inf; the largest bf16 itself stays.
  EXPECT_EQ(bf16_bits(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(round_to_bf16(1e300), inf);
  EXPECT_EQ(bf16_bits(bf16_to_float(0x7F7F)), 0x7F7F);
}

TEST(Bf16, BufferConversionsRoundTrip) {
  const std::vector<uint16_t> bits = {0x3F80, 0xC000, 0x4049, 0x0001, 0x7F7F, 0xFF80};
  const std::vector<double> values = from_bf16_bits(bits);
  EXPECT_EQ(values[0], 1.0);
  EXPECT_EQ(values[1], -2.0);
  EXPECT_EQ(to_bf16_bits(values), bits);
  EXPECT_EQ(to_bf16_bits({1.0 + std::ldexp(1.0, -8)}), std::vector<uint16_t>{0x3F80});
}

}  // namespace
}  // namespace caracal
