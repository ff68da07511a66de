#pragma once
// The layers `caracal bench` times, from its command line: the one mapping that the timing and the
// validation both use, so that the layer validated is the layer timed (but for the ring, which the
// validation may scale to its smaller step: validation_plan.hpp).
#include <nlohmann/json.hpp>

#include "bench_options.hpp"
#include "caracal/layer_config.hpp"
#include "caracal/moe_layer.hpp"
#include "layer/layer_experiments.hpp"

namespace caracal::bench_tool {

// A layer's options and the experiments of the command line (layer::ExperimentalLayer builds it).
struct LayerSetup {
  MoELayerOptions options;
  layer::LayerExperiments experiments;
};

// The fused layer's (`fused_forward`), or v1's.
LayerSetup layer_setup(const BenchOptions& a, bool fused_forward);

// `c` in bf16: the layers timed and validated beside an FP8 one (--precision fp8).
inline LayerConfig in_bf16(LayerConfig c) {
  c.precision = Precision::kBF16;
  return c;
}

// The setup as --json writes it (every option but the allocator, then the experiments).
nlohmann::json setup_json(const LayerSetup& s);

}  // namespace caracal::bench_tool
