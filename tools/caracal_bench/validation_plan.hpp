#pragma once
// What `caracal bench` validates before it times (step 1), and what it says it does not: the
// layers it times (the fused one, and v1 where v1 is timed) with their timed options and
// experiments (layer_options.hpp), the timed weight-gradient precision, CUDA graphs where the timing replays
// them, on the timed backend and W, at a small size of the same shape family. Host only.
#include <string>
#include <vector>

#include "bench_options.hpp"
#include "caracal/layer_config.hpp"
#include "caracal/moe_layer.hpp"
#include "caracal/routing.hpp"
#include "layer_bounds.hpp"
#include "layer_options.hpp"
#include "validation_ring.hpp"

namespace caracal::bench_tool {

// The timed configuration scaled down: D = 256, I = 128, shared I = 192 (256 in FP8, whose
// dimensions are multiples of 128; when there is a shared expert), the same W, k (at most the
// experts), router and precision, min(L, 4) experts per rank and 37 tokens per rank.
LayerConfig small_config(const LayerConfig& config);

// The routing spec for the small configuration (an all-to-one target wrapped into its experts).
RoutingSpec small_routing(const RoutingSpec& spec, const LayerConfig& small);

// The ring of one timed step (the fused layer).
struct TimedRing {
  int64_t tokens = 0;  // per rank
  int64_t rows = 0;    // resolved_ring
  int64_t macrobatches = 0;
};

// One layer the validation runs.
struct ValidatedLayer {
  std::string name;               // "fused", "v1" or "fp8"
  Precision precision = Precision::kBF16;  // "fp8": kFP8 (the FP8 layer runs v1's launches)
  LayerSetup setup;        // timed_setup, but the fused layer's ring_rows from `ring`
  LayerSetup timed_setup;  // layer_setup(a, fused): what is timed
  RingChoice ring;                // the fused layer's
  std::vector<TimedRing> timed;   // the fused layer's: the timed steps this ring stands for
};

struct ValidationPlan {
  LayerConfig small;
  RoutingSpec spec;  // small_routing's
  Routing routing;   // the validated step's
  std::string backend;
  bool bf16_weight_grads = false;
  bool graph = false;  // through a CUDA graph's replay, as timed
  std::vector<ValidatedLayer> layers;
  // Plainly, what the validation does not cover (and, once the layers ran, what their rings do
  // not: validation_report.hpp).
  std::vector<std::string> not_validated;
};

// The validation of `timed` (each tokens-per-rank value's configuration, checked) with routing
// `spec` on devices of `sms` SMs: with --precision fp8 the FP8 layer first; a bf16 fused layer per
// distinct validation ring the timed steps ask for (choose_ring), and bf16 v1. --profile-step
// validates the one layer it profiles.
ValidationPlan plan_validation(const BenchOptions& a, const std::vector<LayerConfig>& timed, const RoutingSpec& spec,
                               int sms);

// The configuration layer `v` of `p` is validated at: the small one in the layer's precision.
LayerConfig validated_config(const ValidationPlan& p, const ValidatedLayer& v);

// The bounds layer `v`'s outputs are held to (checks::kFp8LayerBounds for the FP8 layer: against
// the unquantized reference).
const checks::LayerBounds& validated_bounds(const ValidatedLayer& v);

}  // namespace caracal::bench_tool
