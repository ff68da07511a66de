#pragma once
// The MoELayerOptions of the layers `caracal bench` times, from its command line: the one mapping
// that the timing and the validation both use, so that the layer validated is the layer timed
// (but for the ring, which the validation may scale to its smaller step: validation_plan.hpp).
#include <nlohmann/json.hpp>

#include "bench_options.hpp"
#include "caracal/moe_layer.hpp"

namespace caracal::bench_tool {

// The fused layer's options (`fused_forward`), or v1's.
MoELayerOptions layer_options(const BenchOptions& a, bool fused_forward);

// The options as --json writes them (every field but the allocator).
nlohmann::json options_json(const MoELayerOptions& o);

}  // namespace caracal::bench_tool
