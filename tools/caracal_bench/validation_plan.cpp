#include "validation_plan.hpp"

#include <algorithm>
#include <cstdint>
#include <sstream>

#include "caracal/error.hpp"
#include "layer_options.hpp"

namespace caracal::bench_tool {

namespace {

constexpr int64_t kSmallHidden = 256;
constexpr int64_t kSmallIntermediate = 128;
constexpr int64_t kSmallShared = 192;
constexpr int64_t kSmallSharedFp8 = 256;
constexpr int64_t kSmallTokens = 37;

std::string shape_text(const LayerConfig& c) {
  std::ostringstream s;
  s << "D=" << c.shape.hidden << " I=" << c.shape.intermediate << " E=" << c.shape.num_experts
    << " k=" << c.shape.top_k;
  if (c.shape.num_shared_experts > 0) s << " shared I=" << c.shape.shared_intermediate;
  return s.str();
}

std::string tokens_text(const std::vector<LayerConfig>& timed) {
  std::ostringstream s;
  s << "T=";
  for (size_t i = 0; i < timed.size(); ++i) s << (i ? "," : "") << timed[i].tokens_per_rank;
  return s.str();
}

// The bf16 fused layers: one per distinct ring choice, each with the timed steps it stands for.
std::vector<ValidatedLayer> fused_layers(const BenchOptions& a, const std::vector<LayerConfig>& timed,
                                         const RoutingSpec& spec, const ValidationPlan& p, int sms) {
  const LayerSetup setup = layer_setup(a, true);
  const LayerConfig small = in_bf16(p.small);
  std::vector<ValidatedLayer> out;
  for (const LayerConfig& timed_config : timed) {
    const LayerConfig c = in_bf16(timed_config);
    const Routing routing = make_routing(spec, c.ep_size, c.tokens_per_rank, c.shape.top_k, c.shape.num_experts);
    TimedRing t;
    t.tokens = c.tokens_per_rank;
    t.rows = resolved_ring(c, setup.options.ring_rows, sms);
    t.macrobatches = macrobatches(routing, c.shape.num_experts, t.rows);
    const RingChoice ring = choose_ring(setup.options.ring_rows, t.macrobatches, small, p.routing, sms);
    const auto same = std::find_if(out.begin(), out.end(), [&](const ValidatedLayer& l) { return l.ring.option == ring.option; });
    if (same != out.end()) {
      same->timed.push_back(t);
      continue;
    }
    ValidatedLayer l;
    l.name = "fused";
    l.timed_setup = setup;
    l.setup = setup;
    l.setup.options.ring_rows = ring.option;
    l.ring = ring;
    l.timed.push_back(t);
    out.push_back(l);
  }
  return out;
}

// What the plan does not cover, in plain words.
void add_not_validated(const BenchOptions& a, const std::vector<LayerConfig>& timed, ValidationPlan& p) {
  p.not_validated.push_back("the timed size: validated at " + shape_text(p.small) +
                            " T=" + std::to_string(p.small.tokens_per_rank) + " per rank, timed at " +
                            shape_text(timed.front()) + " " + tokens_text(timed) +
                            " per rank (the same W, router, backend and routing kind)");
  if (a.graph) {
    p.not_validated.push_back(
        "the forward-only and backward-only graphs the timing replays (captured apart from the same calls): "
        "validated through the forward+backward graph's replays");
  }
}

}  // namespace

LayerConfig small_config(const LayerConfig& config) {
  LayerConfig small = config;
  const int64_t W = config.ep_size;
  const int64_t L = std::min<int64_t>(config.local_experts(), 4);
  small.shape.hidden = kSmallHidden;
  small.shape.intermediate = kSmallIntermediate;
  small.shape.num_experts = W * L;
  small.shape.top_k = std::min(config.shape.top_k, W * L);
  const int64_t shared = config.precision == Precision::kFP8 ? kSmallSharedFp8 : kSmallShared;
  small.shape.shared_intermediate = config.shape.num_shared_experts > 0 ? shared : 0;
  small.tokens_per_rank = kSmallTokens;
  return small;
}

RoutingSpec small_routing(const RoutingSpec& spec, const LayerConfig& small) {
  RoutingSpec out = spec;
  out.target_expert = static_cast<int32_t>(spec.target_expert % small.shape.num_experts);
  return out;
}

ValidationPlan plan_validation(const BenchOptions& a, const std::vector<LayerConfig>& timed, const RoutingSpec& spec,
                               int sms) {
  CARACAL_CHECK(!timed.empty(), "plan_validation: no timed configuration");
  ValidationPlan p;
  p.small = small_config(timed.front());
  p.spec = small_routing(spec, p.small);
  p.routing = make_routing(p.spec, p.small.ep_size, p.small.tokens_per_rank, p.small.shape.top_k,
                           p.small.shape.num_experts);
  p.backend = a.backend;
  p.bf16_weight_grads = a.bf16_weight_grads;
  p.graph = a.graph;
  // --profile-step runs one layer: the one it profiles (with --precision fp8, the FP8 layer).
  if (a.fp8()) {
    ValidatedLayer fp8;
    fp8.name = "fp8";
    fp8.precision = Precision::kFP8;
    fp8.setup = fp8.timed_setup = layer_setup(a, false);
    p.layers.push_back(fp8);
    if (a.profile_step) {
      add_not_validated(a, timed, p);
      return p;
    }
  }
  if (!a.profile_step || a.profile_path == "fused") {
    for (ValidatedLayer& l : fused_layers(a, timed, spec, p, sms)) p.layers.push_back(l);
  }
  if (!a.profile_step || a.profile_path == "v1") {
    ValidatedLayer v1;
    v1.name = "v1";
    v1.setup = v1.timed_setup = layer_setup(a, false);
    p.layers.push_back(v1);
  }
  add_not_validated(a, timed, p);
  return p;
}

LayerConfig validated_config(const ValidationPlan& p, const ValidatedLayer& v) {
  LayerConfig c = p.small;
  c.precision = v.precision;
  return c;
}

const checks::LayerBounds& validated_bounds(const ValidatedLayer& v) {
  return v.precision == Precision::kFP8 ? checks::kFp8LayerBounds : checks::kLayerBounds;
}

}  // namespace caracal::bench_tool
