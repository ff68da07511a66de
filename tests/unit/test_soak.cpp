// caracal-soak's host side without a GPU: the checksum's tail (an output whose byte count is not a
// multiple of 8), which steps are checked against the reference, and the sampled reference check
// itself against a full fp64 reference of every rank (outputs that match pass, deliberately wrong
// ones fail, naming the output).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "caracal/bf16.hpp"
#include "caracal/moe_layer.hpp"
#include "caracal/reference.hpp"
#include "caracal/routing.hpp"
#include "soak_checksum.hpp"
#include "soak_reference.hpp"
#include "soak_steps.hpp"

namespace caracal::soak {
namespace {

// ---- Checksum -----------------------------------------------------------------------------------

// The checksum as it was, over whole 8-byte words only.
uint64_t whole_words_checksum(const void* data, size_t bytes) {
  uint64_t sum = 0;
  for (size_t i = 0; i < bytes / 8; ++i) {
    uint64_t w;
    std::memcpy(&w, static_cast<const char*>(data) + i * 8, 8);
    sum += w * (2 * i + 1);
  }
  return sum;
}

TEST(SoakChecksum, CountsTheTailOfAnOddNumberOfFloats) {
  // d_topk_scores with T·k = 3: 12 bytes, one whole word and 4 tail bytes.
  std::vector<float> scores = {0.25f, -1.5f, 3.0f};
  const uint64_t before = host_checksum(scores.data(), 12);
  uint32_t tail;
  std::memcpy(&tail, &scores[2], 4);
  EXPECT_EQ(before, whole_words_checksum(scores.data(), 12) + uint64_t(tail) * 3) << "the tail is word 1, zero-padded";
  scores[2] = 3.5f;
  EXPECT_NE(host_checksum(scores.data(), 12), before) << "a changed last element changes the checksum";
  EXPECT_EQ(whole_words_checksum(scores.data(), 12), whole_words_checksum(scores.data(), 8))
      << "the old checksum never read it";
}

TEST(SoakChecksum, WholeWordsKeepTheirChecksum) {
  std::vector<float> values(6);
  for (size_t i = 0; i < values.size(); ++i) values[i] = float(i) * 0.75f - 2.0f;
  EXPECT_EQ(host_checksum(values.data(), 24), whole_words_checksum(values.data(), 24));
  EXPECT_EQ(checksum_words(24), 3u);
  EXPECT_EQ(checksum_words(20), 3u);
  EXPECT_EQ(checksum_words(0), 0u);
}

TEST(SoakChecksum, EveryTailByteCounts) {
  const unsigned char bytes[13] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
  EXPECT_EQ(checksum_word(bytes, 13, 1), 0x0D0C0B0A09ull);
  for (size_t n = 9; n <= 13; ++n) {
    unsigned char changed[13];
    std::memcpy(changed, bytes, 13);
    changed[n - 1] ^= 0x40;
    EXPECT_NE(host_checksum(changed, n), host_checksum(bytes, n)) << n << " bytes";
  }
}

// ---- Which steps are checked -----------------------------------------------------------------------

TEST(SoakSteps, OneReferenceStepPerWindowVisitingEveryKindAndGradientType) {
  std::set<std::pair<std::string, bool>> visited;
  for (int64_t window = 0; window < 20; ++window) {
    int checked = 0;
    for (int64_t s = window * 50; s < (window + 1) * 50; ++s) {
      if (!is_reference_step(s, 50)) continue;
      ++checked;
      visited.insert({kind_of(s), bf16_gradients(s)});
    }
    EXPECT_EQ(checked, 1) << "window " << window;
  }
  EXPECT_EQ(visited.size(), size_t(2 * kKindCount)) << "every routing kind with both gradient types";
  for (int64_t s = 0; s < 30; ++s) {
    EXPECT_FALSE(is_reference_step(s, 0));
    EXPECT_TRUE(is_reference_step(s, 1));
  }
  int every3 = 0;
  for (int64_t s = 0; s < 30; ++s) every3 += is_reference_step(s, 3) ? 1 : 0;
  EXPECT_EQ(every3, 10);
}

// ---- The reference check ------------------------------------------------------------------------------

struct SmallCase {
  LayerConfig c;
  std::vector<RankWeights> weights;
  Routing routing;
  std::vector<RankStep> ranks;          // inputs, and the full reference's outputs as one path's
  std::vector<ExpertGradients> routed;  // [E] the full reference's, summed over the ranks
};

std::vector<uint16_t> random_bits(size_t n, double bound, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-bound, bound);
  std::vector<uint16_t> out(n);
  for (uint16_t& v : out) v = bf16_bits(float(u(rng)));
  return out;
}

// W = 2, D = I = Is = 64, E = 4, k = 3, T = 5 (T·k odd); the "GPU" outputs are the full fp64
// reference of every rank, summed per (token, rank) as v1 does, rounded as the layer stores them.
SmallCase small_case(RoutingKind kind = RoutingKind::kUniform) {
  SmallCase sc;
  LayerConfig& c = sc.c;
  c.shape = {64, 64, 4, 3, 1, 64};
  c.ep_size = 2;
  c.tokens_per_rank = 5;
  const size_t W = 2, T = 5, k = 3, D = 64, I = 64, L = 2, E = 4;
  std::mt19937_64 rng(7);
  for (size_t r = 0; r < W; ++r) {
    RankWeights w;
    w.w_gate_up = random_bits(L * 2 * I * D, 0.2, rng);
    w.w_down = random_bits(L * D * I, 0.2, rng);
    w.shared_w_gate_up = random_bits(2 * I * D, 0.2, rng);
    w.shared_w_down = random_bits(D * I, 0.2, rng);
    sc.weights.push_back(w);
  }
  const auto expert = [&](const std::vector<uint16_t>& gate_up, const std::vector<uint16_t>& down, size_t l) {
    std::vector<uint16_t> gate(I * D), up(I * D);
    deinterleave_gate_up_host(gate_up.data() + l * 2 * I * D, gate.data(), up.data(), 1, int64_t(I), int64_t(D));
    return ExpertWeights{int64_t(D), int64_t(I), from_bf16_bits(gate), from_bf16_bits(up),
                         from_bf16_bits(std::vector<uint16_t>(down.begin() + int64_t(l * D * I),
                                                              down.begin() + int64_t((l + 1) * D * I)))};
  };
  RoutingSpec spec;
  spec.kind = kind;
  spec.seed = 3;
  spec.empty_slot_fraction = 0.2;
  sc.routing = make_routing(spec, int64_t(W), int64_t(T), int64_t(k), int64_t(E));
  std::vector<ExpertGradients> routed(E, ExpertGradients::zeros(int64_t(D), int64_t(I)));
  std::vector<ReferenceGradients> grads;
  for (size_t r = 0; r < W; ++r) {
    ReferenceLayer layer;
    for (size_t e = 0; e < E; ++e)
      layer.experts.push_back(expert(sc.weights[e / L].w_gate_up, sc.weights[e / L].w_down, e % L));
    layer.shared = expert(sc.weights[r].shared_w_gate_up, sc.weights[r].shared_w_down, 0);
    RankStep step;
    step.x = random_bits(T * D, 1.0, rng);
    step.dy = random_bits(T * D, 1.0, rng);
    std::uniform_real_distribution<float> score(0.05f, 1.0f);
    for (size_t i = 0; i < T * k; ++i) step.topk_scores.push_back(score(rng));
    ReferenceInputs in;
    in.tokens = int64_t(T);
    in.top_k = int64_t(k);
    in.x = from_bf16_bits(step.x);
    const int32_t* ids = sc.routing.rank_topk(int64_t(r));
    in.topk_idx.assign(ids, ids + T * k);
    in.topk_scores.assign(step.topk_scores.begin(), step.topk_scores.end());
    ReferenceOptions options;
    options.round_intermediates_to_bf16 = true;
    options.experts_per_rank = int64_t(L);
    const ReferenceForwardResult f = reference_forward(layer, in, options);
    ReferenceGradients g = reference_backward(layer, in, f, from_bf16_bits(step.dy));
    PathOutputs o;
    o.y = to_bf16_bits(f.y);
    o.dx = to_bf16_bits(g.dx);
    for (const double v : g.d_topk_scores) o.d_topk_scores.push_back(float(v));
    for (size_t e = 0; e < E; ++e) {
      for (size_t i = 0; i < I * D; ++i) {
        routed[e].gate[i] += g.d_experts[e].gate[i];
        routed[e].up[i] += g.d_experts[e].up[i];
        routed[e].down[i] += g.d_experts[e].down[i];
      }
    }
    step.paths.push_back(o);
    sc.ranks.push_back(step);
    grads.push_back(std::move(g));
  }
  // Every rank's shared expert's gradients (a plan names one rank's).
  for (size_t r = 0; r < W; ++r) {
    PathOutputs& o = sc.ranks[r].paths[0];
    const auto floats = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
    std::vector<double> gate_up(2 * I * D);
    interleave_gate_up_weights_host(grads[r].d_shared->gate.data(), grads[r].d_shared->up.data(), gate_up.data(), 1,
                                    int64_t(I), int64_t(D));
    o.shared_gate_up = floats(gate_up);
    o.shared_down = floats(grads[r].d_shared->down);
  }
  sc.routed = std::move(routed);
  sc.c.validate();
  return sc;
}

// Puts the full reference's gradients of `expert` (summed over the ranks) where the home rank's
// download would.
void set_expert_gradients(SmallCase& sc, int32_t expert) {
  const size_t D = 64, I = 64, L = 2;
  const ExpertGradients& g = sc.routed[size_t(expert)];
  std::vector<double> gate_up(2 * I * D);
  interleave_gate_up_weights_host(g.gate.data(), g.up.data(), gate_up.data(), 1, int64_t(I), int64_t(D));
  PathOutputs& o = sc.ranks[size_t(expert) / L].paths[0];
  o.expert_gate_up.assign(gate_up.begin(), gate_up.end());
  o.expert_down.assign(g.down.begin(), g.down.end());
}

const OutputCheck& find(const std::vector<OutputCheck>& checks, const std::string& output) {
  for (const OutputCheck& c : checks) {
    if (c.output == output) return c;
  }
  ADD_FAILURE() << "no check of " << output;
  static const OutputCheck none;
  return none;
}

TEST(SoakReference, PlanSamplesDistinctTokensAndARoutedExpert) {
  SmallCase sc = small_case();
  for (int64_t step = 0; step < 7; ++step) {
    const CheckPlan plan = plan_check(sc.c, sc.routing, step);
    ASSERT_EQ(plan.tokens.size(), 2u);
    for (const std::vector<int64_t>& tokens : plan.tokens) {
      EXPECT_EQ(std::set<int64_t>(tokens.begin(), tokens.end()).size(), 5u) << "T = 5 < 16: every token";
    }
    ASSERT_GE(plan.expert, 0);
    EXPECT_NE(std::find(sc.routing.topk_idx.begin(), sc.routing.topk_idx.end(), plan.expert), sc.routing.topk_idx.end())
        << "the checked expert has routes";
    EXPECT_EQ(plan.shared_rank, int(step % 2));
  }
}

TEST(SoakReference, FullReferenceOutputsPassAndWrongOnesFailNamingTheOutput) {
  SmallCase sc = small_case();
  const ReferenceModel model(sc.c, sc.weights);
  const std::vector<PathLayout> v1 = {{"v1", 0, false}};
  for (int64_t step = 0; step < 4; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const CheckPlan plan = plan_check(sc.c, sc.routing, step);
    SmallCase s = sc;
    set_expert_gradients(s, plan.expert);
    const std::vector<OutputCheck> checks = model.check(s.routing, plan, v1, s.ranks, false, 3);
    EXPECT_EQ(checks.size(), 7u);
    for (const OutputCheck& c : checks) {
      EXPECT_TRUE(c.passed()) << c.output << " " << c.error << " > " << c.bound << " (" << c.sample << ")";
      EXPECT_LT(c.error, 1e-6) << c.output << ": the same math, to float rounding";
    }
  }
  const CheckPlan plan = plan_check(sc.c, sc.routing, 1);
  set_expert_gradients(sc, plan.expert);
  const auto failing = [&](const char* output, const std::function<void(PathOutputs&)>& spoil) {
    SmallCase s = sc;
    for (RankStep& r : s.ranks) spoil(r.paths[0]);
    const OutputCheck& c = find(model.check(s.routing, plan, v1, s.ranks, false, 2), output);
    EXPECT_FALSE(c.passed()) << output << ": " << c.error << " <= " << c.bound;
  };
  failing("y", [](PathOutputs& o) { o.y[3] = bf16_bits(bf16_to_float(o.y[3]) * 1.5f + 0.5f); });
  failing("dx", [](PathOutputs& o) { o.dx[70] = bf16_bits(std::nanf("")); });
  failing("d_scores", [](PathOutputs& o) { o.d_topk_scores.back() *= 1.1f; });  // the tail of T·k odd
  failing("d_w_down", [](PathOutputs& o) {
    for (float& v : o.expert_down) v *= 1.01f;
  });
  failing("d_shared_w_gate_up", [](PathOutputs& o) {
    if (!o.shared_gate_up.empty()) o.shared_gate_up[5] += 1.0f;
  });
  // bf16 weight gradients get the rounding on top of the bound.
  SmallCase s = sc;
  for (RankStep& r : s.ranks) {
    for (float& v : r.paths[0].expert_down) v = bf16_to_float(bf16_bits(v));
  }
  EXPECT_TRUE(find(model.check(s.routing, plan, v1, s.ranks, true, 2), "d_w_down").passed());
}

// All of a token's slots on one expert: its d_topk_scores cancel to 0 in exact math, so the
// layer's float rounding there must pass (no relative measure would), and an error the size of
// the token's scale B_t must not.
TEST(SoakReference, ScoreGradientsThatCancelAreBoundedByTheTokensScale) {
  SmallCase sc = small_case(RoutingKind::kAllToOne);
  const ReferenceModel model(sc.c, sc.weights);
  const std::vector<PathLayout> v1 = {{"v1", 0, false}};
  const CheckPlan plan = plan_check(sc.c, sc.routing, 0);
  set_expert_gradients(sc, plan.expert);
  SmallCase noisy = sc;
  for (size_t r = 0; r < noisy.ranks.size(); ++r) {
    const int32_t* ids = noisy.routing.rank_topk(int64_t(r));
    std::vector<float>& d = noisy.ranks[r].paths[0].d_topk_scores;
    for (size_t i = 0; i < d.size(); ++i) d[i] += ids[i] < 0 ? 0.0f : 1e-6f;  // empty slots stay exact
  }
  const OutputCheck& ok = find(model.check(noisy.routing, plan, v1, noisy.ranks, false, 2), "d_scores");
  EXPECT_TRUE(ok.passed()) << ok.error << " > " << ok.bound;
  SmallCase wrong = sc;
  for (RankStep& r : wrong.ranks) {
    for (float& v : r.paths[0].d_topk_scores) v += 0.5f;
  }
  const OutputCheck& bad = find(model.check(wrong.routing, plan, v1, wrong.ranks, false, 2), "d_scores");
  EXPECT_FALSE(bad.passed()) << bad.error << " <= " << bad.bound;
}

}  // namespace
}  // namespace caracal::soak
