#include "gemm_bench_cases.hpp"

#include <string>
#include <utility>

#include "caracal/gemm/grouped_gemm.hpp"
#include "caracal/presets.hpp"
#include "caracal/routing.hpp"
#include "caracal/schedule.hpp"

namespace caracal::bench {

namespace {

Case routed_case(const std::string& model, RoutingKind kind, uint64_t seed, int world = kWorld,
                 int tokens = kTokens) {
  const ModelPreset& preset = find_model_preset(model);
  RoutingSpec spec;
  spec.kind = kind;
  spec.seed = seed;
  const Routing routing = make_routing(spec, world, tokens, preset.shape.top_k, preset.shape.num_experts);
  // Uniform: rank 0. Skewed: the busiest rank, the one that sets the step time.
  int best_rank = 0;
  int64_t best_routes = -1;
  RankSchedule best;
  for (int r = 0; r < (kind == RoutingKind::kUniform ? 1 : world); ++r) {
    RankSchedule s = build_rank_schedule(routing, preset.shape.num_experts, gemm::kGroupedGemmTileM, r);
    if (s.routes() > best_routes) {
      best_routes = s.routes();
      best_rank = r;
      best = std::move(s);
    }
  }
  Case c;
  c.model = model;
  c.routing = to_string(spec);
  c.name = model + "/" + c.routing;
  if (world != kWorld || tokens != kTokens) c.name += "/w" + std::to_string(world) + "-t" + std::to_string(tokens);
  c.hidden = int(preset.shape.hidden);
  c.intermediate = int(preset.shape.intermediate);
  c.num_experts = int(preset.shape.num_experts / world);
  c.world = world;
  c.tokens_per_rank = tokens;
  c.top_k = int(preset.shape.top_k);
  c.rank = best_rank;
  c.counts.assign(best.expert_count.begin(), best.expert_count.end());
  return c;
}

}  // namespace

std::vector<Case> make_cases(uint64_t seed) {
  std::vector<Case> cases;
  for (const char* model : {"deepseek-v3", "kimi-k2", "qwen3.5-397b", "deepseek-v4-pro"}) {
    cases.push_back(routed_case(model, RoutingKind::kUniform, seed));
    cases.push_back(routed_case(model, RoutingKind::kZipf, seed));
  }
  // Empty and one-row experts among full ones: DeepSeek-V3 uniform with 8 experts emptied and 4
  // left with a single row.
  Case sparse = routed_case("deepseek-v3", RoutingKind::kUniform, seed);
  for (int e = 0; e < 12; ++e) sparse.counts[size_t(e)] = e < 8 ? 0 : 1;
  sparse.routing = "sparse";
  sparse.name = "deepseek-v3/empty+1-row";
  cases.push_back(sparse);
  cases.push_back(routed_case("qwen3-30b-a3b", RoutingKind::kUniform, seed));
  cases.push_back(routed_case("qwen3-30b-a3b", RoutingKind::kUniform, seed, 1, 8192));
  return cases;
}

}  // namespace caracal::bench
