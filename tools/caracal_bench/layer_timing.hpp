#pragma once
// caracal bench, step 2: the layer itself timed, forward, backward and forward+backward, on random
// weights and inputs (warm-up, then the median of CUDA-event-bracketed runs).
#include <string>

#include "bench_options.hpp"
#include "caracal/comm/world.hpp"
#include "caracal/layer_config.hpp"
#include "caracal/moe_layer.hpp"
#include "caracal/routing.hpp"

namespace caracal::bench_tool {

struct LayerTimes {
  double forward = 0.0, backward = 0.0, step = 0.0;  // ms
  double quantize = 0.0;  // FP8 layers: every local rank's weights quantized (MoELayer::quantize_weights)
  // FP8 layers: forward+backward on weights quantized before it, as every micro-batch of a step
  // after its first runs under gradient accumulation (`step` quantizes them first).
  double step_weights_ready = 0.0;
};

// Why a layer (fused, or v1) of `c` with every local rank's weights and fp32 gradients does not
// fit in `device`'s free memory; empty when it fits.
std::string memory_shortfall(const LayerConfig& c, const BenchOptions& a, bool fused_forward, int local_ranks,
                             int device);

// Times the layer over `world`, whose local ranks this thread drives, with the fused forward or
// v1's (MoELayerOptions::fused_forward). An FP8 layer (c.precision) gets its weights quantized by
// the caller (MoEWeights::w_fp8) as after an optimizer step: the forward and the backward read them
// as they are, forward+backward quantizes them first (once a step), and the quantization and
// forward+backward without it are timed apart. Collective for NCCL worlds.
LayerTimes time_layer(comm::World& world, const LayerConfig& c, const Routing& routing, const BenchOptions& a,
                      bool fused_forward);

// No timing: after two warm-up steps, one step of the layer between cudaProfilerStart and
// cudaProfilerStop (for `ncu --profile-from-start off`: the kernels of one step,
// scripts/kernel-times.sh): time_layer's forward+backward, for an FP8 layer its weights quantized
// once first. Collective for NCCL worlds.
void profile_layer(comm::World& world, const LayerConfig& c, const Routing& routing, const BenchOptions& a,
                   bool fused_forward);

}  // namespace caracal::bench_tool
