// `caracal bench`'s host side without a GPU: the one mapping of its command line to the layers'
// options and experiments, what its validation runs (the timed options, the ring scaled to its step, what
// it says it does not validate), and the check of a step against the fp64 reference, which passes
// the reference's own values and fails deliberately wrong ones.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "caracal/bf16.hpp"
#include "caracal/error.hpp"
#include "caracal/reference.hpp"
#include "layer_options.hpp"
#include "validation_check.hpp"
#include "validation_plan.hpp"
#include "validation_report.hpp"
#include "validation_ring.hpp"

namespace caracal::bench_tool {
namespace {

constexpr int kSms = 132;

// ---- The layers' options -----------------------------------------------------------------------

TEST(BenchLayerOptions, EveryFlagReachesItsOptionOrExperiment) {
  BenchOptions a;
  a.exchange_sms = 20;
  a.fused_comm_ctas = 3;
  a.fused_pull_all_rows = true;
  a.rows_per_route = true;
  a.dx_rows_per_route = true;
  a.ring_rows = 256;
  a.bf16_weight_grads = true;
  const LayerSetup s = layer_setup(a, true);
  EXPECT_EQ(s.options.exchange_sms, 20);
  EXPECT_TRUE(s.options.fused_forward);
  EXPECT_EQ(s.options.fused_comm_ctas, 3);
  EXPECT_EQ(s.options.ring_rows, 256);
  EXPECT_TRUE(s.options.bf16_weight_gradients);
  EXPECT_TRUE(s.experiments.pull_all_rows);
  EXPECT_TRUE(s.experiments.rows_per_route);
  EXPECT_TRUE(s.experiments.dx_rows_per_route);
  EXPECT_FALSE(layer_setup(a, false).options.fused_forward);
}

TEST(BenchLayerOptions, DefaultsAreTheLayersButTheGradientPrecision) {
  const BenchOptions a;
  nlohmann::json got = setup_json(layer_setup(a, true));
  LayerSetup layer;
  layer.options.bf16_weight_gradients = false;  // fp32 weight gradients unless --bf16-weight-grads
  EXPECT_EQ(got, setup_json(layer));
  // v1's options differ from the fused layer's in fused_forward alone.
  nlohmann::json v1 = setup_json(layer_setup(a, false));
  EXPECT_FALSE(v1.at("fused_forward").get<bool>());
  v1["fused_forward"] = true;
  EXPECT_EQ(v1, got);
}

// ---- The validation's ring and plan --------------------------------------------------------------

// The smoke tests' tiny shape: D=256 I=128 E=8 k=2, a shared expert of I=128.
LayerConfig tiny(int64_t tokens, int64_t ep = 1) {
  LayerConfig c;
  c.shape = LayerShape{256, 128, 8, 2, 1, 128};
  c.ep_size = ep;
  c.tokens_per_rank = tokens;
  c.validate();
  return c;
}

Routing routing_of(const LayerConfig& c, const RoutingSpec& spec) {
  return make_routing(spec, c.ep_size, c.tokens_per_rank, c.shape.top_k, c.shape.num_experts);
}

TEST(BenchValidationRing, MacrobatchesArePaddedRowsOverTheRing) {
  RoutingSpec all_to_one;
  all_to_one.kind = RoutingKind::kAllToOne;
  const LayerConfig c = tiny(100);
  // 200 routes to one expert: 256 padded rows.
  EXPECT_EQ(macrobatches(routing_of(c, all_to_one), 8, 128), 2);
  EXPECT_EQ(macrobatches(routing_of(c, all_to_one), 8, 256), 1);
  EXPECT_EQ(resolved_ring(c, 384, kSms), 384);
  EXPECT_GT(resolved_ring(c, 0, kSms), 0);
}

TEST(BenchValidationRing, KeepsTheTimedRingWhereItGivesAsManyMacrobatches) {
  const LayerConfig small = small_config(tiny(256));
  const Routing routing = routing_of(small, RoutingSpec{});
  const RingChoice one = choose_ring(0, 1, small, routing, kSms);
  EXPECT_EQ(one.option, 0);
  EXPECT_EQ(one.macrobatches, 1);
  EXPECT_EQ(one.how, "the default ring, as timed");
  const int64_t rows_128 = macrobatches(routing, small.shape.num_experts, 128);
  ASSERT_GE(rows_128, 2);
  const RingChoice same = choose_ring(128, rows_128, small, routing, kSms);
  EXPECT_EQ(same.option, 128);
  EXPECT_EQ(same.how, "the timed ring");
}

TEST(BenchValidationRing, ScalesTheRingToTheTimedMacrobatches) {
  const LayerConfig small = small_config(tiny(256));
  const Routing routing = routing_of(small, RoutingSpec{});
  // The timed ring of 4096 rows holds the small step in one macrobatch, the timed step in 2.
  const RingChoice two = choose_ring(4096, 2, small, routing, kSms);
  EXPECT_EQ(two.macrobatches, 2);
  EXPECT_EQ(two.option % 128, 0);
  EXPECT_LT(two.option, 4096);
  EXPECT_EQ(two.how, "scaled");
  // More than the small step can have: as many as it can (a ring of 128 rows).
  const RingChoice most = choose_ring(4096, 1000, small, routing, kSms);
  EXPECT_EQ(most.option, 128);
  EXPECT_EQ(most.macrobatches, macrobatches(routing, small.shape.num_experts, 128));
  // The default ring holds the timed step in one macrobatch, but a 128-row ring the small one in several.
  const RingChoice one = choose_ring(128, 1, small, routing, kSms);
  EXPECT_EQ(one.macrobatches, 1);
  EXPECT_EQ(one.how, "scaled");
}

TEST(BenchValidationPlan, ValidatesTheTimedLayersWithTheirOptions) {
  BenchOptions a;
  a.exchange_sms = 24;
  a.bf16_weight_grads = true;
  a.graph = true;
  a.backend = "nccl";
  const ValidationPlan p = plan_validation(a, {tiny(256, 2)}, RoutingSpec{}, kSms);
  EXPECT_EQ(p.small.shape.hidden, 256);
  EXPECT_EQ(p.small.shape.intermediate, 128);
  EXPECT_EQ(p.small.tokens_per_rank, 37);
  EXPECT_EQ(p.small.ep_size, 2);
  EXPECT_EQ(p.small.shape.num_experts, 8);
  EXPECT_EQ(p.backend, "nccl");
  EXPECT_TRUE(p.bf16_weight_grads);
  EXPECT_TRUE(p.graph);
  ASSERT_EQ(p.layers.size(), 2u);
  EXPECT_EQ(p.layers[0].name, "fused");
  EXPECT_EQ(setup_json(p.layers[0].setup), setup_json(layer_setup(a, true)));
  EXPECT_EQ(setup_json(p.layers[0].timed_setup), setup_json(layer_setup(a, true)));
  EXPECT_EQ(p.layers[1].name, "v1");
  EXPECT_EQ(setup_json(p.layers[1].setup), setup_json(layer_setup(a, false)));
  ASSERT_GE(p.not_validated.size(), 2u);
  EXPECT_NE(p.not_validated[0].find("the timed size"), std::string::npos) << p.not_validated[0];
  EXPECT_NE(p.not_validated.back().find("graphs"), std::string::npos) << p.not_validated.back();
}

TEST(BenchValidationPlan, SaysWhereTheValidatedStepHasFewerMacrobatches) {
  BenchOptions a;
  a.ring_rows = 128;
  const ValidationPlan p = plan_validation(a, {tiny(256)}, RoutingSpec{}, kSms);
  const ValidatedLayer& fused = p.layers.at(0);
  EXPECT_EQ(fused.setup.options.ring_rows, 128);
  ASSERT_EQ(fused.timed.size(), 1u);
  EXPECT_GT(fused.timed[0].macrobatches, fused.ring.macrobatches);  // 512 routes vs 74 on 4 experts
  const std::string timed = std::to_string(fused.timed[0].macrobatches) + " macrobatches";
  const auto says = [&](const std::vector<std::string>& lines) {
    for (const std::string& n : lines) {
      if (n.find(timed) != std::string::npos) return true;
    }
    return false;
  };
  EXPECT_TRUE(says(not_validated(p, {LayerValidation{fused, 128, {}}, LayerValidation{p.layers.at(1), 0, {}}})));
  // A layer that ran without a ring (v1's launches, as the fused path at W > 8) has no macrobatches to speak of.
  EXPECT_FALSE(says(not_validated(p, {LayerValidation{fused, 0, {}}})));
}

// BenchSmoke.ScalesTheTimedRingToTheValidatedStep's case: a ring of 1024 rows holds the small
// step in one macrobatch, the timed one (2048 routes) in several.
TEST(BenchValidationPlan, ScalesARingThatHoldsTheSmallStepInOne) {
  BenchOptions a;
  a.ring_rows = 1024;
  const ValidationPlan p = plan_validation(a, {tiny(1024)}, RoutingSpec{}, kSms);
  const ValidatedLayer& fused = p.layers.at(0);
  EXPECT_GE(fused.timed.at(0).macrobatches, 2);
  EXPECT_GE(fused.ring.macrobatches, 2);
  EXPECT_LT(fused.setup.options.ring_rows, 1024);
  EXPECT_EQ(fused.ring.how, "scaled");
}

TEST(BenchValidationPlan, OneFusedLayerPerRingASweepAsksFor) {
  BenchOptions a;
  a.ring_rows = 1024;
  a.profile_step = true;  // runs the fused layer only: no v1
  const ValidationPlan p = plan_validation(a, {tiny(64), tiny(4096)}, RoutingSpec{}, kSms);
  ASSERT_EQ(p.layers.size(), 2u);
  EXPECT_EQ(p.layers[0].ring.macrobatches, 1);
  EXPECT_GT(p.layers[1].ring.macrobatches, 1);
  for (const ValidatedLayer& l : p.layers) {
    EXPECT_EQ(l.name, "fused");
    nlohmann::json options = setup_json(l.setup), timed = setup_json(l.timed_setup);
    options.erase("ring_rows");
    timed.erase("ring_rows");
    EXPECT_EQ(options, timed);
  }
}

TEST(BenchValidationPlan, ProfilingV1ValidatesV1Alone) {
  BenchOptions a;
  a.profile_step = true;
  a.profile_path = "v1";
  const ValidationPlan p = plan_validation(a, {tiny(256)}, RoutingSpec{}, kSms);
  ASSERT_EQ(p.layers.size(), 1u);
  EXPECT_EQ(p.layers[0].name, "v1");
  EXPECT_FALSE(p.layers[0].setup.options.fused_forward);
}

// ---- The check against the reference -------------------------------------------------------------

// A step of a small layer (D=64 I=32 E=4 k=2 W=2 T=13, a shared expert of I=48) whose outputs are
// the reference's own values (the layer's bf16 outputs rounded as the reference rounds them).
struct ExactStep {
  LayerConfig config;
  Routing routing;
  std::vector<RankStep> ranks;

