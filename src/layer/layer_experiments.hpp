#pragma once
// Switches of the fused path for tests and benchmarks, never for users: each runs a variant whose
// bits the tests compare with the default's, or whose cost a benchmark measures. A layer built with
// them (ExperimentalLayer::make) is the same MoELayer otherwise.
#include <memory>

#include "caracal/comm/world.hpp"
#include "caracal/layer_config.hpp"
#include "caracal/moe_layer.hpp"

namespace caracal::layer {

struct LayerExperiments {
  // The fused passes pull the rows of tokens on this GPU too, as those of other GPUs (the same
  // bits), so that a loopback world runs their pull roles.
  bool pull_all_rows = false;
  // At W > 1 the fused backward sends a dx row per route (the separate launches' bits) instead of
  // one per (token, rank).
  bool dx_rows_per_route = false;
  // A row per route both ways (transfer::ExchangeOptions::rows_per_route): every pull reads a
  // token's home row once per route and combine pushes each route's row home alone. The gradient
  // bits of dx_rows_per_route; y rounds each route's row.
  bool rows_per_route = false;
  // The FP8 layer's forward in one launch (fused::fused_forward of FusedForwardFp8Args: the shared
  // and routed experts' FP8 GEMMs, x's e4m3 rows gathered where they are or pulled, one macrobatch),
  // its combine from expert_dy after it; the separate launches' bits. At W > 1 every row is pulled
  // (the backward reads x's dispatched rows).
  bool fused_fp8_forward = false;
  // The FP8 layer's backward GEMMs in one launch (fused::fused_backward of FusedBackwardFp8Args: the
  // shared and routed experts' FP8 dgrad and dx tiles from one task counter over dy pulled before
  // it, the dx rows stored into their home slots), the weight gradients after it; the separate
  // launches' bits (d_topk_scores where D < 4096 only: fused/fused_backward.hpp). Needs FP8 weight gradients (MoELayerOptions::fp8_weight_gradients); a bf16
  // layer ignores it, as it ignores fused_fp8_forward.
  bool fused_fp8_backward = false;
};

struct ExperimentalLayer {
  static std::unique_ptr<MoELayer> make(const LayerConfig& config, comm::World& world, const MoELayerOptions& options,
                                        const LayerExperiments& experiments);
  // MoELayer::memory of that layer (multiprocessors 0: the current device's).
  static MoELayerMemory memory(const LayerConfig& config, const MoELayerOptions& options,
                               const LayerExperiments& experiments, int multiprocessors = 0);
};

}  // namespace caracal::layer
