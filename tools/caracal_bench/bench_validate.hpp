#pragma once
// caracal bench, step 1: the layer against the fp64 reference (caracal/reference.hpp, bf16-rounding
// mode) at a small size of the same shape family, before anything is timed.
#include <string>
#include <utility>
#include <vector>

#include "caracal/comm/world.hpp"
#include "caracal/layer_config.hpp"
#include "caracal/routing.hpp"

namespace caracal::bench_tool {

// The benchmarked configuration scaled down: D = 256, I = 128, shared I = 192 (when there is a
// shared expert), the same W, k (at most the experts) and router, min(L, 4) experts per rank and
// 37 tokens per rank.
LayerConfig small_config(const LayerConfig& config);

// The routing spec for the small configuration (an all-to-one target wrapped into its experts).
RoutingSpec small_routing(const RoutingSpec& spec, const LayerConfig& small);

struct ValidationResult {
  bool passed = true;
  double tolerance = 1e-2;  // relative Frobenius error, per output
  std::vector<std::pair<std::string, double>> errors;  // every compared output: (name, error)
  std::string first_failure;                           // empty when passed
};

// One forward and one backward of a fresh MoELayer over `world` (every rank of which must be local
// to this process) with random weights and inputs, compared with the reference: y, dx, the routed
// experts' weight gradients (summed over home ranks) and the shared expert's. Throws caracal::Error
// for CUDA failures or a device fault reported by MoELayer::check.
ValidationResult validate_layer(const LayerConfig& small, const RoutingSpec& spec, comm::World& world,
                                uint64_t seed);

}  // namespace caracal::bench_tool
