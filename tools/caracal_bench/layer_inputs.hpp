#pragma once
// The weights and inputs `caracal bench` runs a layer on, timed or validated: random weights of
// every local rank (expert_weights.hpp) and random inputs written straight into the layer's own
// buffers (the zero-copy path), with the layer's argument structs over them.
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "caracal/comm/world.hpp"
#include "caracal/layer_config.hpp"
#include "caracal/moe_layer.hpp"
#include "caracal/routing.hpp"
#include "expert_weights.hpp"

namespace caracal::bench_tool {

// Every local rank's weights and the layer's argument structs over them, [local ranks].
struct LayerInputs {
  std::vector<ExpertWeights> weights;
  std::vector<MoEForwardArgs> forward;
  std::vector<MoEBackwardArgs> backward;
};

// Weights and inputs for every local rank of `world` from `seed` (x and dy uniform in [-1, 1),
// topk_scores in [0.05, 1), topk_idx from `routing`), the weight gradients in bf16 or fp32; waits
// for them.
LayerInputs make_inputs(MoELayer& layer, const comm::World& world, const LayerConfig& c, const Routing& routing,
                        uint64_t seed, bool bf16_gradients, cudaStream_t stream);

}  // namespace caracal::bench_tool