  ExactStep() {
    config.shape = LayerShape{64, 32, 4, 2, 1, 48};  // D, I, E, k, shared experts, shared I
    config.ep_size = 2;
    config.tokens_per_rank = 13;
    RoutingSpec spec;
    spec.seed = 11;
    routing = routing_of(config, spec);
    const size_t D = 64, I = 32, L = 2, Is = 48, T = 13, k = 2;
    std::mt19937_64 rng(12);
    const auto bits = [&](size_t n, double bound) {
      std::uniform_real_distribution<double> u(-bound, bound);
      std::vector<uint16_t> v(n);
      for (uint16_t& b : v) b = bf16_bits(static_cast<float>(u(rng)));
      return v;
    };
    ReferenceLayer layer;
    for (int r = 0; r < 2; ++r) {
      RankStep s;
      s.x = bits(T * D, 1.0);
      s.dy = bits(T * D, 1.0);
      s.scores.resize(T * k);
      for (float& v : s.scores) v = static_cast<float>(std::uniform_real_distribution<double>(0.05, 1.0)(rng));
      s.w_gate = bits(L * I * D, 0.2);
      s.w_up = bits(L * I * D, 0.2);
      s.w_down = bits(L * D * I, 0.3);
      s.shared_gate = bits(Is * D, 0.2);
      s.shared_up = bits(Is * D, 0.2);
      s.shared_down = bits(D * Is, 0.25);
      for (size_t l = 0; l < L; ++l) {
        const auto part = [&](const std::vector<uint16_t>& v, size_t n) {
          return from_bf16_bits(std::vector<uint16_t>(v.begin() + static_cast<std::ptrdiff_t>(l * n),
                                                      v.begin() + static_cast<std::ptrdiff_t>((l + 1) * n)));
        };
        layer.experts.push_back(ExpertWeights{int64_t(D), int64_t(I), part(s.w_gate, I * D), part(s.w_up, I * D),
                                              part(s.w_down, D * I)});
      }
      ranks.push_back(s);
    }
    const std::vector<ReferenceOptions> options =
        checks::layer_reference_options(config.router, routing, 4, checks::LayerRounding{});
    std::vector<ExpertGradients> routed(4, ExpertGradients::zeros(int64_t(D), int64_t(I)));
    for (int r = 0; r < 2; ++r) {
      RankStep& s = ranks[size_t(r)];
      layer.shared = ExpertWeights{int64_t(D), int64_t(Is), from_bf16_bits(s.shared_gate),
                                   from_bf16_bits(s.shared_up), from_bf16_bits(s.shared_down)};
      ReferenceInputs in;
      in.tokens = int64_t(T);
      in.top_k = int64_t(k);
      in.x = from_bf16_bits(s.x);
      in.topk_idx.assign(routing.rank_topk(r), routing.rank_topk(r) + T * k);
      in.topk_scores.assign(s.scores.begin(), s.scores.end());
      const ReferenceForwardResult f = reference_forward(layer, in, options[size_t(r)]);
      const ReferenceGradients g = reference_backward(layer, in, f, from_bf16_bits(s.dy));
      s.y = to_bf16_bits(f.y);
      s.dx = to_bf16_bits(g.dx);
      s.d_scores.assign(g.d_topk_scores.begin(), g.d_topk_scores.end());
      s.d_shared_gate.assign(g.d_shared->gate.begin(), g.d_shared->gate.end());
      s.d_shared_up.assign(g.d_shared->up.begin(), g.d_shared->up.end());
      s.d_shared_down.assign(g.d_shared->down.begin(), g.d_shared->down.end());
      for (size_t e = 0; e < 4; ++e) {
        for (size_t i = 0; i < I * D; ++i) {
          routed[e].gate[i] += g.d_experts[e].gate[i];
          routed[e].up[i] += g.d_experts[e].up[i];
          routed[e].down[i] += g.d_experts[e].down[i];
        }
      }
    }
    for (size_t r = 0; r < 2; ++r) {
      for (size_t l = 0; l < L; ++l) {
        const ExpertGradients& g = routed[r * L + l];
        ranks[r].d_w_gate.insert(ranks[r].d_w_gate.end(), g.gate.begin(), g.gate.end());
        ranks[r].d_w_up.insert(ranks[r].d_w_up.end(), g.up.begin(), g.up.end());
        ranks[r].d_w_down.insert(ranks[r].d_w_down.end(), g.down.begin(), g.down.end());
      }
    }
  }

  StepCheck check(const std::vector<RankStep>& got, bool bf16 = false) const {
    return check_step(config, routing, got, checks::LayerRounding{}, bf16);
  }
};

const OutputCheck& output(const StepCheck& c, const std::string& name) {
  for (const OutputCheck& o : c.outputs) {
    if (o.output == name) return o;
  }
  throw Error("no output " + name);
}

TEST(BenchValidationCheck, TheReferencesOwnValuesPass) {
  const ExactStep s;
  const StepCheck c = s.check(s.ranks);
  EXPECT_TRUE(c.passed()) << c.first_failure();
  EXPECT_EQ(c.first_failure(), "");
  ASSERT_EQ(c.outputs.size(), 9u);  // y, dx, d_topk_scores, 3 routed and 3 shared weight gradients
  for (const OutputCheck& o : c.outputs) {
    for (const Measure& m : o.measures) {
      EXPECT_LE(m.error, 1e-4) << o.output << " " << m.name;  // fp32 of the reference's values
      EXPECT_GT(m.bound, 0.0) << o.output << " " << m.name;
    }
  }
  EXPECT_EQ(output(c, "y").measures.at(0).bound, checks::kLayerBounds.y.frobenius);
  EXPECT_EQ(output(c, "y").measures.at(1).bound, checks::kLayerBounds.y.row);
  EXPECT_EQ(output(c, "d_w_down").measures.at(1).bound, checks::kLayerBounds.weight_grad.row);
}

TEST(BenchValidationCheck, DeliberatelyWrongOutputsFail) {
  const ExactStep s;
  const size_t D = 64;
  {
    std::vector<RankStep> got = s.ranks;  // one token's y 2% off on rank 1
    for (size_t d = 0; d < D; ++d) got[1].y[5 * D + d] = bf16_bits(1.02f * bf16_to_float(got[1].y[5 * D + d]));
    const StepCheck c = s.check(got);
    EXPECT_FALSE(output(c, "y").passed());
    EXPECT_EQ(output(c, "y").worst_rank, 1);
    EXPECT_NE(c.first_failure().find("rank 1 y"), std::string::npos) << c.first_failure();
    EXPECT_TRUE(output(c, "dx").passed());
  }
  {
    std::vector<RankStep> got = s.ranks;  // one dx element never written
    got[0].dx[7] = bf16_bits(std::numeric_limits<float>::quiet_NaN());
    const StepCheck c = s.check(got);
    const OutputCheck& dx = output(c, "dx");
    ASSERT_FALSE(dx.passed());
    EXPECT_NE(dx.failures[0].find("not written"), std::string::npos) << dx.failures[0];
  }
  {
    std::vector<RankStep> got = s.ranks;  // rank 0's second expert's d_w_down 0.5% off
    for (size_t i = D * 32; i < 2 * D * 32; ++i) got[0].d_w_down[i] *= 1.005f;
    const StepCheck c = s.check(got);
    EXPECT_FALSE(output(c, "d_w_down").passed());
    EXPECT_TRUE(output(c, "d_w_gate").passed());
  }
  {
    std::vector<RankStep> got = s.ranks;  // rank 1's largest score gradient 5% off
    size_t at = 0;
    for (size_t i = 0; i < got[1].d_scores.size(); ++i) {
      if (std::abs(got[1].d_scores[i]) > std::abs(got[1].d_scores[at])) at = i;
    }
    got[1].d_scores[at] *= 1.05f;
    EXPECT_FALSE(output(s.check(got), "d_topk_scores").passed());
  }
  {
    std::vector<RankStep> got = s.ranks;  // the shared expert's d_w_up 1% off on rank 1
    for (float& v : got[1].d_shared_up) v *= 1.01f;
    EXPECT_FALSE(output(s.check(got), "d_shared_w_up").passed());
  }
}

// bf16 weight gradients: the exact ones rounded to bf16 pass the widened bound; 2% off fails it.
TEST(BenchValidationCheck, Bf16WeightGradientsHaveTheRoundingOnTopOfTheBound) {
  const ExactStep s;
  std::vector<RankStep> got = s.ranks;
  for (RankStep& r : got) {
    for (std::vector<float>* v : {&r.d_w_gate, &r.d_w_up, &r.d_w_down, &r.d_shared_gate, &r.d_shared_up, &r.d_shared_down}) {
      for (float& x : *v) x = bf16_to_float(bf16_bits(x));
    }
  }
  const StepCheck rounded = s.check(got, true);
  EXPECT_TRUE(rounded.passed()) << rounded.first_failure();
  EXPECT_DOUBLE_EQ(output(rounded, "d_w_gate").measures.at(0).bound,
                   checks::bf16_rounded(checks::kLayerBounds.weight_grad).frobenius);
  for (float& x : got[0].d_w_gate) x *= 1.02f;
  EXPECT_FALSE(output(s.check(got, true), "d_w_gate").passed());
}

TEST(BenchValidationCheck, RefusesOutputsOfTheWrongSize) {
  const ExactStep s;
  std::vector<RankStep> got = s.ranks;
  got[1].d_w_up.pop_back();
  try {
    (void)s.check(got);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1's d_w_up"), std::string::npos) << e.what();
  }
}

// ---- The report ------------------------------------------------------------------------------------

// The JSON and table of a validation, as BenchSmoke reads them: per layer its options and the timed
// ones, the fused layer's ring, per output each measure's error and bound; the failure named.
TEST(BenchValidationReport, GivesEachOutputsErrorAndBound) {
  const ExactStep s;
  BenchOptions a;
  a.ring_rows = 128;
  a.graph = true;
  const ValidationPlan plan = plan_validation(a, {tiny(256)}, RoutingSpec{}, kSms);
  std::vector<LayerValidation> results = {{plan.layers.at(0), 128, s.check(s.ranks)},
                                          {plan.layers.at(1), 0, s.check(s.ranks)}};
  testing::internal::CaptureStdout();
  print_validation(plan, results);
  const std::string table = testing::internal::GetCapturedStdout();
  EXPECT_NE(table.find("through CUDA graph replays: passed"), std::string::npos) << table;
  EXPECT_NE(table.find("fused, ring 128 rows (the timed ring)"), std::string::npos) << table;
  EXPECT_NE(table.find("not validated: the timed size"), std::string::npos) << table;
  EXPECT_NE(table.find("            y                frobenius 0.00e+00 <= 4.00e-03, row 0.00e+00 <= 1.30e-02"),
            std::string::npos)
      << table;

  const nlohmann::json v = validation_json(plan, results);
  EXPECT_TRUE(v.at("ran").get<bool>());
  EXPECT_TRUE(v.at("passed").get<bool>());
  EXPECT_EQ(v.at("backend"), "loopback");
  EXPECT_EQ(v.at("ep"), 1);
  EXPECT_EQ(v.at("weight_grads"), "fp32");
  EXPECT_TRUE(v.at("graph").get<bool>());
  EXPECT_EQ(v.at("config").at("tokens_per_rank"), 37);
  EXPECT_FALSE(v.contains("first_failure"));
  ASSERT_EQ(v.at("layers").size(), 2u);
  const nlohmann::json& fused = v.at("layers")[0];
  EXPECT_EQ(fused.at("layer"), "fused");
  EXPECT_EQ(fused.at("options"), setup_json(layer_setup(a, true)));
  EXPECT_EQ(fused.at("timed_options"), setup_json(layer_setup(a, true)));
  EXPECT_EQ(fused.at("ring").at("how"), "the timed ring");
  EXPECT_EQ(fused.at("ring").at("rows"), 128);
  EXPECT_GE(fused.at("ring").at("timed")[0].at("macrobatches").get<int64_t>(), 2);
  EXPECT_FALSE(v.at("layers")[1].contains("ring"));
  ASSERT_EQ(fused.at("outputs").size(), 9u);
  for (const nlohmann::json& o : fused.at("outputs")) {
    EXPECT_TRUE(o.at("passed").get<bool>());
    for (const auto& [measure, error] : o.at("error").items()) {
      ASSERT_TRUE(error.is_number()) << o.dump();
      EXPECT_LE(error.get<double>(), o.at("bound").at(measure).get<double>()) << o.dump();
    }
  }
  EXPECT_EQ(fused.at("outputs")[2].at("output"), "d_topk_scores");
  EXPECT_EQ(fused.at("outputs")[2].at("bound").at("slot"), 1.0);

  std::vector<RankStep> wrong = s.ranks;  // one y element never written: named, and null in the JSON
  wrong[0].y[3] = bf16_bits(std::numeric_limits<float>::quiet_NaN());
  results[1].check = s.check(wrong);
  EXPECT_FALSE(passed(results));
  EXPECT_NE(first_failure(results).find("v1: rank 0 y: 1 elements not written"), std::string::npos)
      << first_failure(results);
  const nlohmann::json failed = validation_json(plan, results);
  EXPECT_FALSE(failed.at("passed").get<bool>());
  EXPECT_EQ(failed.at("first_failure"), first_failure(results));
  const nlohmann::json& y = failed.at("layers")[1].at("outputs")[0];
  EXPECT_FALSE(y.at("passed").get<bool>());
  EXPECT_EQ(y.at("failures").size(), 1u);
  testing::internal::CaptureStdout();
  print_validation(plan, results);
  EXPECT_NE(testing::internal::GetCapturedStdout().find("FAILED: rank 0 y"), std::string::npos);
}

}  // namespace
}  // namespace caracal::bench_tool
